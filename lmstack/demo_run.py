"""What every demo step shares: its error, the subprocess environment, and running a command
with its output in a log file and a progress bar on the terminal."""
import os
import re
import subprocess
import sys
import time

from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINING_IMAGE = os.path.join(ROOT, "training_image")
POLL_SECONDS = 0.2
# Environment variables of a SageMaker container or of a TF cluster: the demo's processes
# get only the ones it sets itself.
_FOREIGN_PREFIXES = ("SM_", "SAGEMAKER_", "LM_")
_FOREIGN_NAMES = ("TF_CONFIG",)


class StepError(Exception):
    """A demo step cannot go on; the message says why (the demo adds the step's name)."""


def environment(**extra):
    """The environment of the demo's subprocesses: this one without SageMaker/TF cluster
    variables, `lm` importable, TensorFlow quiet, one thread per op (2 cores, 2 workers)."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(_FOREIGN_PREFIXES) and name not in _FOREIGN_NAMES}
    env.update(PYTHONPATH=os.pathsep.join([TRAINING_IMAGE, ROOT]), PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2",
               OMP_NUM_THREADS="1", TF_NUM_INTEROP_THREADS="1", TF_NUM_INTRAOP_THREADS="1")
    env.update(extra)
    return env


def cdk_environment():
    """The literal `export NAME := value` lines of the Makefile, the one place that keeps the
    CDK CLI and jsii offline and quiet: `make synth`, the demo's synth and the CDK tests use them."""
    exports = {}
    with open(os.path.join(ROOT, "Makefile")) as handle:
        for line in handle:
            match = re.match(r"^export (\w+) := (.*)$", line.rstrip("\n"))
            if match and "$(" not in match.group(2):
                exports[match.group(1)] = match.group(2).strip()
    return exports


def tail(path, lines=15):
    """The last lines of a log file, to quote in an error."""
    try:
        with open(path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:]).rstrip()
    except OSError:
        return ""


def shown(command):
    """A command as the user would type it: the interpreter without its path."""
    return " ".join([os.path.basename(command[0])] + list(command[1:]))


def bar(description, total=None, unit="s"):
    return tqdm(total=total, desc="  " + description, unit=unit, leave=True, mininterval=0.5, dynamic_ncols=True,
                file=sys.stdout, bar_format=None if total else "{desc}: {elapsed}{postfix}")


def run_logged(command, log_path, description, env=None, cwd=ROOT, timeout=600):
    """Run `command` with stdout+stderr to `log_path`, showing elapsed time; StepError
    quoting the log's last lines when it exits non-zero or runs past `timeout` seconds."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "w") as log, bar(description) as progress:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env or environment(), cwd=cwd)
        started = time.monotonic()
        while process.poll() is None:
            if time.monotonic() - started > timeout:
                process.kill()
                process.wait()
                raise StepError("`%s` ran past %d s; last lines of %s:\n%s" % (
                    shown(command), timeout, log_path, tail(log_path)))
            time.sleep(POLL_SECONDS)
            progress.refresh()
    if process.returncode != 0:
        raise StepError("`%s` exited with status %d; last lines of %s:\n%s" % (
            shown(command), process.returncode, log_path, tail(log_path)))
    return log_path
