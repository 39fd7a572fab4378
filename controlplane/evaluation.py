"""The evaluation stage's input (`evaluate.*`) and the gate's check of it.

After training and before deploy, with `evaluate.enabled`, the state machine runs an evaluation job
(`stacks.state_machine.evaluate`): lm-evaluation-harness (`lm.eval`, training_image/evaluate.py) on the
training job's model, the per-source bits per byte of the dataset's validation documents and the tasks of
`evaluate.tasks`. The gate refuses before any job what it can know (`check_evaluate`):

- a task entry that is neither one of lm-eval's built-in tasks (`TASK_NAMES`, the data file TASKS_FILE that
  `python -m lmstack.evaluation_tasks` generates from lm-eval, so the gate needs no lm-eval) nor a task
  YAML file (an entry ending in .yaml or .yml, a file at the top of evaluate.data_s3_uri);
- tasks without evaluate.data_s3_uri: the jobs' VPC has no internet, so every task's data is staged there: a
  built-in task's from a Hugging Face datasets cache (HF_DATASETS_CACHE_DIRECTORY), a YAML task's from the
  files its YAML names (docs/evaluation.md, "In the pipeline");
- an instance type whose memory cannot hold the model's forward passes (`inference_memory`);
- evaluate with a deploy-only run (nothing is trained to evaluate).

Its plan (`$.plan.evaluate`) holds what the state machine sends the job: the tasks as one argument, the limit,
the batch, the MetricDefinitions, the memory estimate and the price of the job's MaxRuntime.

Pure Python, no TensorFlow: shipped in the gate's Lambda function.
"""
import collections
import json
import os
import re

from controlplane import bucket_layout, metrics, planner, presets, prices, pricing
from lm.spec import evaluation
from lm.spec.fields import Field
from lm.spec.hardware import INSTANCES
from lm.spec.job import MAX_RUNTIME_SECONDS

TASKS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lm_eval_tasks.json")
# A GPU holds gpt-125m's evaluation with room to spare; evaluate.instance_type may be a CPU type for small models.
DEFAULT_INSTANCE_TYPE = "ml.g5.xlarge"
DEFAULT_MAX_RUNTIME_SECONDS = 4 * 3600
# CreateTrainingJob allows 40 MetricDefinitions (botocore: AlgorithmSpecification.MetricDefinitions, max 40):
# one per task and the bits per byte.
MAX_TASKS = 20
# The batch of the job's forward passes (lm.eval's --batch-size), which the memory estimate assumes.
BATCH_SIZE = 8
# Inside evaluate.data_s3_uri: a Hugging Face datasets cache for built-in tasks (HF_DATASETS_CACHE).
HF_DATASETS_CACHE_DIRECTORY = "hf_datasets"
# A task entry: lm-eval's task names are letters, digits and _ - . ( ); a YAML file's name the same, no path
# (and no TASK_SEPARATOR: the job gets the entries joined by it).
ENTRY = re.compile(r"^[A-Za-z0-9_.()-]+$")
TASK_DATA_PATH = "s3://<artifact bucket>/%s<name>/" % bucket_layout.TASK_DATA_PREFIX
# The state machine checks that the bucket is the stack's artifact bucket (S3 bucket names: 3-63 lower-case
# letters, digits, . and -), what the job role may read.
TASK_DATA = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/%s[^*?]+$" % re.escape(bucket_layout.TASK_DATA_PREFIX))
FIELD = "evaluate"


def fields(instance_types):
    """The fields of the execution input's `evaluate` object."""
    return (
        Field("enabled", bool, False, help="evaluate the trained model (lm.eval) after training, before deploy"),
        Field("tasks", object, (),
              help="lm-eval task names or task YAML files at the top of data_s3_uri; at most %d" % MAX_TASKS),
        Field("data_s3_uri", str, None, prefix="s3://", nullable=True,
              help="the tasks' data, staged under %s (task YAMLs and their files; a Hugging Face datasets cache in "
                   "%s/ for built-in tasks)" % (TASK_DATA_PATH, HF_DATASETS_CACHE_DIRECTORY)),
        Field("instance_type", str, DEFAULT_INSTANCE_TYPE, choices=instance_types,
              help="the evaluation job's instance type (a CPU type is allowed for small models)"),
        Field("max_runtime_seconds", int, DEFAULT_MAX_RUNTIME_SECONDS, 1, MAX_RUNTIME_SECONDS),
        Field("limit", int, None, 1, None, nullable=True, help="at most this many examples per task (lm-eval --limit)"),
    )


def load_task_names(path=TASKS_FILE):
    with open(path) as handle:
        return frozenset(json.load(handle)["tasks"])


TASK_NAMES = load_task_names()


class EvaluateError(ValueError):
    """The evaluate input cannot run; the message names the field and what it allows."""


