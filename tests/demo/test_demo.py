"""`make demo` (lmstack.demo): every step end to end on a small budget, and a failing step
stopping the demo with its name.

Nothing here is a fake except what the demo itself documents: moto's Step Functions engine
executes the shipped definition (its parse kept, its waits shortened), and a local directory
stands for the checkpoint S3 prefix.
"""
import json
import os

import pytest

from lm.spec import job
from lm.serving.export import load_exported
from lm.spec import shards
from lmstack import demo, demo_evaluate, demo_report, demo_train

# Killed once step 15 is logged (every 5 steps), resumed from the checkpoint of step 10: max_steps 25 still leaves
# a logged step after the kill's before the end.
SMALL = dict(corpus_bytes=600000, max_steps=25, interrupt_at=15, checkpoint_every=10, synth=False,
             prompts=("def main(", "The Python"), max_new_tokens=8, evaluation_examples=8)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    settings = demo.DemoSettings(output=str(tmp_path_factory.mktemp("demo-output")), **SMALL)
    return settings, demo.run(settings)


@pytest.mark.slow
def test_the_training_request_comes_from_the_state_machine(finished):
    settings, results = finished
    execution = results["state machine"]
    states = execution["states"]
    assert states[0] == "Validate" and states[-1] == "Outputs.Trained"
    assert "Train.Create" in states and "Train.Request.mwms" in states
    request = execution["request"]
    assert request["ResourceConfig"]["InstanceCount"] == 2
    assert request["HyperParameters"]["sagemaker_multi_worker_mirrored_strategy_enabled"] == "true"
    assert request["HyperParameters"]["max_steps"] == str(SMALL["max_steps"])
    with open(execution["record"]) as handle:
        assert json.load(handle)["request"] == request
    # The hosts ran on exactly those hyperparameters, as the toolkit reads them.
    tree = os.path.join(settings.output, "hosts", "attempt-2", "algo-2", "input", "config")
    with open(os.path.join(tree, "hyperparameters.json")) as handle:
        assert json.load(handle) == request["HyperParameters"]
    with open(os.path.join(tree, "resourceconfig.json")) as handle:
        assert json.load(handle)["hosts"] == ["algo-1", "algo-2"]


@pytest.mark.slow
def test_training_is_killed_and_resumes_from_the_last_periodic_checkpoint(finished):
    settings, results = finished
    training = results["train"]
    start, killed = training["resume_step"], training["killed_step"]
    assert SMALL["interrupt_at"] <= killed < SMALL["max_steps"]
    assert 0 < start <= killed and start % SMALL["checkpoint_every"] == 0
    assert training["lost_steps"] == killed - start
    assert "ckpt-%08d.npz" % start in training["synced_checkpoints"]
    before = [step for step, _ in demo_report.train_points(training["chief_logs"][0])]
    after = [step for step, _ in demo_report.train_points(training["chief_logs"][1])]
    assert before and max(before) == killed  # killed, not stopped: no save, no exit message
    assert "SIGTERM" not in training["chief_logs"][0] and "exported the model" not in training["chief_logs"][0]
    log_every = int(results["state machine"]["request"]["HyperParameters"]["log_every"])
    assert start < after[0] <= start + log_every and after[-1] == SMALL["max_steps"]
    assert after == sorted(set(after))
    model, config, tokenizer = load_exported(training["model_dir"])
    assert config.vocab_size == 512 and config.n_layer == 2
    for log in training["logs"][2:]:  # the other host: no metric lines, no export
        with open(log) as handle:
            assert job.TRAIN_LOG_PREFIX not in handle.read()
    assert not os.listdir(os.path.join(settings.output, "hosts", "attempt-2", "algo-2", "model"))


@pytest.mark.slow
def test_the_evaluation_job_of_the_execution_scores_the_model_and_the_report_shows_it(finished):
    settings, results = finished
    execution, evaluation = results["state machine"], results["evaluate"]
    assert execution["states"].index("Evaluate.Done") > execution["states"].index("Train.Succeeded")
    request = execution["evaluation_request"]
    assert json.loads(request["HyperParameters"]["sagemaker_program"]) == "evaluate.py"
    assert json.loads(request["HyperParameters"]["tasks"]) == ",".join(demo_evaluate.TASK_FILES)
    assert execution["output"]["evaluation"]["job_name"] == request["TrainingJobName"]
    headline = evaluation["results"]["headline"]
    # What SageMaker's MetricDefinitions read from the job's log is what its results JSON says.
    assert evaluation["metrics"] == pytest.approx({
        "evaluation:demo_next_line.yaml": headline["demo_next_line/acc"],
        "evaluation:demo_line_completion.yaml": headline["demo_line_completion/exact_match"],
        "evaluation:pile_bpb": headline["pile_bpb/total"]}, rel=1e-6)
    assert evaluation["tasks"] == {demo_evaluate.NEXT_LINE: 8, demo_evaluate.LINE_COMPLETION: 8}
    bpb = evaluation["results"]["pile_bpb"]
    manifest = shards.load_manifest(results["prepare"]["dataset"])
    assert {name: figures["bytes"] for name, figures in bpb["sources"].items()} == {
        name: figures["text_bytes"] for name, figures in manifest.val_sources.items()}
    # every source of the sample corpus (lmstack.sample_corpus), prose and code
    assert sorted(bpb["sources"]) == ["Github", "Pile-CC"]
    assert 0 < headline["pile_bpb/total"] < 9 and 0 <= headline["demo_next_line/acc"] <= 1
    with open(results["report"]["report"]) as handle:
        text = handle.read()
    assert "| demo_next_line | 8 | acc | %.4f |" % headline["demo_next_line/acc"] in text
    assert "| **total** | %d |" % bpb["total"]["documents"] in text


