"""docs/fork.md, "Add a model family" as "Derive a family from an existing one" performs it, on a scratch
copy of the tree: the recipe's two files, taken from the page's code blocks (so the page cannot drift
from what is tested), written where their first lines say, and nothing else edited. Then a fresh
process on the copy checks what the checklist says picks the family up: the registry and the job's
`model` choice, the tests' family lists (`tests/family_cases.py`), `lmstack.start` (the preset implies
its family; a contradicting `model` and a capability it does not declare are refused), the gate's Lambda
code, the planner and `lmstack.plan --list`, one training step of `lm.training.train` given the preset
alone, the export, and generation with the key/value cache it declares. The same process on the
unedited copy refuses the family, so the test can fail.

The gate is checked as its Lambda code: staged from the copy (`stacks.gate_code.stage`, what `cdk synth`
does) and run alone by a `python -I -S` (tests/state_machine run the same code on moto).
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORK_PAGE = os.path.join(ROOT, "docs", "fork.md")
# What a fork's checkout holds that the checks import (no tests, no node_modules).
TREE = (os.path.join("training_image", "lm"), "controlplane", "stacks", "lmstack")
FAMILY, PRESET = "gptj", "gptj-tiny"
# A recipe block: a Python code block whose first line names the file it is.
RECIPE_BLOCK = re.compile(r"^```python\n# (training_image/lm/[\w/]+\.py)\n(.*?)^```", re.S | re.M)
MODEL_FILE_LINES = 80  # the bound on a derived block's model module

CHECKS = r"""
import contextlib, io, json, sys
data_dir, work, tests = sys.argv[1:4]
out = {}
from lm.spec import families, job
out["families"] = list(families.FAMILIES)
out["model_choices"] = list(job.HYPERPARAMETERS["model"].choices)
sys.path.insert(0, tests)
from family_cases import tiny_presets
out["tested"] = [list(case) for case in tiny_presets()]
from controlplane import presets
out["presets"] = list(presets.ALL_PRESETS)
from lmstack import start
from stacks.settings import Settings
run = {"preset": "gptj-tiny", "strategy": "single", "instance_type": "ml.g5.xlarge", "instance_count": 1}
def refusal(execution_input):
    try:
        return {"model": start.validate_input(execution_input, Settings()).config["hyperparameters"]["model"]}
    except start.StartError as error:
        return str(error)
out["start"] = refusal(run)
out["start_gpt"] = refusal(dict(run, hyperparameters={"model": "gpt"}))
out["start_smp"] = refusal(dict(run, strategy="smp", instance_type="ml.p3.16xlarge"))
out["start_recompute"] = refusal(dict(run, hyperparameters={"recompute": True}))
import subprocess
from controlplane.gate import Deployment
from stacks import gate_code
code = gate_code.stage(work + "/gate")
def gate_answer(execution_input):
    handler = ("import json, sys; sys.path.insert(0, sys.argv[1]); from controlplane.gate import handler; "
               "print(json.dumps(handler(json.loads(sys.argv[2]))))")
    answered = subprocess.run([sys.executable, "-I", "-S", "-c", handler, str(code), json.dumps({"input": execution_input})],
                              env=Deployment.of(Settings()).environment(), capture_output=True, text=True)
    return json.loads(answered.stdout) if answered.returncode == 0 else answered.stderr
out["gate"] = gate_answer(run)
out["gate_smp"] = gate_answer(dict(run, strategy="smp", instance_type="ml.p3.16xlarge"))
from controlplane import planner
try:
    out["plan_params"] = planner.plan("gptj-tiny", "ml.g5.xlarge")["model"]["params"]
    out["counted_params"] = families.parameter_count(families.PRESETS["gptj-tiny"])
except ValueError as error:
    out["plan_params"] = str(error)
from lmstack import plan as plan_cli
listing = io.StringIO()
with contextlib.redirect_stdout(listing), contextlib.suppress(SystemExit):
    plan_cli.main(["--list"])
out["listed"] = [line.split()[0] for line in listing.getvalue().splitlines() if line.strip()]
from lm.training import train
# The preset alone: the runtime resolves its family and configuration (no --model, no --model_config).
out["train"] = train.main(["--data-dir", data_dir, "--checkpoint-dir", work + "/ckpt", "--export-dir", work + "/model",
                           "--preset", "gptj-tiny", "--max_steps", "1", "--warmup_steps", "1", "--global_batch_size", "4",
                           "--eval_every", "0", "--eval_batches", "1", "--checkpoint_every", "0", "--xla", "false"])
