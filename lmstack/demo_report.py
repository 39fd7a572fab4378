"""Demo step: `report.md` with the loss curve across the interruption, the steps it lost,
throughput, the data bytes ratio, the evaluation's tables and where every artifact is."""
import os
import re
import statistics
from importlib import metadata

from controlplane import bill
from controlplane import metrics as log_metrics
from lm.spec import job
from lm.spec import shards
from lmstack import demo_evaluate

STEP = re.compile(r"\bstep=(\d+)\b")


def train_points(log_text):
    """[(step, {metric: value})] of the `[train]` lines of a log, as SageMaker's regexes read them."""
    points = []
    for line in log_text.splitlines():
        if job.TRAIN_LOG_PREFIX not in line:
            continue
        line = line[line.index(job.TRAIN_LOG_PREFIX):]
        match = STEP.search(line)
        metrics = log_metrics.parse_metrics(line)
        if match and "train:loss" in metrics:
            points.append((int(match.group(1)), metrics))
    return points


def divergence_counts(log_text):
    """(skipped steps, rollbacks) of the run so far, from the last `[divergence]` line of a log (lm.training.divergence
    logs one at the end of training); None without one."""
    counts = None
    for line in log_text.splitlines():
        metrics = log_metrics.parse_metrics(line)
        if "train:rollbacks" in metrics:
            counts = int(metrics["train:skipped_steps"]), int(metrics["train:rollbacks"])
    return counts


def data_ratio(dataset_dir):
    """(shard bytes, text bytes, tokens) of a dataset, from its manifest."""
    manifest = shards.load_manifest(dataset_dir)
    shard_bytes = sum(shard.bytes for shard in manifest.shards)
    text_bytes = sum(values["text_bytes"] for values in manifest.inputs.values())
    tokens = sum(values["tokens"] for values in manifest.inputs.values())
    return shard_bytes, text_bytes, tokens


def plot_loss(attempts, resume_step, path, title):
    """attempts: [(label, [(step, metrics)])]; a vertical line where the second attempt resumed."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4))
    for (label, points), marker in zip(attempts, ("o", "s")):
        axes.plot([step for step, _ in points], [metrics["train:loss"] for _, metrics in points],
                  marker=marker, markersize=3, label=label)
    axes.axvline(resume_step, color="grey", linestyle="--", label="resumed from the checkpoint of step %d" % resume_step)
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    tmp = path + ".tmp.png"
    figure.savefig(tmp, dpi=100)
    pyplot.close(figure)
    os.replace(tmp, path)
    return path


def median_tokens_per_second(points):
    """The median over log windows, leaving out each attempt's first (it includes tracing)."""
    values = [metrics["train:tokens_per_second"] for _, metrics in points[1:]]
    return statistics.median(values) if values else float("nan")


def lm_eval_version():
    return metadata.version("lm_eval")


# The parts of the billed time, in the report's order: (label, the job's total it is, or None: the rest).
GOODPUT_PARTS = (("kept steps", "kept_step_seconds"), ("start-up of the training processes", "startup_seconds"),
                 ("checkpoint saves", "save_seconds"), ("redone steps (lost to the interruption)", "redone_seconds"),
                 ("evaluation", "eval_seconds"), ("the end (export, after the last step)", "end_seconds"),
                 ("outside the job's count (instances and toolkit before the process; after its last count before "
                  "the kill)", None))


def final_metrics(log_text):
    """What SageMaker's FinalMetricDataList would hold for a log: each metric's last value."""
    found = {}
    for line in log_text.splitlines():
        found.update(log_metrics.parse_metrics(line))
    return [{"MetricName": name, "Value": value} for name, value in found.items()]