@pytest.mark.slow
def test_the_server_answered_and_the_report_is_written(finished):
    settings, results = finished
    serving = results["serve"]
    assert len(serving["generations"]) == len(SMALL["prompts"])
    for prompt, text in zip(SMALL["prompts"], serving["generations"]):
        assert isinstance(text, str) and text.strip()
    written = results["report"]
    with open(written["png"], "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(written["report"]) as handle:
        text = handle.read()
    assert "loss.png" in text and "shard bytes / text bytes" in text
    assert "**Lost steps: %d**" % results["train"]["lost_steps"] in text
    assert results["train"]["model_dir"] in text
    shard_bytes, text_bytes, _ = demo_report.data_ratio(results["prepare"]["dataset"])
    assert written["data_ratio"] == pytest.approx(shard_bytes / text_bytes)
    assert 0 < written["data_ratio"] < 5
    assert all(value > 0 for value in written["tokens_per_second"])


@pytest.mark.slow
def test_the_reports_goodput_table_adds_up_to_the_billed_time(finished):
    settings, results = finished
    found = results["report"]["goodput"]
    training, totals = results["train"], found["totals"]
    billed = sum(training["billed_seconds"])
    # every part but the last is the job's own count; the last is the billed time outside it
    assert sum(seconds for _, seconds in found["parts"]) == pytest.approx(billed, rel=0.01)
    assert all(seconds > 0 for _, seconds in found["parts"])
    assert totals["kept_steps"] == SMALL["max_steps"]
    # the job's count of lost steps: from its last progress record, at most the demo's (which reads the log)
    assert 0 < totals["redone_steps"] <= training["lost_steps"]
    assert totals["trained_tokens"] - totals["kept_tokens"] == pytest.approx(
        totals["redone_steps"] * totals["kept_tokens"] / totals["kept_steps"])
    assert found["line"]["goodput"] == pytest.approx(totals["kept_step_seconds"] / billed, abs=1e-4)
    with open(results["report"]["report"]) as handle:
        text = handle.read()
    assert "Goodput (time in kept steps / billed time): **%.1f %%**" % (100 * found["line"]["goodput"]) in text


def test_a_failing_step_stops_the_demo_and_names_it(tmp_path, capsys):
    status = demo.main(["--output", str(tmp_path), "--corpus-bytes", "2000", "--skip-synth"])
    captured = capsys.readouterr()
    assert status == 1
    assert "demo failed: step 'prepare' failed:" in captured.err
    assert "fewer than one global batch" in captured.err and "--corpus-bytes" in captured.err
    assert "[3/%d]" % len(demo.STEPS) not in captured.out, "no step after the failing one runs"


def test_an_unexpected_error_is_reported_with_the_step_name(tmp_path):
    ran = []

    def broken(settings, results):
        raise KeyError("manifest.json")

    steps = [("first", lambda settings, results: ran.append("first")), ("broken", broken),
             ("never", lambda settings, results: ran.append("never"))]
    with pytest.raises(demo.DemoFailed) as failure:
        demo.run(demo.DemoSettings(output=str(tmp_path)), steps)
    assert failure.value.step == "broken" and "KeyError" in failure.value.reason
    assert ran == ["first"]


def test_a_bad_interruption_step_and_foreign_paths_are_refused(tmp_path):
    request = {"ResourceConfig": {"InstanceCount": 2}, "HyperParameters": {"max_steps": "10"},
               "CheckpointConfig": {"S3Uri": "s3://bucket/checkpoints/demo/", "LocalPath": "/opt/ml/checkpoints"}}
    with pytest.raises(demo_train.StepError, match="interrupt_at must be between 1 and max_steps - 1"):
        demo_train.train(request, {}, str(tmp_path), interrupt_at=10)
    assert demo_train.local_path("/tmp/h", "/opt/ml/checkpoints") == "/tmp/h/checkpoints"
    assert demo_train.s3_path("/out/s3", "s3://bucket/checkpoints/demo/") == "/out/s3/bucket/checkpoints/demo"
    with pytest.raises(demo_train.StepError, match="not an s3:// URI"):
        demo_train.s3_path("/out/s3", "/local/path")
