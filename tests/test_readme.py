"""The documentation stays true: README.md is short and leads to every page of docs/; every execution
input, command, module, file and link that README.md and docs/*.md show exists and runs; the state
machine picture is the generated one.

The examples live wherever the documentation puts them: every test here reads README.md and every
docs/*.md. An execution input is a ```json block (and every ```json block is one).
"""
import importlib
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 250  # issue 26 item 7

# The packages of this repository whose names the documentation spells out (`lm.spec.job`, ...).
PACKAGES = ("lm", "controlplane", "lmstack", "stacks")
# Top-level folders a path in the documentation may start with (docs/ is checked by the link test).
FOLDERS = ("training_image", "controlplane", "lmstack", "stacks", "tests", "bench")

FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOTTED_NAME = re.compile(r"(?<![\w./:-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(PACKAGES))
REPO_PATH = re.compile(r"^(?:%s)/[\w./-]*$" % "|".join(FOLDERS))
COMMAND = re.compile(r"python -m ([\w.]+)([^`\n#]*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")


def pages():
    return [README] + sorted(DOCS.glob("*.md"))


def name(page):
    return page.relative_to(ROOT).as_posix()


def fenced_blocks(page):
    """(language, text) of each fenced block of `page`."""
    return FENCED.findall(page.read_text())


def prose(page):
    """`page` without its fenced blocks."""
    return FENCED.sub("", page.read_text())


def code_spans(page):
    """The inline code of `page`, outside fenced blocks."""
    return [span for _, span in CODE_SPAN.findall(prose(page))]


def examples():
    """Every execution input of the documentation, as pytest params named page:n."""
    found = []
    for page in pages():
        inputs = [text for language, text in fenced_blocks(page) if language == "json"]
        found += [pytest.param(page, index, json.loads(text), id="%s:%d" % (name(page), index))
                  for index, text in enumerate(inputs)]
    return found


# ---- README.md leads; docs/ holds the rest ----

def test_the_readme_is_at_most_250_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, "README.md has %d lines; move detail to docs/" % len(lines)


def test_the_readme_links_every_docs_page_and_only_pages_that_exist():
    linked = {target.split("#")[0] for target in LINK.findall(README.read_text()) if target.startswith("docs/")}
    pages_in_docs = {name(page) for page in DOCS.glob("*.md")}
    assert pages_in_docs, "docs/ holds no page"
    assert not linked - pages_in_docs, "README.md links pages that do not exist: %s" % sorted(linked - pages_in_docs)
    assert not pages_in_docs - linked, "docs pages the README does not link: %s" % sorted(pages_in_docs - linked)


def heading_anchors(page):
    """GitHub's anchors of the headings of `page`: lower case, punctuation dropped, spaces as '-'."""
    headings = re.findall(r"^#+ (.+)$", prose(page), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", pages(), ids=name)
def test_every_relative_link_reaches_a_file_and_heading(page):
    for target in LINK.findall(prose(page)):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s):, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.is_file(), "%s links %s, which does not exist" % (name(page), target)
        if anchor:
            assert anchor in heading_anchors(linked), "%s links %s: no such heading" % (name(page), target)


# ---- every module, file and command the documentation names exists ----

def documented_settings():
    """The settings of docs/settings.md's table: messages name them `lmstack.<setting>`, not modules."""
    return set(re.findall(r"^\| `(\w+)` \|", (DOCS / "settings.md").read_text(), re.M))


def resolves(dotted):
    """Whether `dotted` names a module of this repository, or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            spec = importlib.util.find_spec(module_name)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            continue
        if cut == len(parts):
            return True
        value = importlib.import_module(module_name)
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


@pytest.mark.parametrize("page", pages(), ids=name)
def test_every_module_and_name_the_page_spells_out_exists(page):
    settings = documented_settings()
    named = {dotted for span in code_spans(page) for dotted in DOTTED_NAME.findall(span)}
    named |= {module for _, text in fenced_blocks(page) for module, _ in COMMAND.findall(text)}
    named = {dotted for dotted in named
             if not (dotted.startswith("lmstack.") and dotted.split(".")[1] in settings)}
    missing = sorted(dotted for dotted in named if not resolves(dotted))
    assert not missing, "%s names modules or attributes that do not exist: %s" % (name(page), missing)


def ignored_outputs():
    """Folders the repository ignores because commands write them (bench/results/, demo-output/)."""
    return {line.strip() for line in (ROOT / ".gitignore").read_text().splitlines() if line.strip()}


@pytest.mark.parametrize("page", pages(), ids=name)
def test_every_repository_path_the_page_names_exists(page):
    paths = {span for span in code_spans(page) if REPO_PATH.match(span)}
    missing = sorted(path for path in paths if not (ROOT / path).exists() and path not in ignored_outputs())
    assert not missing, "%s names paths that do not exist: %s" % (name(page), missing)


def commands():
    """module -> the flags the documentation gives `python -m module`, in its code blocks and spans."""
    found = {}
    for page in pages():
        texts = [text.replace("\\\n", " ") for language, text in fenced_blocks(page) if language == ""]
        texts += code_spans(page)
        for text in texts:
            for module, arguments in COMMAND.findall(text):
                found.setdefault(module, set()).update(FLAG.findall(arguments))
    return found


# `python -m MODULE --help` for each module in turn, in one process (one Python and TensorFlow start-up for all):
# writes {module: [exit status, stdout and stderr]} to the file named first.
HELP_OF_EACH_MODULE = """
import contextlib, io, json, runpy, sys
written, outputs = sys.argv[1], {}
for module in sys.argv[2:]:
    sys.argv, text, status = [module, "--help"], io.StringIO(), 0
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exited:
            status = exited.code or 0
    outputs[module] = [status, text.getvalue()]
with open(written, "w") as handle:
    json.dump(outputs, handle)
"""


@pytest.fixture(scope="module")
def help_outputs(tmp_path_factory):
    written = str(tmp_path_factory.mktemp("help") / "help.json")
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "training_image")]))
    result = subprocess.run([sys.executable, "-c", HELP_OF_EACH_MODULE, written] + sorted(commands()), cwd=str(ROOT),
                            env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:]
    with open(written) as handle:
        return json.load(handle)


@pytest.mark.parametrize("module", sorted(commands()))
def test_every_command_runs_and_takes_the_flags_the_docs_give_it(module, help_outputs):
    status, output = help_outputs[module]
    assert status == 0, output[-2000:]
    unknown = sorted(flag for flag in commands()[module] if flag not in FLAG.findall(output))
    assert not unknown, "python -m %s --help lists no %s" % (module, ", ".join(unknown))


# ---- the generated picture ----

def test_readme_diagram_is_the_generated_one():
    from lmstack import diagram
    from stacks.settings import Settings
    from stacks.state_machine import build_training_definition

    generated = diagram.mermaid(build_training_definition(Settings()))
    assert generated in README.read_text(), "README's state machine diagram is stale: paste `python -m lmstack.diagram`"


def test_diagram_has_every_stage_of_the_definition():
    from lmstack import diagram
    from stacks.settings import Settings
    from stacks.state_machine import build_training_definition

    definition = build_training_definition(Settings())
    start, edges = diagram.stage_edges(definition)
    drawn = {start} | {stage for edge in edges for stage in edge}
    assert {diagram.stage(name) for name in definition["States"]} <= drawn


# ---- every execution input the documentation shows (issue 16 item 8) ----

def toolkit_arguments(hyperparameters):
    """The command line and environment the SageMaker training toolkit gives the entry point for a
    CreateTrainingJob request's HyperParameters: each value JSON-decoded and passed as `--name str(value)`,
    the `sagemaker_` keys kept for the toolkit itself, mp_parameters also as SM_HP_MP_PARAMETERS
    (sagemaker-training's mapping.to_cmd_args and its SM_HP_<NAME> variables)."""
    argv, environ = [], {}
    for key, text in hyperparameters.items():
        value = json.loads(text)
        if key.startswith("sagemaker_"):
            continue
        if isinstance(value, dict):
            environ["SM_HP_%s" % key.upper()] = json.dumps(value)
            value = json.dumps(value)
        argv += ["--" + key, str(value)]
    return argv, environ


def test_the_docs_show_execution_inputs():
    shown_on = [example.values[0] for example in examples()]
    assert len(shown_on) >= 2
    assert README in shown_on, "README.md shows no execution input"


@pytest.mark.parametrize("page,index,example", examples())
def test_each_example_passes_every_check_and_reaches_the_training_job(page, index, example, deployment, monkeypatch):
    from controlplane import planner
    from lm.training import train
    from lmstack import start
    from stacks.settings import Settings

    start.validate_input(example, Settings())  # the gate (schema, rules, names, the plan), as lmstack.start asks

    run = deployment.run(example, name="%s-%d" % (page.stem.lower(), index))
    assert run.status == "SUCCEEDED", (run.description.get("error"), run.description.get("cause"))
    served = example.get("deploy", {}).get("model_artifact")
    if served:  # a deploy-only run: the model it names, no job
        (_, _, model), = run.calls("createModel")
        assert model["PrimaryContainer"]["ModelDataUrl"] == served and run.calls("createTrainingJob") == []
        return
    request = [call for _, _, call in run.calls("createTrainingJob") if "-train-" in call["TrainingJobName"]][-1]

    resources = request["ResourceConfig"]
    argv, environ = toolkit_arguments(request["HyperParameters"])
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    hyperparameters, _ = train.parse_args(argv + ["--dry-run"])
    mp = json.loads(environ.get("SM_HP_MP_PARAMETERS", "{}"))
    verdict = planner.check(hyperparameters.preset, resources["InstanceType"], resources["InstanceCount"],
                            hyperparameters.strategy, global_batch=hyperparameters.global_batch_size,
                            seq_len=hyperparameters.seq_len or None, recompute=hyperparameters.recompute,
                            xla=hyperparameters.xla, partitions=mp.get("partitions"),
                            microbatches=mp.get("microbatches"))
    assert verdict.ok, verdict.reason
    assert verdict.plan["chosen"]["global_batch"] == hyperparameters.global_batch_size, \
        verdict.plan["chosen"]["warnings"]
    assert train.main(argv + ["--dry-run", "--instance-type", resources["InstanceType"],
                              "--instance-count", str(resources["InstanceCount"])]) == 0
