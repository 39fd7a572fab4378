"""What the evaluation job (training_image/evaluate.py) and the control plane must spell the same: its
arguments and the log lines SageMaker reads its metrics from (`controlplane.metrics.evaluation_definitions`).

Pure Python 3.8, no TensorFlow: imported at synth time and by the gate.
"""
LOG_PREFIX = "[evaluate]"
# The label of the per-source bits per byte of the validation documents (lm.eval's "pile_bpb/total").
PILE_BPB_LABEL = "pile_bpb"
TASK_FILE_SUFFIXES = (".yaml", ".yml")
# The job's arguments: the task entries joined by TASK_SEPARATOR (no entry holds one), at most `limit` examples
# per task (0: all), the batch of its forward passes.
TASKS_ARGUMENT = "tasks"
LIMIT_ARGUMENT = "limit"
BATCH_SIZE_ARGUMENT = "batch_size"
TASK_SEPARATOR = ","


def is_task_file(entry):
    """Whether an evaluate.tasks entry names a task YAML file (in the tasks' data) rather than a built-in task."""
    return entry.endswith(TASK_FILE_SUFFIXES)


def format_score_log(label, metric, value):
    """The line the job logs for one entry's score: `label` is the evaluate.tasks entry as given (or PILE_BPB_LABEL),
    `metric` the lm-eval metric it reports."""
    return "%s %s: %s=%.8g" % (LOG_PREFIX, label, metric, value)