if out["train"] == 0:
    from lm.serving.export import load_exported
    from lm.serving.generate import generate_tokens
    model, config, _ = load_exported(work + "/model")
    out["exported"] = [config.family, model.name, type(model.blocks[0]).__name__]
    prompts = [[1, 2, 3], [7]]
    out["generated"] = generate_tokens(model, config, prompts, 4, temperature=0.0)
    out["recomputed"] = generate_tokens(model, config, prompts, 4, temperature=0.0, use_cache=False)
print("RESULT " + json.dumps(out))
"""


def recipe_files():
    """{path in the tree: source} of the recipe's code blocks in docs/fork.md."""
    with open(FORK_PAGE) as handle:
        found = dict(RECIPE_BLOCK.findall(handle.read()))
    assert sorted(found) == ["training_image/lm/models/gptj.py", "training_image/lm/spec/families/gptj.py"], sorted(found)
    return found


def _copy_tree(destination):
    for part in TREE:
        shutil.copytree(os.path.join(ROOT, part), os.path.join(destination, part),
                        ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def _checks(tree, data_dir, work):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.path.join(tree, "training_image")]),
               TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", CHECKS, data_dir, str(work), os.path.join(ROOT, "tests")], cwd=tree,
                            env=env, capture_output=True, text=True, timeout=600)
    line = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert line, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(line[-1][len("RESULT "):])


def test_the_recipe_is_a_spec_file_and_a_model_file_of_under_80_lines_subclassing_the_gpt_block():
    files = recipe_files()
    model = files["training_image/lm/models/gptj.py"]
    assert len(model.splitlines()) < MODEL_FILE_LINES
    assert "(gpt.BlockCode)" in model and "def residual(" in model
    assert "FAMILY = ModelFamily(" in files["training_image/lm/spec/families/gptj.py"]


@pytest.mark.slow
def test_without_the_recipe_the_family_is_refused(tmp_path, data_dir):
    found = _checks(_copy_tree(str(tmp_path / "tree")), data_dir, tmp_path / "run")
    assert FAMILY not in found["families"] and PRESET not in found["presets"]
    assert FAMILY not in [family for _, family in found["tested"]]
    assert "preset must be one of" in found["start"]
    assert not found["gate"]["ok"] and found["gate"]["cause"] == found["start"]
    assert PRESET not in found["listed"]
    assert found["train"] == 2


@pytest.mark.slow
def test_a_family_derived_by_the_recipe_is_picked_up_everywhere(tmp_path, data_dir):
    tree = _copy_tree(str(tmp_path / "tree"))
    for path, source in recipe_files().items():  # the two files, and nothing else edited
        with open(os.path.join(tree, path), "w") as handle:
            handle.write(source)
    found = _checks(tree, data_dir, tmp_path / "run")
    assert FAMILY in found["families"] and found["model_choices"] == found["families"]
    assert [PRESET, FAMILY] in found["tested"] and PRESET in found["presets"]
    # the preset implies its family; a model the preset is not of is refused naming both
    assert found["start"] == {"model": FAMILY}
    assert found["start_gpt"].startswith("preset 'gptj-tiny' is not a preset of model gpt")
    # what it does not declare is refused before any job starts; what it declares is not
    assert found["start_smp"].startswith("model gptj cannot use strategy smp (capability smp:")
    assert found["start_recompute"] == {"model": FAMILY}
    # the gate's Lambda code as `cdk synth` stages it from the fork's tree, run alone (the standard library)
    assert found["gate"]["ok"] and found["gate"]["config"]["hyperparameters"]["model"] == FAMILY, found["gate"]
    assert json.loads(found["gate"]["plan"]["model_config"])["family"] == FAMILY  # what the job is sent
    assert found["gate_smp"] == {"ok": False, "error": "InvalidInput", "cause": found["start_smp"]}
    assert found["plan_params"] == found["counted_params"] > 0
    assert PRESET in found["listed"]
    # trained from the preset alone, exported as the family's model with the parallel block
    assert found["train"] == 0 and found["exported"] == [FAMILY, FAMILY, "ParallelBlock"]
    # generation through the cache (the block's decode goes through its residual) equals recomputation
    assert found["generated"] == found["recomputed"] and [len(tokens) for tokens in found["generated"]] == [4, 4]
