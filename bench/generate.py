"""Generation speed with the key/value cache against full recomputation, in one run, on CPU.

    python bench/generate.py [--lengths 64 256 1024] [--batch 1] [--prompt 16]

For `tiny` and a small GPT (4 layers, d_model 256), both with a context of 1024 + 64 tokens
so 1024 new tokens fit, `lm.serving.generate.generate_tokens` produces N new tokens greedily (no stop
token, so every run makes exactly N) from the same prompt, once with the cache and once
recomputing the whole sequence per token (the reference). Each path is traced and warmed up
first. Reports new tokens per second per path and the factor cache / recomputation at each
N; the factor should grow with N (the recomputation's work per token grows with the
sequence, the cache's only with its attention over the cached slots). Prints a table and
JSON; writes bench/results/generate.json.
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "training_image"))
sys.path.insert(0, ROOT)  # controlplane.presets: the presets are the control plane's

from publish import publish  # noqa: E402

import numpy as np  # noqa: E402

from lm.compat import TF_VERSION, keras, tf  # noqa: E402
from controlplane.presets import get_preset  # noqa: E402
from lm.spec.families import GPTConfig, parameter_count  # noqa: E402
from lm.serving.generate import generate_tokens  # noqa: E402
from lm.models.gpt import build_model  # noqa: E402

CONTEXT = 1024 + 64
CONFIGS = {
    "tiny": get_preset("tiny").replace(block_size=CONTEXT),
    "small": GPTConfig(n_layer=4, d_model=256, n_head=4, block_size=CONTEXT, vocab_size=4096, pad_vocab_to=64),
}


def timed_generation(model, config, prompts, new_tokens, use_cache):
    started = time.perf_counter()
    outputs = generate_tokens(model, config, prompts, new_tokens, temperature=0.0, use_cache=use_cache)
    elapsed = time.perf_counter() - started
    assert all(len(row) == new_tokens for row in outputs), "a run ended early: the benchmark needs exactly N tokens"
    return elapsed, outputs


def bench_config(name, config, lengths, batch, prompt_len):
    keras.utils.set_random_seed(0)
    model = build_model(config)
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, config.vocab_size, size=[batch, prompt_len]).tolist()
    for use_cache in (True, False):  # trace both paths before timing
        timed_generation(model, config, prompts, 4, use_cache)
    rows = []
    for new_tokens in lengths:
        cached_s, cached = timed_generation(model, config, prompts, new_tokens, use_cache=True)
        full_s, full = timed_generation(model, config, prompts, new_tokens, use_cache=False)
        rows.append({
            "config": name, "params": parameter_count(config), "batch": batch, "prompt_tokens": prompt_len,
            "new_tokens": new_tokens,
            "cache_s": round(cached_s, 4), "recompute_s": round(full_s, 4),
            "cache_tokens_per_s": round(batch * new_tokens / cached_s, 2),
            "recompute_tokens_per_s": round(batch * new_tokens / full_s, 2),
            "speedup": round(full_s / cached_s, 3),
            # Greedy on the same logits: the two paths must agree (a float tie could differ; report it).
            "same_tokens": cached == full,
        })
        print("  %s N=%d done: cache %.2f s, recompute %.2f s" % (name, new_tokens, cached_s, full_s), file=sys.stderr)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args = parser.parse_args(argv)
    if args.prompt + max(args.lengths) > CONTEXT:
        parser.error("--prompt + the longest --lengths must fit the context of %d tokens" % CONTEXT)

    rows = []
    for name in args.configs:
        rows.extend(bench_config(name, CONFIGS[name], args.lengths, args.batch, args.prompt))
    report = {"benchmark": "generate", "tensorflow": tf.__version__, "tf_version": list(TF_VERSION),
              "cpus": os.cpu_count(), "load_average": list(os.getloadavg()), "rows": rows}

    print("%-6s %9s %6s %10s %12s %14s %8s %5s" % ("config", "params", "N", "cache s", "cache tok/s",
                                                 "recompute tok/s", "factor", "same"))
    for row in rows:
        print("%-6s %9d %6d %10.2f %12.1f %14.1f %8.2f %5s" % (
            row["config"], row["params"], row["new_tokens"], row["cache_s"], row["cache_tokens_per_s"],
            row["recompute_tokens_per_s"], row["speedup"], "yes" if row["same_tokens"] else "NO"))
    publish("generate", report)


if __name__ == "__main__":
    main()
