"""Shared by the tests of the SMDDP and SMP adapters (which run against fakes)."""
import contextlib
import importlib
import os

from lm.compat import tf

FAKES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes")
FAKE_ENV = ("FAKE_SDP_RANK", "FAKE_SDP_SIZE", "FAKE_SDP_LOCAL_RANK", "FAKE_SDP_LOCAL_SIZE", "FAKE_SDP_RENDEZVOUS",
            "FAKE_SMP_RANK", "FAKE_SMP_SIZE", "FAKE_SMP_LOCAL_SIZE", "FAKE_SMP_TIMEOUT", "FAKE_SMDIST_LOG",
            "SM_HP_MP_PARAMETERS")


@contextlib.contextmanager
def faked_smdist(monkeypatch):
    """The fake `smdistributed` package on sys.path, with an empty call log and nothing initialized (the
    fake_smdist fixture; a fixture of a wider scope brings a monkeypatch of its own)."""
    monkeypatch.syspath_prepend(FAKES)
    for name in FAKE_ENV:
        monkeypatch.delenv(name, raising=False)
    import smdistributed
    sdp = importlib.import_module("smdistributed.dataparallel.tensorflow")
    smp = importlib.import_module("smdistributed.modelparallel.tensorflow")
    assert "fakes" in smdistributed.__file__, "tests must run against the fakes"
    smdistributed.reset()
    sdp._state["initialized"] = False
    smp.reset()
    yield smdistributed
    smdistributed.reset()


def sequence_loss(labels, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))


def token_batch(batch, seq_len=16, seed=0, vocab=512):
    tokens = tf.random.stateless_uniform([batch, seq_len + 1], seed=[seed, 1], maxval=vocab, dtype=tf.int32)
    return tokens[:, :-1], tokens[:, 1:]


def build_tiny(build=True, **options):
    """The `tiny` GPT with the same initial weights on every call (`build=False`: created by its
    first call, in the same order and so with the same values); `options` go to build_model."""
    from controlplane.presets import get_preset
    from lm.models.gpt import build_model
    from seeding import set_random_seed
    set_random_seed(7)
    return build_model(get_preset("tiny"), build=build, **options)


def train(strategy, steps, batch=8, learning_rate=1e-2, grad_clip=1.0):
    """`steps` train steps of a fresh tiny GPT on fixed batches; returns (model, losses)."""
    from lm.training.optim import AdamW
    model = strategy.build_model(build_tiny)
    with strategy.scope():
        # epsilon 1e-4: the attention key biases get gradients that are zero up to rounding (softmax
        # ignores a per-query constant); a tiny epsilon would blow that rounding up to +-lr steps.
        optimizer = AdamW(model.trainable_variables, lambda step: learning_rate, epsilon=1e-4)
    train_step = strategy.build_train_step(model, optimizer, sequence_loss, grad_clip=grad_clip)
    losses = []
    for index in range(steps):
        metrics = train_step(*token_batch(batch))  # one batch, so the loss must fall
        if index == 0:
            strategy.broadcast_initial_state(model, optimizer)
        losses.append(float(metrics["loss"]))
    return model, optimizer, losses


