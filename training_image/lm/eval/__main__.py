"""python -m lm.eval --model-dir DIR [--tasks a,b] [--include-path DIR] [--limit N]
[--documents FILE.jsonl] [--batch-size N] --output FILE.json

Evaluates an lmstack export or a Hugging Face directory on lm-eval tasks and on per-source bits per
byte, writes the results JSON (lm.eval's module docstring) and prints the headline numbers.
"""
import argparse
import json
import os
import sys

from lm.eval import DEFAULT_BATCH_SIZE, run


def _limit(text):
    """lm-eval's limit: a count of examples per task (>= 1) or a fraction of them (0 < x < 1)."""
    try:
        value = float(text)
    except ValueError:
        value = 0
    if not (value >= 1 and value == int(value)) and not 0 < value < 1:
        raise argparse.ArgumentTypeError("--limit must be an integer >= 1 or a fraction in (0, 1), got %r" % text)
    return int(value) if value >= 1 else value


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m lm.eval", description=__doc__.split("\n\n")[1])
    parser.add_argument("--model-dir", required=True, help="an lmstack export (model.json) or a Hugging Face "
                        "directory lm.hf imports (config.json)")
    parser.add_argument("--tasks", default="", help="comma-separated lm-eval task names or task YAML files")
    parser.add_argument("--include-path", help="a directory of task YAML files (lm-eval's --include_path)")
    parser.add_argument("--limit", type=_limit, help="examples per task (or a fraction of them)")
    parser.add_argument("--documents", help="JSONL documents {text, meta: {pile_set_name}} for bits per byte "
                        "per source, or a dataset directory lm.data.prepare wrote (its validation documents)")
    parser.add_argument("--batch-size", default=DEFAULT_BATCH_SIZE, type=int, help="rows per forward pass")
    parser.add_argument("--output", required=True, help="the results JSON file to write")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    tasks = [task for task in args.tasks.split(",") if task]
    if not tasks and not args.documents:
        build_parser().error("nothing to evaluate: give --tasks, --documents or both")
    results = run(args.model_dir, tasks, args.include_path, args.limit, args.documents, args.batch_size)
    directory = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(directory, exist_ok=True)
    partial = args.output + ".partial"
    with open(partial, "w") as handle:
        json.dump(results, handle, indent=2, sort_keys=True, default=str)
    os.replace(partial, args.output)
    for name, value in results["headline"].items():
        print("%-40s %.6f" % (name, value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
