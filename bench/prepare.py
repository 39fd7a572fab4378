"""Benchmark `lm.data.prepare` against the raw `tokenizers` ceiling on the same texts, in one run.

    python bench/prepare.py [--text-bytes N] [--files N] [--tokenizer FILE] [--repeats N]

Measures, on one sample corpus (`lmstack.sample_corpus`, split into --files files):
  raw:        `Tokenizer.encode_batch_fast` on all the texts, one thread, in this process (the ceiling);
  ours x1:    `python -m lm.data.prepare --workers 1 --threads 1`, end to end (read, tokenize, write, checksum);
  ours x2:    the same with `--workers 2`;
and the bytes ratio (shard bytes / text bytes). Throughputs are MB of text per second, from wall
time and from CPU time (the machine may be shared: CPU time is what one core spends). The fixed
cost of a run (start-up, worker processes, tokenizer load) is measured on a one-document-per-file
corpus and reported; "steady" throughputs leave it out, as a Pile-sized run would. Prints a
table and JSON; writes bench/results/prepare.json. Targets (issue 4): ours x1 >= 0.9 of raw,
x2 >= 1.7 x x1, ratio <= 0.55.
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "training_image"))

from publish import publish  # noqa: E402

from lm.data import pile  # noqa: E402
from lmstack import sample_corpus  # noqa: E402
from lm.spec import shards  # noqa: E402
from lm import tokenizer as tokenizers_lib  # noqa: E402


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_prepare(raw, output, tokenizer_file, workers, seq_len):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "training_image"))
    command = [sys.executable, "-m", "lm.data.prepare", raw, "--output", output, "--tokenizer", tokenizer_file,
               "--seq-len", str(seq_len), "--workers", str(workers), "--threads", "1"]
    cpu, wall = children_cpu(), time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - wall, children_cpu() - cpu


def raw_tokenizer(tokenizer_file, texts):
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, as one worker runs
    tokenizer, _ = tokenizers_lib.load(tokenizer_file)
    cpu, wall = time.process_time(), time.perf_counter()
    encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, sum(len(encoding.ids) for encoding in encodings)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text-bytes", type=int, default=8 << 20, help="corpus size in text bytes")
    parser.add_argument("--files", type=int, default=4, help="input files (2 workers need at least 2)")
    parser.add_argument("--tokenizer", help="a tokenizers JSON file (default: train a 50257 BPE on the corpus)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=1, help="runs per variant; the fastest (wall) counts")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as work:
        raw = os.path.join(work, "raw")
        paths = sample_corpus.write_sample_corpus(raw, max_bytes=args.text_bytes, files=args.files)
        texts = [text for path in paths for text, _, _ in pile.Reader(path).documents()]
        text_bytes = sum(len(text.encode("utf-8")) for text in texts)
        tokenizer_file = args.tokenizer
        if not tokenizer_file:
            tokenizer_file = os.path.join(work, "tokenizer.json")
            tokenizers_lib.save(tokenizers_lib.train_bpe(texts), tokenizer_file)
        tiny = os.path.join(work, "tiny")
        sample_corpus.write_sample_corpus(tiny, max_bytes=4000, files=args.files)
        results = {"raw": [], "ours_x1": [], "ours_x2": [], "startup_x1": [], "startup_x2": []}
        ratio = None
        for repeat in range(args.repeats):
            wall, cpu, tokens = raw_tokenizer(tokenizer_file, texts)
            results["raw"].append({"wall_s": wall, "cpu_s": cpu})
            for workers in (1, 2):
                output = os.path.join(work, "out-%d-%d" % (workers, repeat))
                wall, cpu = run_prepare(raw, output, tokenizer_file, workers, args.seq_len)
                results["ours_x%d" % workers].append({"wall_s": wall, "cpu_s": cpu})
                manifest = shards.load_manifest(output)
                ratio = sum(shard.bytes for shard in manifest.shards) / text_bytes
                wall, cpu = run_prepare(tiny, output + "-tiny", tokenizer_file, workers, args.seq_len)
                results["startup_x%d" % workers].append({"wall_s": wall, "cpu_s": cpu})
        vocab_size = tokenizers_lib.load(tokenizer_file)[0].get_vocab_size()

    best = {name: min(runs, key=lambda run: run["wall_s"]) for name, runs in results.items()}
    mb = text_bytes / 1e6
    report = {
        "text_mb": round(mb, 3), "documents": len(texts), "tokens": tokens, "files": args.files,
        "vocab_size": vocab_size, "seq_len": args.seq_len, "cpus": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2), "repeats": args.repeats,
        "variants": {name: {"wall_s": round(run["wall_s"], 3), "cpu_s": round(run["cpu_s"], 3),
                            "mb_per_s_wall": round(mb / run["wall_s"], 3), "mb_per_s_cpu": round(mb / run["cpu_s"], 3)}
                     for name, run in best.items()},
    }
    variants = report["variants"]
    report["ours_x1_vs_raw_wall"] = round(variants["ours_x1"]["mb_per_s_wall"] / variants["raw"]["mb_per_s_wall"], 3)
    report["ours_x1_vs_raw_cpu"] = round(variants["ours_x1"]["mb_per_s_cpu"] / variants["raw"]["mb_per_s_cpu"], 3)
    report["x2_speedup_wall"] = round(variants["ours_x1"]["wall_s"] / variants["ours_x2"]["wall_s"], 3)
    report["x2_per_worker_vs_raw_cpu"] = round(variants["ours_x2"]["mb_per_s_cpu"] / variants["raw"]["mb_per_s_cpu"], 3)
    for workers in (1, 2):
        name, startup = "ours_x%d" % workers, best["startup_x%d" % workers]
        variants[name]["mb_per_s_cpu_steady"] = round(mb / (best[name]["cpu_s"] - startup["cpu_s"]), 3)
        variants[name]["mb_per_s_wall_steady"] = round(mb / (best[name]["wall_s"] - startup["wall_s"]), 3)
    report["ours_x1_vs_raw_cpu_steady"] = round(
        variants["ours_x1"]["mb_per_s_cpu_steady"] / variants["raw"]["mb_per_s_cpu"], 3)
    report["x2_speedup_wall_steady"] = round(
        variants["ours_x2"]["mb_per_s_wall_steady"] / variants["ours_x1"]["mb_per_s_wall_steady"], 3)
    # Wall speedup needs two idle cores; CPU time per MB shows whether the workers slow each other.
    report["x2_vs_x1_cpu_steady"] = round(
        variants["ours_x2"]["mb_per_s_cpu_steady"] / variants["ours_x1"]["mb_per_s_cpu_steady"], 3)
    report["bytes_ratio"] = round(ratio, 4)
    report["targets"] = {"ours_x1_vs_raw >= 0.9": report["ours_x1_vs_raw_wall"] >= 0.9,
                         "x2_speedup >= 1.7": report["x2_speedup_wall"] >= 1.7,
                         "bytes_ratio <= 0.55": report["bytes_ratio"] <= 0.55}

    print("%-8s %8s %8s %12s %12s" % ("variant", "wall s", "cpu s", "MB/s (wall)", "MB/s (cpu)"))
    for name, run in variants.items():
        print("%-8s %8.2f %8.2f %12.3f %12.3f" % (name, run["wall_s"], run["cpu_s"], run["mb_per_s_wall"],
                                                 run["mb_per_s_cpu"]))
    print("ours x1 / raw: %.3f (wall), %.3f (cpu), %.3f (cpu, steady); x2 speedup: %.3f (wall), %.3f (wall, steady);"
          " bytes ratio %.4f; load %.2f on %d cpus"
          % (report["ours_x1_vs_raw_wall"], report["ours_x1_vs_raw_cpu"], report["ours_x1_vs_raw_cpu_steady"],
             report["x2_speedup_wall"], report["x2_speedup_wall_steady"], report["bytes_ratio"],
             report["load_average_1min"], report["cpus"]))
    publish("prepare", report)
    return report


if __name__ == "__main__":
    main()
