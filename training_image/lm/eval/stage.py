"""The evaluation job of the state machine's evaluate stage (`sagemaker_program = evaluate.py`).

Its channels (`lm.spec.contract`): `model`, the training job's model.tar.gz (extracted here), `train`, the
dataset on EFS (its validation documents, `lm.spec.shards.VAL_DOCUMENTS`, give the per-source bits per byte),
and with tasks `tasks`, their data (evaluate.data_s3_uri): task YAML files at its top, the files they name
(`dataset_kwargs.data_files` relative to it: the job runs there), and a Hugging Face datasets cache in
`hf_datasets/` for built-in tasks. The VPC has no internet: Hugging Face is told to stay offline.

It runs `lm.eval.run`, writes the results JSON to OUTPUT_DATA_DIR (SageMaker uploads it as output.tar.gz under
the execution's prefix), logs one score line per task and the bits per byte (the MetricDefinitions the gate
made read them: `lm.spec.evaluation.format_score_log`), and with MLflow configured logs the headline numbers
into the training job's run (`lm.training.tracking`).
"""
import argparse
import glob
import json
import os
import shutil
import sys
import tarfile

from lm.eval import run, task_names_and_paths
from lm.spec import contract, evaluation, shards
from lm.training import tracking

HF_DATASETS_CACHE_DIRECTORY = "hf_datasets"  # controlplane.evaluation.HF_DATASETS_CACHE_DIRECTORY
# Hugging Face's own switches: no download, the staged cache only.
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
MODEL_ARCHIVE = "model.tar.gz"


def channel(name, environ):
    return environ.get(contract.channel_environment_variable(name))


def build_parser():
    parser = argparse.ArgumentParser(prog="evaluate.py", description="The evaluate stage's job (lm.eval.stage).")
    parser.add_argument("--" + evaluation.TASKS_ARGUMENT, dest="tasks", default="",
                        help="evaluate.tasks joined by %r" % evaluation.TASK_SEPARATOR)
    parser.add_argument("--" + evaluation.LIMIT_ARGUMENT, dest="limit", type=int, default=0,
                        help="examples per task (0: all)")
    parser.add_argument("--" + evaluation.BATCH_SIZE_ARGUMENT, dest="batch_size", type=int, required=True)
    return parser


def extract_model(model_channel, into):
    """The training job's model.tar.gz of the model channel, extracted into `into` (returned)."""
    archives = glob.glob(os.path.join(model_channel, "**", MODEL_ARCHIVE), recursive=True)
    if len(archives) != 1:
        raise SystemExit("evaluate: the %s channel must hold one %s, found %d" % (
            contract.MODEL_CHANNEL, MODEL_ARCHIVE, len(archives)))
    os.makedirs(into, exist_ok=True)
    with tarfile.open(archives[0]) as archive:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.12: no links out, no absolute paths
            archive.extractall(into, filter="data")
        else:
            archive.extractall(into)
    return into


def validation_documents(dataset, into):
    """The dataset's validation documents (lm.data.prepare keeps them per input file) as one JSONL file `into`, or
    None for a dataset prepared before they were kept (no bits per byte then, and the log says so)."""
    files = shards.val_documents_files(dataset)
    if not files:
        print("evaluate: the dataset in %s keeps no validation documents (prepared before lm.data.prepare kept them): "
              "no bits per byte" % dataset, flush=True)
        return None
    with open(into, "wb") as joined:
        for path in files:
            with open(path, "rb") as handle:
                shutil.copyfileobj(handle, joined)
    return into


def task_entries(text, tasks_channel):
    """The evaluate.tasks entries, a YAML file's as its path in the tasks channel."""
    entries = [entry for entry in text.split(evaluation.TASK_SEPARATOR) if entry]
    if entries and tasks_channel is None:
        raise SystemExit("evaluate: tasks %s need the %s channel (evaluate.data_s3_uri)" % (
            ", ".join(entries), contract.TASKS_CHANNEL))
    return [(entry, os.path.join(tasks_channel, entry) if evaluation.is_task_file(entry) else entry)
            for entry in entries]


def scores(entries, headline):
    """(label, metric, value) of each entry's first headline metric, and the bits per byte's total."""
    found = []
    names, _ = task_names_and_paths([path for _, path in entries])
    for (label, _), name in zip(entries, names):
        keys = [key for key in headline if key.startswith(name + "/")]
        if keys:
            found.append((label, keys[0][len(name) + 1:], headline[keys[0]]))
    total = "%s/total" % evaluation.PILE_BPB_LABEL
    if total in headline:
        found.append((evaluation.PILE_BPB_LABEL, "bits_per_byte", headline[total]))
    return found


def main(argv=None, environ=None):
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    tasks_channel = channel(contract.TASKS_CHANNEL, environ)
    entries = task_entries(args.tasks, tasks_channel)
    environ.update(OFFLINE)
    if tasks_channel is not None:
        cache = os.path.join(tasks_channel, HF_DATASETS_CACHE_DIRECTORY)
        if os.path.isdir(cache):
            environ["HF_DATASETS_CACHE"] = cache
        os.chdir(tasks_channel)  # a task YAML's data_files are relative to evaluate.data_s3_uri
    scratch = environ.get("TMPDIR", "/tmp")
    model_dir = extract_model(channel(contract.MODEL_CHANNEL, environ), os.path.join(scratch, "lm-evaluated-model"))
    documents = validation_documents(channel(contract.TRAIN_CHANNEL, environ), os.path.join(
        scratch, "lm-validation-documents.jsonl"))
    results = run(model_dir, [path for _, path in entries], limit=args.limit or None, documents=documents,
                  batch_size=args.batch_size)
    output = environ.get("SM_OUTPUT_DATA_DIR", contract.OUTPUT_DATA_DIR)
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, contract.EVALUATION_RESULTS_FILE), "w") as handle:
        json.dump(results, handle, indent=2, sort_keys=True, default=str)
    for label, metric, value in scores(entries, results["headline"]):
        print(evaluation.format_score_log(label, metric, value), flush=True)
    tracker = tracking.start({"tasks": args.tasks, "limit": args.limit}, {}, print, environ)
    if tracker is not None:
        # MLflow's metric names take no comma (lm-eval's "exact_match,strict-match")
        tracker.metrics(0, "evaluation", {key.replace(",", "_"): value for key, value in results["headline"].items()})
        tracker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
