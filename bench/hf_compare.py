"""lmstack against transformers' TFGPT2LMHeadModel on the same weights, CPU, fp32, side by side.

    .venv-hf/bin/python bench/hf_compare.py [--preset gpt-125m] [--batch-sizes 1 8] [--new-tokens 256]
        [--prompt-tokens 8] [--train-batch 4] [--train-seq-len 256] [--train-steps 2]
        [--train-xla off on] [--repeats 3]

Run with .venv-hf's interpreter (transformers 4.46.3; `make setup` builds it). Our model gets
random weights, is written by `lm.hf --format hf` and loaded by TFGPT2LMHeadModel.

- generation: new tokens/s of `lm.serving.generate.generate_tokens` (greedy, key/value cache) and of
  `model.generate(do_sample=False, use_cache=True)`, both without an end token (all
  `--new-tokens` are generated), per batch size (`--batch-sizes` with no value: none); the
  ratio ours / theirs (goal >= 1.0);
- training: tokens/s of the same train step (`lm.distributed` single strategy: lm.training.optim.AdamW,
  clipping at 1.0, token_loss) on our GPT and on TFGPT2LMHeadModel (its logits), without and
  with XLA (`jit_compile` of the forward and backward pass; `lm.training.train`'s default is on); the
  ratio in each mode (goal >= 1.3). Timed in the same rounds: a float32 [tokens, d] @ [d, 4d]
  matmul (bench/train_step.py's), the rate this CPU reaches; each side's model FLOP/s (6N +
  12 L d T + 6 d V per token) as a share of it, and the ceiling: the ratio a step at that rate
  would reach against transformers.
Each candidate runs once untimed (tracing, compiling), then `--repeats` rounds time every
candidate of a measure in turn, so a busy machine slows all alike; best and median are
reported, the ratios of both. Prints a table and JSON; writes bench/results/hf_compare.json.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "training_image"))
sys.path.insert(0, ROOT)  # controlplane.presets: the presets are the control plane's
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from publish import publish  # noqa: E402

from lm.serving import export as lm_export  # noqa: E402
from lm import hf  # noqa: E402
from lm.compat import tf  # noqa: E402
from controlplane.presets import get_preset  # noqa: E402
from lm.distributed import get_strategy  # noqa: E402
from lm.serving.generate import generate_tokens  # noqa: E402
from lm.models.gpt import build_model  # noqa: E402
from lm.training.optim import AdamW  # noqa: E402
from lm.tokenizer import save, train_bpe  # noqa: E402
from lm.training.train import token_loss  # noqa: E402
from train_step import make_matmul, time_matmul  # noqa: E402


class LogitsOf:
    """TFGPT2LMHeadModel seen as a model that returns logits, for lm.distributed's train step."""

    def __init__(self, model):
        self.model = model

    @property
    def trainable_variables(self):
        return self.model.trainable_variables

    def __call__(self, inputs, training=False):
        return self.model(inputs, training=training).logits


def interleaved_seconds(functions, repeats):
    """{name: [seconds of each round]}: every function once untimed, then `repeats` rounds that
    call each function in turn."""
    for function in functions.values():
        function()
    seconds = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            started = time.perf_counter()
            function()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def compare(work, ours_seconds, theirs_seconds):
    """Tokens/s (best and median round) of both sides doing `work` tokens, and their ratios."""
    row = {}
    for side, seconds in (("lmstack", ours_seconds), ("transformers", theirs_seconds)):
        row[side + "_tokens_per_s"] = work / min(seconds)
        row[side + "_median_tokens_per_s"] = work / statistics.median(seconds)
    row["ratio"] = row["lmstack_tokens_per_s"] / row["transformers_tokens_per_s"]
    row["median_ratio"] = row["lmstack_median_tokens_per_s"] / row["transformers_median_tokens_per_s"]
    return row


def useful_flops_per_token(config, seq_len):
    """Training FLOPs of a token on either model (lm.spec.families' count) with the tied output
    projection over the real vocabulary, not our padded one: at gpt-125m a third of the work."""
    return config.replace(pad_vocab_to=1).flops_per_token(seq_len)


def with_matmul_ceiling(row, flops_per_token, matmul_seconds, matmul_flops):
    """Each side's model FLOP/s as a share of the dense-matmul rate measured in the same rounds, and
    the ratio a train step running at that rate would reach against transformers."""
    for suffix, pick in (("", min), ("_median", statistics.median)):
        peak = matmul_flops / pick(matmul_seconds)
        for side in ("lmstack", "transformers"):
            row[side + suffix + "_fraction_of_matmul"] = row[side + suffix + "_tokens_per_s"] * flops_per_token / peak
        row["ceiling" + suffix + "_ratio"] = 1.0 / row["transformers" + suffix + "_fraction_of_matmul"]
    return row


