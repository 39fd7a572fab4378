"""docs/fork.md, "Add a model family", on a scratch copy of the tree: a family `toy` (a copy of the rnn
family under a new name: its config module, its model module, one FAMILIES entry declaring no
capability, and one preset in the control plane's table), then a fresh process on the copy checks
what the checklist says picks it up with no other edit: the job's `model` choice, the presets, the
gate (its `model` choice and the refusal of each capability the family lacks: the state machine's
Validate state runs it as a Lambda function), `lmstack.start`, the planner and `lmstack.plan --list`,
and training, export and generation of the new family's preset. The same process on the unedited
copy refuses the family, so the test can fail.

The gate is checked as its Lambda code: staged from the copy (`stacks.gate_code.stage`, what `cdk synth`
does) and run alone by a `python -I -S` (tests/state_machine run the same code on moto).
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What a fork's checkout holds that the checks import (no tests, no node_modules).
TREE = (os.path.join("training_image", "lm"), "controlplane", "stacks", "lmstack")
FAMILY, PRESET = "toy", "toy-tiny"

# Step 1: the family's config, a copy of the rnn family's under the new name.
CONFIG_EDITS = (("class RNNConfig(ModelConfig):", "class ToyConfig(ModelConfig):"),
                ('    family: str = "rnn"', '    family: str = "toy"'),
                ('self._check_common("rnn")', 'self._check_common("toy")'))
# Step 2: one FAMILIES entry (no capability declared) ...
FAMILY_EDITS = (("from lm.spec.families.rnn import RNNConfig\n",
                 "from lm.spec.families.rnn import RNNConfig\nfrom lm.spec.families.toy import ToyConfig\n"),
                ('    ("rnn", ModelFamily(RNNConfig, "lm.models.rnn:build_model", (), None)),\n',
                 '    ("rnn", ModelFamily(RNNConfig, "lm.models.rnn:build_model", (), None)),\n'
                 '    ("toy", ModelFamily(ToyConfig, "lm.models.toy:build_model", (), None)),\n'))
# ... and its preset, data of the control plane.
PRESET_EDITS = (("\nALL_PRESETS = collections.OrderedDict(",
                 "\nfrom lm.spec.families.toy import ToyConfig  # noqa: E402\n"
                 "FAMILY_PRESETS[\"toy\"] = collections.OrderedDict([(\"toy-tiny\", ToyConfig(\n"
                 "    n_layer=1, d_model=32, block_size=64, vocab_size=256, pad_vocab_to=64))])\n"
                 "ALL_PRESETS = collections.OrderedDict("),)
# Step 3: its Keras model, a copy of lm.models.rnn built from the new config.
MODEL_EDITS = (("from lm.spec.families import RNNConfig\n", "from lm.spec.families.toy import ToyConfig as RNNConfig\n"),)

CHECKS = r"""
import contextlib, io, json, sys
out = {}
from lm.spec import job
out["model_choices"] = list(job.HYPERPARAMETERS["model"].choices)
from controlplane import presets
out["presets"] = list(presets.ALL_PRESETS)
from lmstack import start
from stacks.settings import Settings
run = {"preset": "toy-tiny", "strategy": "single", "instance_type": "ml.g5.xlarge", "instance_count": 1,
       "hyperparameters": {"model": "toy"}}
def refusal(execution_input):
    try:
        start.validate_input(execution_input, Settings())
    except start.StartError as error:
        return str(error)
out["start"] = refusal(run)
out["start_smp"] = refusal(dict(run, strategy="smp", instance_type="ml.p3.16xlarge"))
out["start_recompute"] = refusal(dict(run, hyperparameters={"model": "toy", "recompute": True}))
import subprocess
from controlplane.gate import Deployment
from stacks import gate_code
code = gate_code.stage(sys.argv[2] + "/gate")
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
    out["plan_params"] = planner.plan("toy-tiny", "ml.g5.xlarge")["model"]["params"]
except ValueError as error:
    out["plan_params"] = str(error)
from lmstack import plan as plan_cli
listing = io.StringIO()
with contextlib.redirect_stdout(listing), contextlib.suppress(SystemExit):
    plan_cli.main(["--list"])
