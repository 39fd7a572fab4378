"""Demo step: the evaluation job of the execution's evaluate stage, run by the real SageMaker training toolkit on
this machine, as `lmstack.demo_train` runs the training job.

The execution input asks for the evaluate stage (`execution_input_fields`) with two tasks the demo makes from its
own corpus (`write_tasks`; no download): lm-eval task YAMLs and their JSON lines in a local directory that stands
for evaluate.data_s3_uri,

- `demo_next_line.yaml`, multiple choice: the line of Python source that follows a context, among four (the others
  are lines of other documents); lm-eval's `acc`;
- `demo_line_completion.yaml`, generation: the rest of a line of Python source after its first half, greedy until
  the line ends; lm-eval's `exact_match`.

The job's request (the one the state machine made) gets one local host: its channels are the dataset (its validation
documents give the per-source bits per byte), a directory holding the exported model as model.tar.gz (the training
job's output) and the tasks directory. The toolkit runs training_image/evaluate.py; its results JSON and the score
lines SageMaker's MetricDefinitions read come back, and the table goes to the terminal and report.md.
"""
import json
import os
import random
import sys
import tarfile

from controlplane import bucket_layout, metrics
from lm.spec import contract, shards
from lmstack.demo_run import StepError, environment, run_logged
from lmstack.demo_train import build_tree, local_path

NEXT_LINE = "demo_next_line"
LINE_COMPLETION = "demo_line_completion"
TASK_FILES = (NEXT_LINE + ".yaml", LINE_COMPLETION + ".yaml")
CHOICES = 4
CONTEXT_LINES = 3
MIN_LINE_CHARACTERS = 20
MAX_GENERATED_TOKENS = 32
SEED = 0
RUN_TIMEOUT_SECONDS = 900


def execution_input_fields(name_prefix, examples):
    """The demo input's evaluate object: the demo's own tasks, at most `examples` each, on a CPU type."""
    return {"enabled": True, "tasks": list(TASK_FILES), "limit": examples, "instance_type": "ml.m5.xlarge",
            # the stand-in artifact bucket (lmstack.local_sfn.stand_in_values); `write_tasks` fills its local copy
            "data_s3_uri": "s3://%s-artifacts/%sdemo/" % (name_prefix, bucket_layout.TASK_DATA_PREFIX)}


def code_lines(documents):
    """[(document index, line index, lines)] of every Python source line worth asking about: long enough, with
    CONTEXT_LINES lines before it that are not all blank."""
    found = []
    for index, document in enumerate(documents):
        if document["meta"].get("pile_set_name") != "Github":
            continue
        lines = document["text"].split("\n")
        for number in range(CONTEXT_LINES, len(lines)):
            # a context of blank lines would be none at all: lm-eval moves a context's trailing whitespace
            # to the continuation
            context = "".join(lines[number - CONTEXT_LINES:number]).strip()
            if len(lines[number].strip()) >= MIN_LINE_CHARACTERS and context:
                found.append((index, number, lines))
    return found


def next_line_examples(found, count, rng):
    """Multiple choice: the context lines, the true next line among CHOICES lines of other documents."""
    examples = []
    for index, number, lines in rng.sample(found, min(count, len(found))):
        others = sorted({other[line] for doc, line, other in found if doc != index} - {lines[number]})
        if len(others) < CHOICES - 1:
            continue
        distractors = rng.sample(others, CHOICES - 1)
        choices = distractors + [lines[number]]
        rng.shuffle(choices)
        examples.append({"context": "\n".join(lines[number - CONTEXT_LINES:number]) + "\n", "choices": choices,
                         "label": choices.index(lines[number])})
    return examples


def completion_examples(found, count, rng):
    """Generation: the context lines and the first half of a line; the answer is the rest of it."""
    examples = []
    for _, number, lines in rng.sample(found, min(count, len(found))):
        line = lines[number]
        cut = len(line) // 2
        examples.append({"context": "\n".join(lines[number - CONTEXT_LINES:number] + [line[:cut]]),
                         "answer": line[cut:]})
    return examples


def task_config(name, output_type, **fields):
    """An lm-eval task over the JSON lines `<name>.jsonl` next to it (paths relative to the tasks' data: the job
    runs there). JSON is YAML, so the YAML file is written as JSON."""
    config = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": name + ".jsonl"}},
              "test_split": "test", "output_type": output_type, "doc_to_text": "{{context}}"}
    config.update(fields)
    return config


