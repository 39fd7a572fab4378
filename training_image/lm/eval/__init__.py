"""Evaluation as the field measures it: lm-evaluation-harness tasks on lmstack's model
(`lm.eval.model`, registered as `lmstack`) and bits per byte per source of the held-out documents
(`lm.eval.pile_bpb`). `python -m lm.eval` runs both and writes one JSON file:

    {"tasks": {task: lm-eval's results of the task}, "pile_bpb": {"sources": ..., "total": ...} or null,
     "headline": {"<task>/<metric>": number, "pile_bpb/total": number, "pile_bpb/<source>": number}}

lm-eval is imported only when tasks or documents are evaluated (see lm.eval.model).
"""
import math
import os

from lm.eval.scorer import DEFAULT_BATCH_SIZE

__all__ = ["DEFAULT_BATCH_SIZE", "headline", "run", "task_names_and_paths"]


def task_names_and_paths(tasks, include_path=None):
    """(task names, include paths) for lm-eval: a task given as a YAML file is the `task` it names,
    found through its directory; others are lm-eval task names or names in `include_path`."""
    names, paths = [], [include_path] if include_path else []
    for task in tasks:
        if task.endswith((".yaml", ".yml")):
            if not os.path.isfile(task):
                raise ValueError("tasks: %s: no such task YAML file" % task)
            names.append(_yaml_task_name(task))
            directory = os.path.dirname(os.path.abspath(task))
            if directory not in paths:
                paths.append(directory)
        else:
            names.append(task)
    return names, paths


def _yaml_task_name(path):
    import yaml

    class _Loader(yaml.SafeLoader):
        """Reads lm-eval's tags (!function ...) as plain values: only the task name is needed here."""

    _Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    with open(path) as handle:
        config = yaml.load(handle, Loader=_Loader) or {}
    name = config.get("task") if isinstance(config, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError("tasks: %s: a task YAML file needs a 'task' name" % path)
    return name


def run(model_dir, tasks=(), include_path=None, limit=None, documents=None, batch_size=DEFAULT_BATCH_SIZE):
    """Evaluate the model in `model_dir` on lm-eval `tasks` (names or task YAML files) and the
    documents JSONL file `documents`; returns {"tasks", "pile_bpb", "headline"} (see the module)."""
    from lm.eval.model import model_class
    from lm.eval.pile_bpb import pile_bpb

    lm = model_class()(pretrained=model_dir, batch_size=batch_size)
    results = {"tasks": {}, "pile_bpb": None}
    if tasks:
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        names, paths = task_names_and_paths(tasks, include_path)
        evaluated = simple_evaluate(model=lm, tasks=names, limit=limit, log_samples=False,
                                    task_manager=TaskManager(include_path=paths or None))
        results["tasks"] = evaluated["results"]
    if documents:
        results["pile_bpb"] = pile_bpb(lm.scorer, documents)
    results["headline"] = headline(results)
    return results


def headline(results):
    """{"<task>/<metric>": value} of every numeric metric, lm-eval's "metric,filter" keys (no standard
    errors, no sample counts; a filter other than
    lm-eval's "none" stays in the name: "exact_match,strict-match"), "pile_bpb/total" and
    "pile_bpb/<source>"."""
    flat = {}
    for task, metrics in sorted((results.get("tasks") or {}).items()):
        for key, value in sorted(metrics.items()):
            metric, comma, filter_name = key.partition(",")
            if not comma or metric.endswith("_stderr") or not _is_number(value):
                continue
            flat["%s/%s" % (task, metric if filter_name in ("", "none") else key)] = float(value)
    bpb = results.get("pile_bpb")
    if bpb:
        for name, figures in [("total", bpb["total"])] + sorted(bpb["sources"].items()):
            if figures["bits_per_byte"] is not None:
                flat["pile_bpb/%s" % name] = figures["bits_per_byte"]
    return flat


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