def check_tasks(tasks):
    """The tasks as a list; EvaluateError naming the entry that is not a built-in task nor a YAML file."""
    if not isinstance(tasks, (list, tuple)) or len(tasks) > MAX_TASKS or not all(isinstance(t, str) for t in tasks):
        raise EvaluateError("evaluate.tasks must be a list of at most %d lm-eval task names or task YAML files, got %s"
                            % (MAX_TASKS, json.dumps(tasks)))
    if len(set(tasks)) != len(tasks):
        raise EvaluateError("evaluate.tasks names a task twice: %s" % json.dumps(tasks))
    for entry in tasks:
        if not ENTRY.match(entry):
            raise EvaluateError("evaluate.tasks entry %s must be an lm-eval task name or a YAML file name at the top of "
                                "data_s3_uri (letters, digits, _ - . ( ))" % json.dumps(entry))
        if not evaluation.is_task_file(entry) and entry not in TASK_NAMES:
            near = sorted(name for name in TASK_NAMES if name.startswith(entry.split("_")[0]))[:5]
            raise EvaluateError("evaluate.tasks entry %s is not one of lm-eval's tasks (%d of them, controlplane/%s)%s; "
                                "a task of your own is a YAML file in data_s3_uri, named here as <file>%s" % (
                                    json.dumps(entry), len(TASK_NAMES), os.path.basename(TASKS_FILE),
                                    "; similar: %s" % ", ".join(near) if near else "", evaluation.TASK_FILE_SUFFIXES[0]))
    return list(tasks)


def inference_memory(config, batch, seq_len):
    """Bytes the evaluation's peak takes (lm.eval in float32): the weights, a batch's logits and their log-softmax,
    the keys and values of every layer (generation's KV cache), and one block's activations (the planner's count,
    an upper bound for a forward pass that keeps nothing for a backward one)."""
    weights = 4 * planner.parameter_count(config)
    logits = 2 * 4 * batch * seq_len * config.padded_vocab_size
    keys_values = 2 * 4 * config.n_layer * batch * seq_len * config.d_model
    block = planner.layer_activation_bytes(config, batch, seq_len, 4)
    return collections.OrderedDict([("weights", weights), ("logits", logits), ("keys_values", keys_values),
                                    ("block", block), ("peak", weights + logits + keys_values + block)])


def check_memory(preset, instance_type):
    """(peak GiB, usable GiB) of the evaluation on one device of `instance_type` (a GPU, else the host);
    EvaluateError when the peak does not fit."""
    config = presets.ALL_PRESETS[preset]
    instance = INSTANCES[instance_type]
    peak = inference_memory(config, BATCH_SIZE, config.block_size)["peak"] / planner.GIB
    usable = planner.usable_bytes(instance) / planner.GIB
    if peak > usable:
        needed = inference_memory(config, BATCH_SIZE, config.block_size)["peak"]
        fitting = sorted((name for name, other in INSTANCES.items() if needed <= planner.usable_bytes(other)),
                         key=lambda name: (prices.on_demand_price(name) is None, prices.on_demand_price(name) or 0))
        raise EvaluateError("evaluate.instance_type %s cannot hold preset %s's evaluation: it needs %.1f GiB (float32 "
                            "weights, a batch of %d x %d tokens' logits and keys and values), %s has %.1f GiB usable%s" % (
                                instance_type, preset, peak, BATCH_SIZE, config.block_size, instance_type, usable,
                                "; the cheapest types that hold it: %s" % ", ".join(fitting[:4]) if fitting else ""))
    return peak, usable


def plan(config):
    """What the state machine sends the evaluation job and what it costs at most ($.plan.evaluate)."""
    evaluate = config[FIELD]
    labels = [evaluation.PILE_BPB_LABEL] + evaluate["tasks"]
    peak, usable = check_memory(config["preset"], evaluate["instance_type"])
    found = collections.OrderedDict([
        ("tasks", evaluation.TASK_SEPARATOR.join(evaluate["tasks"])),
        ("limit", evaluate["limit"] or 0), ("batch_size", BATCH_SIZE),
        ("metric_definitions", metrics.evaluation_definitions(labels)),
        ("memory_gib", round(peak, 2)), ("usable_gib", round(usable, 2))])
    return reprice(found, evaluate, pricing.from_table(evaluate["instance_type"], pricing.TRAINING,
                                                        prices.PRICE_REGION))


def reprice(summary, evaluate, price):
    """The evaluation's plan `summary` at `price` (a `controlplane.pricing.Price` for training): its hourly price,
    where it came from, and the most its MaxRuntime costs."""
    per_hour = price.usd_per_hour
    summary.update(usd_per_instance_hour=per_hour, price_source=price.source, price_region=price.region,
                   price_date=price.effective_date,
                   max_cost_usd=None if per_hour is None else round(max_cost_usd(evaluate, per_hour), 2))
    return summary


def max_cost_usd(evaluate, usd_per_hour):
    """The most the evaluation job costs: its one instance for its whole MaxRuntime (the plan and the budget)."""
    return usd_per_hour * evaluate["max_runtime_seconds"] / 3600


def check(config, deploy_only):
    """The plan of the evaluation `config` asks for (None without one); EvaluateError when it cannot run."""
    evaluate = config[FIELD]
    evaluate["tasks"] = check_tasks(evaluate["tasks"])  # a list, as JSON gives it back, enabled or not
    if not evaluate["enabled"]:
        return None
    if deploy_only:
        raise EvaluateError("evaluate.enabled with deploy.model_artifact: a deploy-only run trains no model to evaluate")
    if evaluate["data_s3_uri"] is not None and not TASK_DATA.match(evaluate["data_s3_uri"]):
        raise EvaluateError("evaluate.data_s3_uri must be a prefix %s (what the jobs may read), got %s" % (
            TASK_DATA_PATH, json.dumps(evaluate["data_s3_uri"])))
    if evaluate["tasks"] and evaluate["data_s3_uri"] is None:
        raise EvaluateError("evaluate.tasks %s need evaluate.data_s3_uri: the jobs' network has no internet, so each "
                            "task's data is staged under %s (docs/evaluation.md, \"In the pipeline\")" % (
                                ", ".join(evaluate["tasks"]), TASK_DATA_PATH))
    return plan(config)
