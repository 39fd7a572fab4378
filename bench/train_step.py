"""Our train step on CPU against the machine's dense-matmul peak and the seed-style model.

    python bench/train_step.py [--layers 4] [--d-model 256] [--heads 4] [--seq-len 256] [--batch 8]
                               [--steps 8] [--repeats 3] [--pairs 30]

In one process, side by side, repeated `--repeats` times in turn (the median is reported, so a
busy machine slows every candidate alike):

- `matmul`: a float32 [4096 x d] @ [d x 4d] matmul, the dense-matmul rate this CPU reaches
  (2 M N K FLOPs per call), the "achievable peak";
- `ours` and `ours_xla`: `lm.distributed.single` train step (forward, backward, clipping,
  AdamW) on the pre-LN GELU GPT with head width d_model / n_heads, without and with XLA;
- `seed_style`: the same train step on the seed's block at the same shapes: post-LN, ReLU,
  every head d_model wide (key_dim = d_model);
- `unchecked` and `defended`: the cost of lm.training.divergence's checks. `unchecked` is the step without
  them (clip and apply, as before they were added: no finite test, nothing read back per step); `defended` is
  `ours` as the loop runs it: the update applied only when the loss and gradient norm are finite, and per step
  the two scalars read back and judged (`Divergence.observe`). They are timed in pairs, one step of each in
  turn (`--pairs`, each step read back to the host), and the overhead is the median of the pairs' defended /
  unchecked - 1, which a load that drifts during the run changes little (target: under 1 %).

Model FLOP/s = tokens/s x lm.spec.families.flops_per_token: 6 x (the blocks' matmul weights + the
output projection) + 12 L T x attention width (the seed's wider heads count in both). Targets: ours >= 50 % of the matmul FLOP/s, and
>= 1.3 x the seed style's tokens/s. Prints a table and JSON; writes bench/results/train_step.json.
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "training_image"))

from publish import publish  # noqa: E402

from lm.compat import TF_VERSION, tf  # noqa: E402
from lm.spec.families import GPTConfig, flops_per_token, parameter_count  # noqa: E402
from lm.distributed import get_strategy  # noqa: E402
from lm.distributed.base import compute_gradients  # noqa: E402
from lm.spec import job  # noqa: E402
from lm.training.divergence import Divergence  # noqa: E402
from lm.models.gpt import build_model  # noqa: E402
from lm.training.optim import AdamW, learning_rate_at  # noqa: E402
from lm.training.train import token_loss  # noqa: E402


def make_step(config, jit_compile):
    tf.random.set_seed(0)
    model = build_model(config)
    optimizer = AdamW(model.trainable_variables, lambda step: learning_rate_at(step, 1e-3, 10, 1000, 0.1))
    step = get_strategy("single").setup().build_train_step(model, optimizer, token_loss(tf), grad_clip=1.0,
                                                           jit_compile=jit_compile)
    return step


def make_unchecked_step(config, jit_compile):
    """The train step without the divergence checks: clipping and AdamW's update, applied whatever the values."""
    tf.random.set_seed(0)
    model = build_model(config)
    optimizer = AdamW(model.trainable_variables, lambda step: learning_rate_at(step, 1e-3, 10, 1000, 0.1))
    forward_backward = tf.function(lambda inputs, labels: compute_gradients(model, token_loss(tf), inputs, labels),
                                   jit_compile=jit_compile, autograph=False)

    @tf.function(autograph=False)
    def step(inputs, labels):
        loss, grads = forward_backward(inputs, labels)
        norm = tf.linalg.global_norm(grads)
        grads, _ = tf.clip_by_global_norm(grads, 1.0, use_norm=norm)
        optimizer.apply_gradients(grads, model.trainable_variables)
        return {"loss": loss, "grad_norm": norm}
    return step


class Defended:
    """A train step as lm.training.train runs it: each step's loss and applied flag read back and judged."""

    def __init__(self, step):
        self.step, self.count = step, 0
        self.guard = Divergence(type("Hyperparameters", (), dict(job.validate_hyperparameters({}))))

    def __call__(self, inputs, labels):
        metrics = self.step(inputs, labels)
        self.count += 1
        self.guard.observe(self.count, float(metrics["loss"]), float(metrics["applied"]) > 0.0)
        return metrics


def paired_overhead(unchecked, defended, tokens, pairs):
    """The median over `pairs` of (a defended step's seconds / an unchecked step's, next to each other) - 1."""
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    ratios = []
    for _ in range(pairs):
        seconds = []
        for step in (unchecked, defended):
            started = time.perf_counter()
            float(step(inputs, labels)["loss"])
            seconds.append(time.perf_counter() - started)
        ratios.append(seconds[1] / seconds[0])
    return statistics.median(ratios) - 1


