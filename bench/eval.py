"""lm-eval loglikelihood scoring speed against the training forward of the same model, in one run, on CPU.

    python bench/eval.py [--preset gpt-125m] [--batch 4] [--context 448] [--continuation 64] [--repeats 3]

Ours: `lm.eval.scorer.Scorer.loglikelihoods` (what lm.eval's lm-eval model calls for loglikelihood
requests) on `batch` (context, continuation) pairs of random token ids, end to end: padding on the
host, the traced forward with its log-softmax over the real vocabulary, the gather of the
continuation's tokens and the greedy check, and the sums per request. Reference: the training
forward, the strategy's eval step (`lm.distributed` single: model(inputs) and the token
cross-entropy, as validation runs it) on the same [batch, context + continuation - 1] tokens. Both
are traced and warmed up first, then timed alternately `repeats` times; the median of each gives
tokens per second (input tokens, the same count for both) and their ratio. Target: >= 0.8.
Prints a table and JSON; writes bench/results/eval.json.
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "training_image"))
sys.path.insert(0, ROOT)  # controlplane.presets: the presets are the control plane's

from publish import publish  # noqa: E402

import numpy as np  # noqa: E402

from controlplane.presets import get_preset  # noqa: E402
from lm import models  # noqa: E402
from lm.compat import TF_VERSION, keras, tf  # noqa: E402
from lm.distributed import get_strategy  # noqa: E402
from lm.eval.scorer import Scorer  # noqa: E402
from lm.spec.families import parameter_count  # noqa: E402
from lm.training.train import token_loss  # noqa: E402


def timed(function):
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="gpt-125m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=448, help="context tokens per request")
    parser.add_argument("--continuation", type=int, default=64, help="scored tokens per request")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    config = get_preset(args.preset)
    width = args.context + args.continuation - 1
    if width > config.block_size:
        parser.error("--context + --continuation - 1 must fit the context of %d tokens" % config.block_size)

    keras.utils.set_random_seed(0)
    model = models.build(config)
    scorer = Scorer(model, config, tokenizer=None, eod_token_id=0, batch_size=args.batch)
    eval_step = get_strategy("single").setup().build_eval_step(model, token_loss(tf))
    rng = np.random.default_rng(0)
    rows = rng.integers(1, config.vocab_size, size=[args.batch, width + 1]).astype(np.int32)
    pairs = [(row[:args.context].tolist(), row[args.context:].tolist()) for row in rows]
    inputs, labels = tf.constant(rows[:, :-1]), tf.constant(rows[:, 1:])

    def ours():
        scorer.loglikelihoods(pairs)

    def reference():
        float(eval_step(inputs, labels))

    ours(), reference()  # trace both
    ours_s, reference_s = [], []
    for _ in range(args.repeats):
        reference_s.append(timed(reference))
        ours_s.append(timed(ours))
        print("  ours %.2f s, training forward %.2f s" % (ours_s[-1], reference_s[-1]), file=sys.stderr)
    tokens = args.batch * width
    ours_rate, reference_rate = tokens / statistics.median(ours_s), tokens / statistics.median(reference_s)
    report = {"benchmark": "eval", "tensorflow": tf.__version__, "tf_version": list(TF_VERSION),
              "cpus": os.cpu_count(), "load_average": list(os.getloadavg()), "preset": args.preset,
              "params": parameter_count(config), "batch": args.batch, "context": args.context,
              "continuation": args.continuation, "tokens_per_batch": tokens,
              "ours_s": [round(s, 4) for s in ours_s], "training_forward_s": [round(s, 4) for s in reference_s],
              "ours_tokens_per_s": round(ours_rate, 1), "training_forward_tokens_per_s": round(reference_rate, 1),
              "ratio": round(ours_rate / reference_rate, 3)}
    print("%-10s %6s %7s %18s %26s %6s" % ("preset", "batch", "tokens", "loglikelihood tok/s",
                                           "training forward tok/s", "ratio"))
    print("%-10s %6d %7d %18.1f %26.1f %6.3f" % (args.preset, args.batch, tokens, ours_rate, reference_rate,
                                                 report["ratio"]))
    publish("eval", report)


if __name__ == "__main__":
    main()