def goodput(training, request):
    """The job's bill (`controlplane.bill`, at the table's price, the demo's billed seconds) and where its billed
    time went: {"line": the bill's line, "parts": [(label, seconds)], "billed_seconds", "totals"}."""
    metrics = final_metrics(training["chief_logs"][1])
    totals = {entry["MetricName"].split(":", 1)[1]: entry["Value"] for entry in metrics
              if entry["MetricName"].startswith("goodput:")}
    billed = sum(training["billed_seconds"])
    resources = request["ResourceConfig"]
    line = bill.job_bill("train", {
        "name": request["TrainingJobName"], "status": "Completed", "instance_type": resources["InstanceType"],
        "instance_count": resources["InstanceCount"], "billable_seconds": billed, "training_seconds": billed,
        "metrics": metrics}, None)
    parts = [(label, totals[name] if name else billed - totals["process_seconds"]) for label, name in GOODPUT_PARTS]
    return {"line": line, "parts": parts, "billed_seconds": billed, "totals": totals}


def goodput_lines(found):
    line, totals, billed = found["line"], found["totals"], found["billed_seconds"]
    lines = ["## Where the billed time went (goodput)", "",
             "Billed: %.1f s per instance, the two attempts' hosts from start to end (SageMaker bills "
             "BillableTimeInSeconds x %d instances: %.1f instance-seconds, $%.4f at %s's $%.3f/h, %s)." % (
                 billed, line["instance_count"], line["billable_instance_seconds"], line["usd"],
                 line["instance_type"], line["usd_per_instance_hour"], line["price_source"]),
             "",
             "| part | seconds | share |", "|---|---|---|"]
    lines += ["| %s | %.2f | %.1f %% |" % (label, seconds, 100 * seconds / billed) for label, seconds in found["parts"]]
    lines += ["| **sum of the parts** | %.2f | %.1f %% |" % (sum(seconds for _, seconds in found["parts"]),
                                                           100 * sum(seconds for _, seconds in found["parts"]) / billed),
              "",
              "Goodput (time in kept steps / billed time): **%.1f %%**. Tokens trained %d, kept %d; steps redone %d; "
              "$%.4f per million kept tokens. The job's own count (the chief's `[goodput]` lines, SageMaker's final "
              "metrics) covers its processes; the rest of the billed time is outside it." % (
                  100 * line["goodput"], totals["trained_tokens"], totals["kept_tokens"], totals["redone_steps"],
                  line["usd_per_million_kept_tokens"])]
    return lines


