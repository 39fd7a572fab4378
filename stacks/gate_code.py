"""The code of the gate's Lambda function (`controlplane.gate.handler`), without the CDK: the stack's
construct (`stacks.gate`), the moto harness and the demo stage it alike.

`stage(directory)` writes the function's code: the `controlplane` package and the TF-free `lm.spec`
(with `lm/__init__.py`, which imports nothing): their Python files and the data files they read
(`SUFFIXES`: `controlplane/measured_mfu.json`). The app stages it into the cloud
assembly at synth (`Code.from_asset` of that directory: a zip of plain files, no Docker); the moto
harness and the demo stage the same directory and run the handler from it
(`lmstack.local_lambda`). Nothing of TensorFlow or the rest of the runtime is in it:
tests/cdk/test_gate_function.py runs the staged code alone, with the standard library only.

The state machine invokes a published version (`current_version`: a new version whenever the code or
the configuration changes, so a running execution keeps the code it started with), and its role may
invoke only that version (`stacks.state_machine.REQUIRED_ACTIONS`, resource kind "gate").
"""
import pathlib
import shutil

ROOT = pathlib.Path(__file__).resolve().parents[1]
HANDLER = "controlplane.gate.handler"
# (source directory, its path in the function's code); every file below each with one of SUFFIXES, recursively.
PACKAGES = ((ROOT / "controlplane", "controlplane"), (ROOT / "training_image" / "lm" / "spec", "lm/spec"))
# `lm/__init__.py` only: the package's docstring (the runtime's modules stay out).
PACKAGE_FILES = ((ROOT / "training_image" / "lm" / "__init__.py", "lm/__init__.py"),)
# The Lambda runtime: the newest Python the tests can run the code on (pyenv on these machines and CI's has
# up to 3.13; `lmstack.local_lambda.runtime_interpreter` runs the worker and tests/cdk/test_gate_function.py on
# it). The CDK knows python3.14, so cdk-nag's AwsSolutions-L1 is acknowledged with this reason (stacks.gate).
RUNTIME = "python3.13"
RUNTIME_REASON = ("python3.13, not the newest runtime the CDK knows: the gate's code is tested on the Python it runs "
                  "on, and the test machines have Python up to 3.13 (lmstack.local_lambda.runtime_interpreter)")
TIMEOUT_SECONDS = 60  # a decision plans every instance type of the input: milliseconds each
MEMORY_MB = 512
# Python modules and the JSON data they load at import (the planner reads measured_mfu.json).
SUFFIXES = (".py", ".json")


def staged_files():
    """{path in the function's code: source file}, sorted: what `stage` copies."""
    files = {target: source for source, target in PACKAGE_FILES}
    for source_root, target_root in PACKAGES:
        for source in sorted(source_root.rglob("*")):
            if source.suffix in SUFFIXES and source.is_file() and "__pycache__" not in source.parts:
                files["%s/%s" % (target_root, source.relative_to(source_root).as_posix())] = source
    return dict(sorted(files.items()))


def code_path(source):
    """The path of the source file `source` in the function's code, None for a file not in it (a new file
    below one of PACKAGES counts: the next `stage` copies it)."""
    source = pathlib.Path(source).resolve()
    for file, target in PACKAGE_FILES:
        if source == file:
            return target
    for root, target_root in PACKAGES:
        if source.suffix in SUFFIXES and root in source.parents:
            return "%s/%s" % (target_root, source.relative_to(root).as_posix())
    return None


def stage(directory):
    """Write the function's code into `directory` (emptied first); returns it as a pathlib.Path."""
    directory = pathlib.Path(directory)
    if directory.exists():
        shutil.rmtree(directory)
    for target, source in staged_files().items():
        path = directory / target
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, path)
    return directory
