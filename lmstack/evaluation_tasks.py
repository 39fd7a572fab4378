"""Generate controlplane/lm_eval_tasks.json, the names evaluate.tasks may give, from the installed lm-eval.

    .venv/bin/python -m lmstack.evaluation_tasks       # rewrites the file
    .venv/bin/python -m lmstack.evaluation_tasks --check   # exits 1 when the file differs

The gate (`controlplane.evaluation`) reads the file, so it needs no lm-eval (nor this module, which is not in
its Lambda function's code). The names are what lm-eval's
`TaskManager().all_tasks` lists (tasks, groups and tags: `lm_eval --tasks` takes each); tests/state_machine/
test_evaluate_gate.py regenerates them and compares when lm-eval is importable. After upgrading lm-eval, run
this and commit the file.
"""
import argparse
import json
import sys

from controlplane.evaluation import TASKS_FILE


def generate():
    """{"lm_eval_version", "tasks"} of the installed lm-eval (imported here only)."""
    from importlib import metadata

    from lm_eval.tasks import TaskManager
    return {"lm_eval_version": metadata.version("lm_eval"), "tasks": sorted(set(TaskManager().all_tasks))}


def text(found):
    return json.dumps(found, indent=0, sort_keys=True) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lmstack.evaluation_tasks", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the file instead of writing it")
    args = parser.parse_args(argv)
    found = text(generate())
    if args.check:
        with open(TASKS_FILE) as handle:
            same = handle.read() == found
        print("%s is %s" % (TASKS_FILE, "current" if same else "stale: run python -m lmstack.evaluation_tasks"))
        return 0 if same else 1
    with open(TASKS_FILE, "w") as handle:
        handle.write(found)
    print("wrote %d task names to %s" % (len(json.loads(found)["tasks"]), TASKS_FILE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