def time_train_step(step, tokens, steps):
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    started = time.perf_counter()
    for _ in range(steps):
        metrics = step(inputs, labels)
    float(metrics["loss"])
    return (time.perf_counter() - started) / steps


def make_matmul(m, k, n):
    a = tf.random.normal([m, k])
    b = tf.random.normal([k, n])
    matmul = tf.function(lambda: tf.matmul(a, b))
    return matmul, 2.0 * m * k * n


def time_matmul(matmul, calls):
    started = time.perf_counter()
    for _ in range(calls):
        result = matmul()
    float(result[0, 0])
    return (time.perf_counter() - started) / calls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=30, help="paired steps timing the divergence checks")
    args = parser.parse_args(argv)

    ours = GPTConfig(n_layer=args.layers, d_model=args.d_model, n_head=args.heads, block_size=args.seq_len,
                     vocab_size=args.vocab, pad_vocab_to=64)
    seed = ours.replace(norm="post", activation="relu", head_dim=args.d_model)
    tokens = tf.random.uniform([args.batch, args.seq_len + 1], maxval=args.vocab, dtype=tf.int32, seed=1)
    tokens_per_step = args.batch * args.seq_len

    candidates = {"ours": (ours, False), "ours_xla": (ours, True), "seed_style": (seed, False),
                  "unchecked": (ours, False), "defended": (ours, False)}
    steps = {name: make_step(config, jit) for name, (config, jit) in candidates.items()}
    steps["unchecked"] = make_unchecked_step(ours, False)
    steps["defended"] = Defended(steps["defended"])
    matmul, matmul_flops = make_matmul(4096, args.d_model, 4 * args.d_model)
    for step in steps.values():
        time_train_step(step, tokens, 2)  # trace, compile, warm up
    time_matmul(matmul, 3)

    seconds = {name: [] for name in list(candidates) + ["matmul"]}
    for _ in range(args.repeats):
        for name, step in steps.items():
            seconds[name].append(time_train_step(step, tokens, args.steps))
        seconds["matmul"].append(time_matmul(matmul, 20))

    overhead = paired_overhead(steps["unchecked"], steps["defended"], tokens, args.pairs)
    peak = matmul_flops / statistics.median(seconds["matmul"])
    results = {"matmul": {"seconds_per_call": statistics.median(seconds["matmul"]), "flops_per_s": peak}}
    for name, (config, jit) in candidates.items():
        per_step = statistics.median(seconds[name])
        tokens_per_s = tokens_per_step / per_step
        model_flops = tokens_per_s * flops_per_token(config, args.seq_len)
        results[name] = {"seconds_per_step": per_step, "tokens_per_s": tokens_per_s, "model_flops_per_s": model_flops,
                         "fraction_of_matmul": model_flops / peak, "params": parameter_count(config), "xla": jit}
    best = max(("ours", "ours_xla"), key=lambda name: results[name]["tokens_per_s"])
    report = {
        "tensorflow": ".".join(map(str, TF_VERSION)), "dtype": "float32", "cpu_threads": os.cpu_count(),
        "shape": {"layers": args.layers, "d_model": args.d_model, "heads": args.heads, "seq_len": args.seq_len,
                  "batch": args.batch, "vocab": args.vocab},
        "results": results, "best_of_ours": best,
        "ours_fraction_of_matmul": results[best]["fraction_of_matmul"],
        "ours_vs_seed_tokens_per_s": results[best]["tokens_per_s"] / results["seed_style"]["tokens_per_s"],
        "divergence_checks_overhead": overhead, "divergence_pairs": args.pairs,
        "targets": {"fraction_of_matmul": 0.5, "vs_seed": 1.3, "divergence_checks_overhead": 0.01},
    }
    print("%-12s %12s %14s %16s %10s" % ("candidate", "s/step", "tokens/s", "model GFLOP/s", "of matmul"))
    print("%-12s %12.5f %14s %16.2f %10s" % ("matmul", results["matmul"]["seconds_per_call"], "-", peak / 1e9, "100 %"))
    for name in candidates:
        row = results[name]
        print("%-12s %12.5f %14.0f %16.2f %9.1f %%" % (name, row["seconds_per_step"], row["tokens_per_s"],
                                                        row["model_flops_per_s"] / 1e9, 100 * row["fraction_of_matmul"]))
    print("best of ours (%s): %.2fx the seed style's tokens/s, %.1f %% of the matmul rate"
          % (best, report["ours_vs_seed_tokens_per_s"], 100 * report["ours_fraction_of_matmul"]))
    print("divergence checks: %+.2f %% of the unchecked step (median of %d paired steps)" % (
        100 * overhead, args.pairs))
    publish("train_step", report)


if __name__ == "__main__":
    main()
