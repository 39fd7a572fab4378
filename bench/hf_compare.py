"""lmstack against transformers' TFGPT2LMHeadModel on the same weights, CPU, fp32, side by side.

    .venv-hf/bin/python bench/hf_compare.py [--preset gpt-125m] [--batch-sizes 1 8] [--new-tokens 256]
        [--prompt-tokens 8] [--train-batch 4] [--train-seq-len 256] [--train-steps 5] [--repeats 2]

Run with .venv-hf's interpreter (transformers 4.46.3; `make setup` builds it). Our model gets
random weights, is written by `lm.export --format hf` and loaded by TFGPT2LMHeadModel.

- generation: new tokens/s of `lm.generate.generate_tokens` (greedy, key/value cache) and of
  `model.generate(do_sample=False, use_cache=True)`, both without an end token (all
  `--new-tokens` are generated), per batch size; the ratio ours / theirs (goal >= 1.0);
- training: tokens/s of the same train step (`lm.distributed` single strategy: lm.optim.AdamW,
  clipping at 1.0, token_loss) on our GPT and on TFGPT2LMHeadModel (its logits); the ratio
  (goal >= 1.3).
Each measurement runs once untimed (tracing), then `--repeats` times; the best run counts.
Prints a table and JSON; writes bench/results/hf_compare.json.
"""
import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "training_image"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from publish import publish  # noqa: E402

from lm import export as lm_export  # noqa: E402
from lm import hf  # noqa: E402
from lm.compat import tf  # noqa: E402
from lm.config import get_preset  # noqa: E402
from lm.distributed import get_strategy  # noqa: E402
from lm.generate import generate_tokens  # noqa: E402
from lm.model import build_model  # noqa: E402
from lm.optim import AdamW  # noqa: E402
from lm.tokenizer import save, train_bpe  # noqa: E402
from lm.train import token_loss  # noqa: E402


class LogitsOf:
    """TFGPT2LMHeadModel seen as a model that returns logits, for lm.distributed's train step."""

    def __init__(self, model):
        self.model = model

    @property
    def trainable_variables(self):
        return self.model.trainable_variables

    def __call__(self, inputs, training=False):
        return self.model(inputs, training=training).logits


def best_seconds(function, repeats):
    function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def train_tokens_per_second(model, tokens, steps, repeats):
    optimizer = AdamW(model.trainable_variables, lambda step: 1e-4)
    step = get_strategy("single").setup().build_train_step(model, optimizer, token_loss(tf), grad_clip=1.0)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]

    def run():
        for _ in range(steps):
            float(step(inputs, labels)["loss"])
    return steps * int(np.prod(inputs.shape)) / best_seconds(run, repeats)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench/hf_compare.py", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="gpt-125m")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=8)
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--train-seq-len", type=int, default=256)
    parser.add_argument("--train-steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
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
              "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_tokens, "generation": {}}
    for batch in args.batch_sizes:
        prompts = rng.integers(0, config.vocab_size, [batch, args.prompt_tokens]).astype(np.int32)
        ours_s = best_seconds(lambda: generate_tokens(ours, config, prompts.tolist(), args.new_tokens,
                                                      temperature=0.0), args.repeats)
        theirs_s = best_seconds(lambda: theirs.generate(tf.constant(prompts), max_new_tokens=args.new_tokens,
                                                        min_new_tokens=args.new_tokens, do_sample=False,
                                                        use_cache=True, pad_token_id=0), args.repeats)
        new = batch * args.new_tokens
        report["generation"]["batch_%d" % batch] = {
            "lmstack_tokens_per_s": new / ours_s, "transformers_tokens_per_s": new / theirs_s,
            "ratio": theirs_s / ours_s}
    tokens = tf.constant(rng.integers(0, config.vocab_size, [args.train_batch, args.train_seq_len + 1]), tf.int32)
    ours_train = train_tokens_per_second(ours, tokens, args.train_steps, args.repeats)
    theirs_train = train_tokens_per_second(LogitsOf(theirs), tokens, args.train_steps, args.repeats)
    report["training"] = {"batch": args.train_batch, "seq_len": args.train_seq_len,
                          "lmstack_tokens_per_s": ours_train, "transformers_tokens_per_s": theirs_train,
                          "ratio": ours_train / theirs_train}
    print("%-22s %14s %14s %8s" % ("measure", "lmstack tok/s", "transformers", "ratio"))
    for name, row in sorted(report["generation"].items()):
        print("%-22s %14.1f %14.1f %8.2f" % ("generate " + name, row["lmstack_tokens_per_s"],
                                             row["transformers_tokens_per_s"], row["ratio"]))
    row = report["training"]
    print("%-22s %14.1f %14.1f %8.2f" % ("train step", row["lmstack_tokens_per_s"],
                                         row["transformers_tokens_per_s"], row["ratio"]))
    publish("hf_compare", report)
    return report


if __name__ == "__main__":
    main()