out["listed"] = [line.split()[0] for line in listing.getvalue().splitlines() if line.strip()]
data_dir, work = sys.argv[1], sys.argv[2]
from lm.training import train
arguments = ["--data-dir", data_dir, "--checkpoint-dir", work + "/ckpt", "--export-dir", work + "/model",
             "--model", "toy", "--max_steps", "2", "--warmup_steps", "1", "--global_batch_size", "4",
             "--eval_every", "0", "--eval_batches", "1", "--checkpoint_every", "0", "--xla", "false"]
try:
    arguments += ["--preset", "toy-tiny", "--model_config", json.dumps(presets.model_config("toy-tiny"))]
except ValueError:
    arguments += ["--model_config", json.dumps({"family": "toy", "n_layer": 1, "d_model": 32})]
out["train"] = train.main(arguments)
if out["train"] == 0:
    from lm.serving.export import load_exported
    from lm.serving.generate import generate_tokens
    model, config, _ = load_exported(work + "/model")
    out["exported_family"] = config.family
    out["generated"] = len(generate_tokens(model, config, [[1, 2, 3]], 4, temperature=0.0)[0])
print("RESULT " + json.dumps(out))
"""


def _edit(path, edits):
    with open(path) as handle:
        source = handle.read()
    for old, new in edits:
        assert source.count(old) == 1, "%r occurs %d times in %s" % (old, source.count(old), path)
        source = source.replace(old, new)
    with open(path, "w") as handle:
        handle.write(source)


def _copy_tree(destination):
    for part in TREE:
        shutil.copytree(os.path.join(ROOT, part), os.path.join(destination, part),
                        ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def _add_family(tree):
    """The checklist's steps, as a fork makes them: two new files and two edited ones."""
    families = os.path.join(tree, "training_image", "lm", "spec", "families")
    shutil.copy(os.path.join(families, "rnn.py"), os.path.join(families, "toy.py"))
    _edit(os.path.join(families, "toy.py"), CONFIG_EDITS)
    _edit(os.path.join(families, "__init__.py"), FAMILY_EDITS)
    _edit(os.path.join(tree, "controlplane", "presets.py"), PRESET_EDITS)
    models = os.path.join(tree, "training_image", "lm", "models")
    shutil.copy(os.path.join(models, "rnn.py"), os.path.join(models, "toy.py"))
    _edit(os.path.join(models, "toy.py"), MODEL_EDITS)


def _checks(tree, data_dir, work):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.path.join(tree, "training_image")]),
               TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", CHECKS, data_dir, str(work)], cwd=tree, env=env,
                            capture_output=True, text=True, timeout=600)
    line = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert line, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(line[-1][len("RESULT "):])


@pytest.mark.slow
def test_without_the_checklist_the_family_is_refused(tmp_path, data_dir):
    found = _checks(_copy_tree(str(tmp_path / "tree")), data_dir, tmp_path / "run")
    assert FAMILY not in found["model_choices"] and PRESET not in found["presets"]
    assert "must be one of" in found["start"]
    assert not found["gate"]["ok"] and found["gate"]["cause"] == found["start"]
    assert PRESET not in found["listed"]
    assert found["train"] == 2


@pytest.mark.slow
def test_a_family_added_by_the_checklist_is_picked_up_everywhere(tmp_path, data_dir):
    tree = _copy_tree(str(tmp_path / "tree"))
    _add_family(tree)
    found = _checks(tree, data_dir, tmp_path / "run")
    assert FAMILY in found["model_choices"] and PRESET in found["presets"]
    assert found["start"] is None
    # every capability it does not declare is refused before any job starts, naming the family
    assert found["start_smp"].startswith("model toy cannot use strategy smp (capability smp:")
    assert found["start_recompute"].startswith("model toy cannot use hyperparameters.recompute")
    # the gate's Lambda code as `cdk synth` stages it from the fork's tree, run alone (the standard library)
    assert found["gate"]["ok"] and found["gate"]["config"]["hyperparameters"]["model"] == FAMILY, found["gate"]
    assert found["gate_smp"] == {"ok": False, "error": "InvalidInput", "cause": found["start_smp"]}
    assert isinstance(found["plan_params"], int) and found["plan_params"] > 0
    assert PRESET in found["listed"]
    assert found["train"] == 0 and found["exported_family"] == FAMILY
    assert found["generated"] == 4