def write_random_dataset(directory, records=400, seq_len=16, vocab_size=512, shard_records=150):
    """A train split of random tokens in the lm.spec.shards format (rows unique, so overlaps show)."""
    import numpy as np

    from lm.spec import shards
    from tokenizers import Tokenizer, models, pre_tokenizers
    tokenizer_file = os.path.join(directory, "tokenizer.json")
    # A real (tiny) tokenizer, so an export loads in lm.serving.server.
    tokenizer = Tokenizer(models.WordLevel({"<eod>": 0, "a": 1, "b": 2}, unk_token="<eod>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(tokenizer_file)
    dtype = shards.dtype_for_vocab(vocab_size)
    rows = np.random.RandomState(0).randint(1, vocab_size, size=(records, seq_len + 1)).astype("<u2")
    manifest = shards.Manifest(dtype=dtype, seq_len=seq_len, vocab_size=vocab_size, eod_token_id=0,
                               tokenizer_file="tokenizer.json", tokenizer_sha256=shards.sha256_file(tokenizer_file))
    os.makedirs(os.path.join(directory, "train"))
    for index, start in enumerate(range(0, records, shard_records)):
        part = rows[start:start + shard_records]
        relative = "train/%05d.bin" % index
        shards.write_atomically(os.path.join(directory, relative), part.tobytes())
        manifest.shards.append(shards.Shard(path=relative, split="train", records=len(part), bytes=part.nbytes,
                                            sha256=shards.sha256_file(os.path.join(directory, relative))))
    shards.save_manifest(directory, manifest)
    return directory


def run_train(data_dir, out_dir, strategy, env, steps=3, ranks=None, **hyperparameters):
    """`python -m lm.training.train` in a subprocess with the FAKES first on PYTHONPATH; returns
    (exit status, output, recorded fake calls). `ranks`: run it as that many ranks of a fake
    SMP job (threads, `smdistributed.modelparallel.run`)."""
    import subprocess
    import sys

    environ = dict(_fake_environment(ranks or 1), FAKE_SMDIST_LOG=_call_log(out_dir), **env)
    launcher = ["-m", "smdistributed.modelparallel.run", str(ranks)] if ranks else ["-m"]
    args = [sys.executable] + launcher + ["lm.training.train"] + train_arguments(
        data_dir, out_dir, strategy, steps, **hyperparameters)
    result = subprocess.run(args, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=600)
    return result.returncode, result.stdout, _recorded_calls(out_dir)


# Runs each job of argv (JSON [ranks, arguments, environment]) in turn: `lm.training.train.main` as that many
# thread ranks of one fake SMP job (as `smdistributed.modelparallel.run`; no ranks: in this thread), the
# environment added to os.environ for that job only, and ends each job's output with the RUN_ENDED line of
# tests/training/helpers (read back by its ended_runs) that gives its exit status (the highest of its ranks').
JOBS_IN_ONE_PROCESS = """\
import json, os, sys
import smdistributed.modelparallel.tensorflow as smp
from lm.training import train
for job in sys.argv[1:]:
    ranks, arguments, environment = json.loads(job)
    before = dict(os.environ)
    os.environ.update(environment)
    statuses = smp.run_ranks(ranks, train.main, arguments) if ranks else [train.main(arguments)]
    os.environ.clear()
    os.environ.update(before)
    print("%s %d" % (RUN_ENDED, max(status or 0 for status in statuses)), flush=True)
"""


def run_jobs(jobs):
    """[(exit status, output, recorded fake calls)] of each job of `jobs` (dicts of run_train's arguments), run
    one after another in one subprocess: one TensorFlow start-up and one autograph conversion of the code
    for all of them. TensorFlow's inter-op threads are set once, for the job with the most ranks."""
    import json
    import subprocess
    import sys

    from training import helpers

    runs = [_in_one_process(**job) for job in jobs]
    threads = max(job.get("ranks") or 1 for job in jobs)
    code = JOBS_IN_ONE_PROCESS.replace("RUN_ENDED", repr(helpers.RUN_ENDED))
    result = subprocess.run([sys.executable, "-c", code] + [json.dumps(run) for run in runs],
                            env=dict(_fake_environment(threads), PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:]
    ended = helpers.ended_runs(result.stdout, len(jobs))
    return [(status, output, _recorded_calls(job["out_dir"])) for (status, output), job in zip(ended, jobs)]


def _in_one_process(data_dir, out_dir, strategy, env, steps=3, ranks=None, **hyperparameters):
    """A job of run_train's arguments as JOBS_IN_ONE_PROCESS takes it: [ranks, arguments, environment]."""
    if "TF_NUM_INTEROP_THREADS" in env:
        raise ValueError("run_jobs sets TF_NUM_INTEROP_THREADS once for the process, not per job")
    return [ranks, train_arguments(data_dir, out_dir, strategy, steps, **hyperparameters),
            dict(env, FAKE_SMDIST_LOG=_call_log(out_dir))]


def _fake_environment(interop_threads):
    """os.environ without SageMaker's and the fakes' settings, the FAKES first on PYTHONPATH; TensorFlow on a
    couple of threads, but `interop_threads` inter-op threads (a fake SMP rank blocks one in a step's barrier)."""
    training_image = os.path.join(os.path.dirname(os.path.dirname(FAKES)), "training_image")
    environ = {name: value for name, value in os.environ.items()
               if not name.startswith(("SM_", "FAKE_")) and name not in ("TF_CONFIG", "LM_CHECKPOINT_DIR")}
    environ.update(PYTHONPATH=os.pathsep.join([FAKES, training_image]),
                   TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="2",
                   TF_NUM_INTEROP_THREADS=str(interop_threads))
    return environ


def _call_log(out_dir):
    return os.path.join(out_dir, "calls.jsonl")


def _recorded_calls(out_dir):
    import json

    if not os.path.exists(_call_log(out_dir)):
        return []
    with open(_call_log(out_dir)) as handle:
        return [json.loads(line) for line in handle]


def train_arguments(data_dir, out_dir, strategy, steps=3, **hyperparameters):
    """`lm.training.train`'s arguments for `steps` steps of the tiny GPT with `strategy`, writing under out_dir."""
    from training import helpers

    # learning_rate: 0.02 x 8 / 256, the peak these runs had under the linear scaling default of before
    values = dict(preset="tiny", strategy=strategy, global_batch_size=8, max_steps=steps, learning_rate=0.02 / 32,
                  warmup_steps=1, log_every=1, eval_every=0, eval_batches=1, checkpoint_every=2, seed=7, xla=False)
    return helpers.cli_args(data_dir, out_dir, **dict(values, **hyperparameters))
