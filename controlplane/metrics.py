"""The metrics SageMaker reads from a training job's log: the request's MetricDefinitions, and the same
regexes applied here (`parse_metrics`: the demo's report and the tests read a log as SageMaker would).

The lines they read are the image's: `lm.spec.job.format_train_log`, `format_eval_log`,
`format_divergence_log`, `format_goodput_log`, `format_goodput_start_log` and `format_checkpoint_log`
("[train]", "[eval]", "[divergence]", "[goodput]", "[checkpoint]"), and `lm.training.gpu_usage` ("[gpu]");
the dashboard's metric names are these `Name`s. The evaluation job's definitions (`evaluation_definitions`) depend
on its tasks: the gate makes them for each run.
"""
import re

from lm.spec import evaluation, job

_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"

METRIC_DEFINITIONS = [
    {"Name": "train:loss", "Regex": r"\[train\].* loss=" + _NUMBER},
    {"Name": "train:learning_rate", "Regex": r"\[train\].* lr=" + _NUMBER},
    {"Name": "train:tokens_per_second", "Regex": r"\[train\].* tokens_per_s=" + _NUMBER},
    {"Name": "train:mfu", "Regex": r"\[train\].* mfu=" + _NUMBER},
    {"Name": "train:step_time", "Regex": r"\[train\].* step_time=" + _NUMBER},
    {"Name": "validation:loss", "Regex": r"\[eval\].* val_loss=" + _NUMBER},
    {"Name": "validation:perplexity", "Regex": r"\[eval\].* val_ppl=" + _NUMBER},
    # lm.training.divergence: the run's counts so far, at each skipped step and rollback.
    {"Name": "train:skipped_steps", "Regex": r"\[divergence\].* skipped_steps=" + _NUMBER},
    {"Name": "train:rollbacks", "Regex": r"\[divergence\].* rollbacks=" + _NUMBER},
    # lm.training.gpu_usage: the mean over a host's GPUs (SageMaker's GPUUtilization is their sum).
    {"Name": "gpu:utilization_per_gpu", "Regex": r"\[gpu\] utilization_per_gpu=" + _NUMBER},
    {"Name": "checkpoint:save_seconds", "Regex": r"\[checkpoint\].* save_seconds=" + _NUMBER},
    {"Name": "checkpoint:interval_seconds", "Regex": r"\[checkpoint\].* interval_seconds=" + _NUMBER},
] + [{"Name": "goodput:" + name, "Regex": r"\[goodput\] .*\b%s=" % name + _NUMBER}
      for name in job.GOODPUT_START + job.GOODPUT_TOTALS]  # no name ends another after an underscore


EVALUATION_METRIC_PREFIX = "evaluation:"


def evaluation_definitions(labels):
    """The evaluation job's MetricDefinitions: `evaluation:<label>` for each label (an evaluate.tasks entry, or
    lm.spec.evaluation.PILE_BPB_LABEL), read from its `lm.spec.evaluation.format_score_log` line."""
    return [{"Name": EVALUATION_METRIC_PREFIX + label,
             "Regex": r"%s %s: [^=]+=" % (re.escape(evaluation.LOG_PREFIX), re.escape(label)) + _NUMBER}
            for label in labels]


def parse_metrics(line, definitions=METRIC_DEFINITIONS):
    """What SageMaker would extract from one log line: {metric name: value}."""
    found = {}
    for definition in definitions:
        match = re.search(definition["Regex"], line)
        if match:
            found[definition["Name"]] = float(match.group(1))
    return found
