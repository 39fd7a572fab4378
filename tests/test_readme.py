"""The README's generated parts stay equal to what the code generates, and its execution inputs run."""
import json
import pathlib
import re

import pytest

from controlplane import planner
from lm.training import train
from controlplane.presets import GPT_PRESETS
from lmstack import diagram, start
from stacks.settings import Settings
from stacks.state_machine import build_training_definition

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_diagram_is_the_generated_one():
    text = README.read_text()
    generated = diagram.mermaid(build_training_definition(Settings()))
    assert generated in text, "README's state machine diagram is stale: paste `python -m lmstack.diagram`"


def test_diagram_has_every_stage_of_the_definition():
    definition = build_training_definition(Settings())
    start, edges = diagram.stage_edges(definition)
    drawn = {start} | {stage for edge in edges for stage in edge}
    assert {diagram.stage(name) for name in definition["States"]} <= drawn


# ---- every execution input the README shows (issue 16 item 8) ----

def readme_examples():
    """The execution inputs of the README: its ```json blocks."""
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", README.read_text(), re.S)]


def toolkit_arguments(hyperparameters):
    """The command line and environment the SageMaker training toolkit gives the entry point for a
    CreateTrainingJob request's HyperParameters: each value JSON-decoded and passed as `--name str(value)`,
    the `sagemaker_` keys kept for the toolkit itself, mp_parameters also as SM_HP_MP_PARAMETERS
    (sagemaker-training's mapping.to_cmd_args and its SM_HP_<NAME> variables)."""
    argv, environ = [], {}
    for name, text in hyperparameters.items():
        value = json.loads(text)
        if name.startswith("sagemaker_"):
            continue
        if isinstance(value, dict):
            environ["SM_HP_%s" % name.upper()] = json.dumps(value)
            value = json.dumps(value)
        argv += ["--" + name, str(value)]
    return argv, environ


def test_the_readme_shows_execution_inputs():
    assert len(readme_examples()) >= 2


@pytest.mark.parametrize("index", range(len(readme_examples())))
def test_each_readme_example_passes_every_check_and_reaches_the_training_job(index, deployment, monkeypatch):
    example = readme_examples()[index]
    start.validate_input(example, Settings())  # schema, plan gate, rules, names: as lmstack.start does

    run = deployment.run(example, name="readme-%d" % index)
    assert run.status == "SUCCEEDED", (run.description.get("error"), run.description.get("cause"))
    request = [call for _, _, call in run.calls("createTrainingJob") if "-train-" in call["TrainingJobName"]][-1]

    resources = request["ResourceConfig"]
    argv, environ = toolkit_arguments(request["HyperParameters"])
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    hyperparameters, _ = train.parse_args(argv + ["--dry-run"])
    if hyperparameters.preset in GPT_PRESETS:
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
