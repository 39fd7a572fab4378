"""Run `lm.training.train` as a subprocess and read back its metric lines."""
import json
import os
import re
import signal
import subprocess
import sys

from controlplane import request
from controlplane import metrics as log_metrics
from controlplane import presets
from lm.spec import job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINING_IMAGE = os.path.join(ROOT, "training_image")

# learning_rate: the peak these runs have always had, 0.02 scaled by 8 / 256 sequences as the learning-rate
# default did before it kept the rate at any batch (lm.spec.families.peak_learning_rate).
TINY = {"preset": "tiny", "global_batch_size": 8, "max_steps": 12, "learning_rate": 0.02 / 32, "warmup_steps": 3,
        "log_every": 1, "eval_every": 0, "eval_batches": 2, "checkpoint_every": 0, "seed": 7}


def environment(**extra):
    env = dict(os.environ)
    for name in list(env):
        if name.startswith("SM_") or name in ("TF_CONFIG", "SAGEMAKER_BASE_DIR", "LM_CHECKPOINT_DIR"):
            del env[name]
    env.update(PYTHONPATH=TRAINING_IMAGE, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", TF_NUM_INTEROP_THREADS="1", TF_NUM_INTRAOP_THREADS="1")
    env.update(extra)
    return env


def cli_args(data_dir, tmp, **hyperparameters):
    """`lm.training.train`'s arguments, values JSON-encoded as SageMaker's toolkit passes them."""
    values = presets.resolve(dict(TINY, **hyperparameters))
    args = ["--data-dir", data_dir, "--checkpoint-dir", os.path.join(tmp, "ckpt"),
            "--export-dir", os.path.join(tmp, "model")]
    for name, value in values.items():
        args += ["--" + name, request.encode_hyperparameters({name: value})[name]]
    return args


def train_args(data_dir, tmp, **hyperparameters):
    return [sys.executable, "-m", "lm.training.train"] + cli_args(data_dir, tmp, **hyperparameters)


def run_in_process(capsys, data_dir, tmp, **hyperparameters):
    """(exit status, stdout + stderr) of `lm.training.train.main` in this process (no TF start-up per run)."""
    from lm.training import train

    capsys.readouterr()
    status = train.main(cli_args(data_dir, tmp, **hyperparameters))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def run_training(data_dir, tmp, env=None, timeout=300, **hyperparameters):
    result = subprocess.run(train_args(data_dir, tmp, **hyperparameters), env=env or environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=timeout)
    return result


# Runs `lm.training.train.main` on each [arguments, environment] (JSON) of argv in turn, the environment added to
# os.environ for that run only, and ends each run's output with a RUN_ENDED line that gives its exit status.
# stderr goes to stdout, so that a run's lines stay before its RUN_ENDED line where a launcher (horovodrun) reads
# the two streams apart.
IN_ONE_PROCESS = """\
import json, os, sys
os.dup2(1, 2)
from lm.training import train
for run in sys.argv[1:]:
    arguments, environment = json.loads(run)
    before = dict(os.environ)
    os.environ.update(environment)
    status = train.main(arguments)
    os.environ.clear()
    os.environ.update(before)
    print("%s %d" % (RUN_ENDED, status), flush=True)
"""
RUN_ENDED = "=== run ended, exit status"


def one_after_another_command(runs, then=""):
    """The command that runs each `lm.training.train` run of `runs` ((cli_args, environment) pairs) one after
    another in one process, then the Python code `then`: one TensorFlow start-up for all of them."""
    code = IN_ONE_PROCESS.replace("RUN_ENDED", repr(RUN_ENDED)) + then
    return [sys.executable, "-c", code] + [json.dumps(run) for run in runs]


def ended_runs(output, count):
    """[(exit status, output)] of each of the `count` runs in the output of `one_after_another_command`."""
    parts = re.split(r"^%s (\d+)\n" % re.escape(RUN_ENDED), output, flags=re.MULTILINE)
    ended = [(int(status), run_output) for run_output, status in zip(parts[0::2], parts[1::2])]
    assert len(ended) == count, output
    return ended


def run_one_after_another(runs, sigterm_when=None):
    """[(exit status, output)] of each `lm.training.train` run of `runs` ((cli_args, environment) pairs), one after
    another in one fresh process; with `sigterm_when`, the process gets SIGTERM at each line of its output for
    which sigterm_when(index of the run in `runs`, line) holds."""
    process = subprocess.Popen(one_after_another_command(runs), env=environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    output, ended = [], 0
    for line in process.stdout:
        output.append(line)
        ended += line.startswith(RUN_ENDED)
        if sigterm_when and sigterm_when(ended, line):
            process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=600) == 0, "".join(output)
    return ended_runs("".join(output), len(runs))


# horovodrun prefixes each line of a rank with "[rank]<stdout>:".
RANK_PREFIX = re.compile(r"^\[(\d+)\]<std(?:out|err)>:")


def lines(output):
    return [RANK_PREFIX.sub("", line) for line in output.splitlines()]


def rank_outputs(output):
    """[output of rank 0, of rank 1, ...] of horovodrun's `output`, each without the rank prefixes."""
    by_rank = {}
    for line in output.splitlines(keepends=True):
        prefix = RANK_PREFIX.match(line)
        if prefix:
            by_rank.setdefault(int(prefix.group(1)), []).append(line[prefix.end():])
    return ["".join(by_rank[rank]) for rank in sorted(by_rank)]


def losses(output):
    """{step: loss} from the [train] lines."""
    found = {}
    for line in lines(output):
        if line.startswith(job.TRAIN_LOG_PREFIX):
            metrics = log_metrics.parse_metrics(line)
            step = int(line.split("step=")[1].split()[0])
            found[step] = metrics["train:loss"]
    return found


def val_losses(output):
    return [log_metrics.parse_metrics(line)["validation:loss"] for line in lines(output)
            if line.startswith(job.EVAL_LOG_PREFIX)]