def train_steps(model, tokens, steps, jit_compile):
    """A callable running `steps` train steps on `tokens` (the batch, one token longer than the sequence)."""
    optimizer = AdamW(model.trainable_variables, lambda step: 1e-4)
    step = get_strategy("single").setup().build_train_step(model, optimizer, token_loss(tf), grad_clip=1.0,
                                                           jit_compile=jit_compile)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]

    def run():
        for _ in range(steps):
            float(step(inputs, labels)["loss"])
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench/hf_compare.py", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="gpt-125m")
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=8)
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--train-seq-len", type=int, default=256)
    parser.add_argument("--train-steps", type=int, default=2, help="train steps per timed round")
    parser.add_argument("--train-xla", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from transformers import TFGPT2LMHeadModel, __version__ as transformers_version

    config = get_preset(args.preset)
    tf.random.set_seed(0)
    ours = build_model(config)
    with tempfile.TemporaryDirectory() as directory:
        tokenizer_file = os.path.join(directory, "tokenizer.json")
        save(train_bpe(["a tokenizer for the benchmark %d" % i for i in range(20)], vocab_size=300), tokenizer_file)
        lm_export.export_model(ours, config, tokenizer_file, os.path.join(directory, "export"))
        hf.export_hf(os.path.join(directory, "export"), os.path.join(directory, "hf"))
        theirs = TFGPT2LMHeadModel.from_pretrained(os.path.join(directory, "hf"))
    theirs.generation_config.eos_token_id = None
    rng = np.random.default_rng(0)
    report = {"preset": args.preset, "tf": tf.__version__, "transformers": transformers_version,
              "cpu_threads": os.cpu_count(), "repeats": args.repeats, "new_tokens": args.new_tokens,
              "prompt_tokens": args.prompt_tokens, "generation": {}}
    for batch in args.batch_sizes:
        prompts = rng.integers(0, config.vocab_size, [batch, args.prompt_tokens]).astype(np.int32)
        seconds = interleaved_seconds({
            "ours": lambda: generate_tokens(ours, config, prompts.tolist(), args.new_tokens, temperature=0.0),
            "theirs": lambda: theirs.generate(tf.constant(prompts), max_new_tokens=args.new_tokens,
                                              min_new_tokens=args.new_tokens, do_sample=False, use_cache=True,
                                              pad_token_id=0)}, args.repeats)
        report["generation"]["batch_%d" % batch] = compare(batch * args.new_tokens, seconds["ours"], seconds["theirs"])
    tokens = tf.constant(rng.integers(0, config.vocab_size, [args.train_batch, args.train_seq_len + 1]), tf.int32)
    report["training"] = {}
    matmul, matmul_flops = make_matmul(args.train_batch * args.train_seq_len, config.d_model, 4 * config.d_model)
    matmul_calls = 20
    for xla in args.train_xla:
        seconds = interleaved_seconds({
            "ours": train_steps(ours, tokens, args.train_steps, xla == "on"),
            "theirs": train_steps(LogitsOf(theirs), tokens, args.train_steps, xla == "on"),
            "matmul": lambda: time_matmul(matmul, matmul_calls)}, args.repeats)
        row = {"batch": args.train_batch, "seq_len": args.train_seq_len, "xla": xla == "on"}
        row.update(compare(args.train_steps * args.train_batch * args.train_seq_len, seconds["ours"],
                           seconds["theirs"]))
        report["training"]["xla_" + xla] = with_matmul_ceiling(
            row, useful_flops_per_token(config, args.train_seq_len), seconds["matmul"], matmul_calls * matmul_flops)
    print("%-24s %24s %24s %13s" % ("measure", "lmstack tok/s best/med", "transformers best/med", "ratio best/med"))
    rows = [("generate " + name, row) for name, row in sorted(report["generation"].items())]
    rows += [("train step, XLA " + xla, report["training"]["xla_" + xla]) for xla in args.train_xla]
    for name, row in rows:
        print("%-24s %12.1f %11.1f %12.1f %11.1f %6.2f %6.2f" % (
            name, row["lmstack_tokens_per_s"], row["lmstack_median_tokens_per_s"], row["transformers_tokens_per_s"],
            row["transformers_median_tokens_per_s"], row["ratio"], row["median_ratio"]))
    for xla in args.train_xla:
        row = report["training"]["xla_" + xla]
        print("train step, XLA %-3s of the matmul rate (best rounds): lmstack %.0f %%, transformers %.0f %%; "
              "a step at the matmul rate would be %.2fx transformers" % (
                  xla, 100 * row["lmstack_fraction_of_matmul"], 100 * row["transformers_fraction_of_matmul"],
                  row["ceiling_ratio"]))
    publish("hf_compare", report)
    return report


if __name__ == "__main__":
    main()