def write_tasks(documents, directory, count):
    """The two tasks (YAML and JSON lines) in `directory`; {task name: examples}."""
    found = code_lines(documents)
    rng = random.Random(SEED)
    tasks = {
        NEXT_LINE: (next_line_examples(found, count, rng), task_config(
            NEXT_LINE, "multiple_choice", doc_to_choice="{{choices}}", doc_to_target="{{label}}",
            metric_list=[{"metric": "acc", "aggregation": "mean", "higher_is_better": True}])),
        LINE_COMPLETION: (completion_examples(found, count, rng), task_config(
            LINE_COMPLETION, "generate_until", doc_to_target="{{answer}}",
            generation_kwargs={"until": ["\n"], "max_gen_toks": MAX_GENERATED_TOKENS, "do_sample": False},
            metric_list=[{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}])),
    }
    for name, (examples, _) in tasks.items():
        if not examples:
            raise StepError("the validation documents hold too few lines of Python source (%d, in %d documents) to "
                            "make task %s" % (len(found), len({doc for doc, _, _ in found}), name))
    os.makedirs(directory, exist_ok=True)
    for name, (examples, config) in tasks.items():
        shards.write_atomically(os.path.join(directory, name + ".jsonl"),
                                "".join(json.dumps(example) + "\n" for example in examples))
        shards.write_atomically(os.path.join(directory, name + ".yaml"), json.dumps(config, indent=2) + "\n")
    return {name: len(examples) for name, (examples, _) in tasks.items()}


def read_documents(dataset):
    documents = []
    for path in shards.val_documents_files(dataset):
        with open(path, encoding="utf-8") as handle:
            documents.extend(json.loads(line) for line in handle if line.strip())
    return documents


def model_archive(model_dir, directory):
    """The exported model as the training job's model.tar.gz (its files at the top), in `directory`."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "model.tar.gz")
    with tarfile.open(path, "w:gz") as archive:
        for name in sorted(os.listdir(model_dir)):
            archive.add(os.path.join(model_dir, name), arcname=name)
    return directory


def evaluate(request, dataset, model_dir, out_dir, examples):
    """Run the evaluation job of `request` on one local host; {"results", "metrics", "tasks", "log", "results_file"}."""
    base = os.path.join(out_dir, "evaluation")
    tasks = write_tasks(read_documents(dataset), os.path.join(base, "tasks"), examples)
    channels = {contract.TRAIN_CHANNEL: dataset, contract.MODEL_CHANNEL: model_archive(model_dir, os.path.join(
        base, "model")), contract.TASKS_CHANNEL: os.path.join(base, "tasks")}
    host = build_tree(os.path.join(base, "host"), "algo-1", request, channels)
    program = json.loads(request["HyperParameters"]["sagemaker_program"])
    env = environment(SAGEMAKER_BASE_DIR=host, SAGEMAKER_PROGRAM=program,
                      SAGEMAKER_SUBMIT_DIRECTORY=os.path.join(host, "code"), SM_STUDIO_LOCAL_MODE="true",
                      TMPDIR=os.path.join(host, "tmp"), HF_HOME=os.path.join(base, "huggingface"))
    os.makedirs(env["TMPDIR"], exist_ok=True)
    log = run_logged([sys.executable, "-m", "sagemaker_training.cli.train"], os.path.join(out_dir, "logs", "evaluate.log"),
                     "the evaluation job (%s) through the SageMaker training toolkit" % program, env=env, cwd=host,
                     timeout=RUN_TIMEOUT_SECONDS)
    results_file = os.path.join(local_path(host, contract.OUTPUT_DATA_DIR), contract.EVALUATION_RESULTS_FILE)
    with open(results_file) as handle:
        results = json.load(handle)
    found = {}
    with open(log, errors="replace") as handle:  # what SageMaker's MetricDefinitions read from the job's log
        for line in handle:
            found.update(metrics.parse_metrics(line, request["AlgorithmSpecification"]["MetricDefinitions"]))
    return {"results": results, "metrics": found, "tasks": tasks, "log": log, "results_file": results_file}


def table_lines(evaluation):
    """The report's tables: bits per byte per source, then each task's metrics."""
    results = evaluation["results"]
    lines = ["| source | documents | tokens | UTF-8 bytes | bits per byte |", "|---|---|---|---|---|"]
    bpb = results["pile_bpb"]
    for name, figures in sorted(bpb["sources"].items()) + [("**total**", bpb["total"])]:
        lines.append("| %s | %s | %s | %s | %.4f |" % (name, figures.get("documents", ""), figures.get("tokens", ""),
                                                       figures.get("bytes", ""), figures["bits_per_byte"]))
    lines += ["", "| task | examples | metric | value |", "|---|---|---|---|"]
    for key, value in sorted(results["headline"].items()):
        task, _, metric = key.partition("/")
        if task in evaluation["tasks"]:
            lines.append("| %s | %d | %s | %.4f |" % (task, evaluation["tasks"][task], metric, value))
    return lines