def write_report(out_dir, dataset_dir, training, serving, synthesis, execution, timings, evaluation):
    attempts = [("attempt 1 (killed)", train_points(training["chief_logs"][0])),
                ("attempt 2 (resumed)", train_points(training["chief_logs"][1]))]
    request = execution["request"]
    hp = {name: job.decode_hyperparameter(value) for name, value in request["HyperParameters"].items()}
    png = plot_loss(attempts, training["resume_step"], os.path.join(out_dir, "loss.png"),
                    "%s, %s on %d hosts, one spot interruption" % (hp["preset"], hp["strategy"], len(training["hosts"])))
    shard_bytes, text_bytes, tokens = data_ratio(dataset_dir)
    lines = [
        "# lmstack demo report",
        "",
        "Training job `%s`: preset `%s`, strategy `%s`, %d local hosts (`%s` in the request), %d steps of %s "
        "sequences." % (request["TrainingJobName"], hp["preset"], hp["strategy"], request["ResourceConfig"]["InstanceCount"],
                        request["ResourceConfig"]["InstanceType"], training["max_steps"], hp["global_batch_size"]),
        "",
        "## Loss across the spot interruption",
        "",
        "![loss curve](%s)" % os.path.basename(png),
        "",
        "When the chief had logged step %d, every process of both hosts got SIGKILL at once, as a spot "
        "interruption reaches training processes on SageMaker (the toolkit does not forward SIGTERM; MPI "
        "workers are killed without a save): nothing saved at the kill. After the checkpoint sync the "
        "second attempt resumed from the last periodic checkpoint, step %d, and ran to step %d."
        % (training["killed_step"], training["resume_step"], training["max_steps"]),
        "",
        "**Lost steps: %d** (trained after the checkpoint of step %d and before the kill, so trained again; "
        "at least that many, since steps after the chief's last log line are lost too). Checkpoints are "
        "written every `checkpoint_every` = %s steps and every `checkpoint_minutes` = %s minutes of training."
        % (training["lost_steps"], training["resume_step"], hp["checkpoint_every"],
           hp.get("checkpoint_minutes", job.HYPERPARAMETERS["checkpoint_minutes"].default)),
        "",
        "| attempt | steps logged | first loss | last loss | median tokens/s |",
        "|---|---|---|---|---|",
    ]
    for label, points in attempts:
        lines.append("| %s | %d..%d | %.4f | %.4f | %.0f |" % (
            label, points[0][0], points[-1][0], points[0][1]["train:loss"], points[-1][1]["train:loss"],
            median_tokens_per_second(points)))
    counts = divergence_counts(training["chief_logs"][-1])
    lines += [
        "",
        "tokens/s: all workers together, from the `[train]` lines (CPU, 2 cores shared by both workers).",
        "",
        "Divergence defense (docs/execution.md): %s." % (
            "%d non-finite steps skipped, %d rollbacks" % counts if counts else "no `[divergence]` line in the log"),
        "",
    ]
    found = goodput(training, request)
    lines += goodput_lines(found)
    lines += [
        "",
        "## Data",
        "",
        "| text bytes | tokens | shard bytes | shard bytes / text bytes |",
        "|---|---|---|---|",
        "| %d | %d | %d | %.3f |" % (text_bytes, tokens, shard_bytes, shard_bytes / text_bytes),
        "",
        "(The seed's preprocessing made its data about 5x larger than the text.)",
        "",
        "## Evaluation",
        "",
        "The evaluation job `%s` (lm-eval %s on the exported model, through the SageMaker training toolkit): bits per "
        "UTF-8 byte of the validation documents per source, as the Pile paper reports them, and the demo's own "
        "tasks, made from those documents (lmstack.demo_evaluate)." % (
            execution["evaluation_request"]["TrainingJobName"], lm_eval_version()),
        "",
    ] + demo_evaluate.table_lines(evaluation) + [
        "",
        "## Inference",
        "",
    ]
    for prompt, generated in zip(serving["prompts"], serving["generations"]):
        lines.append("- `%r` -> `%r`" % (prompt, generated))
    lines += ["", "## Step times", "", "| step | seconds |", "|---|---|"]
    lines += ["| %s | %.1f |" % (name, seconds) for name, seconds in timings.items()]
    lines += ["", "## Artifacts", ""]
    artifacts = [
        ("corpus", os.path.join(out_dir, "corpus")),
        ("dataset (manifest, tokenizer, shards)", dataset_dir),
        ("state machine execution (input, states, CreateTrainingJob request, output)", execution["record"]),
        ("/opt/ml trees of the hosts", os.path.join(out_dir, "hosts")),
        ("checkpoints (the simulated S3 prefix)", training["checkpoints"]),
        ("exported model", training["model_dir"]),
        ("training logs", ", ".join(training["logs"])),
        ("evaluation results JSON", evaluation["results_file"]),
        ("evaluation log", evaluation["log"]),
        ("server log", serving["log"]),
        ("loss curve", png),
    ]
    if synthesis:
        artifacts += [("CloudFormation templates", ", ".join(synthesis["templates"])),
                      ("synth log", synthesis["log"])]
    lines += ["- %s: `%s`" % (what, where) for what, where in artifacts]
    path = os.path.join(out_dir, "report.md")
    shards.write_atomically(path, "\n".join(lines) + "\n")
    return {"report": path, "png": png, "data_ratio": shard_bytes / text_bytes, "goodput": found,
            "tokens_per_second": [median_tokens_per_second(points) for _, points in attempts],
            "attempts": attempts}
