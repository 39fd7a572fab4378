"""MLflow tracking from rank 0 (`lm.training.tracking`, issue 27 item 3), against a real `mlflow server`
on 127.0.0.1 with a file store, read back with MLflow's own client.

The training runs in `.venv-mlflow` (MLflow 2.22.1, which reads the project's TensorFlow and
numpy from `.venv`: see the Makefile): the training image's `.venv` has no mlflow, as the older
DLCs have none, and there tracking is off with a log line.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request

import pytest

from lm.spec import shards
from lm.training import tracking

from . import helpers

VENV_MLFLOW = os.path.join(helpers.ROOT, ".venv-mlflow", "bin")
SERVER_START_SECONDS = 60


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    if not os.path.exists(os.path.join(VENV_MLFLOW, "mlflow")):
        pytest.fail(".venv-mlflow is missing: run `make setup`")
    store = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    uri = "http://127.0.0.1:%d" % port
    server = subprocess.Popen(
        [os.path.join(VENV_MLFLOW, "mlflow"), "server", "--backend-store-uri", str(store / "runs"),
         "--default-artifact-root", str(store / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            try:
                with urllib.request.urlopen(uri + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not answer on %s within %d s" % (uri, SERVER_START_SECONDS))
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


# MLflow's client, run in .venv-mlflow: (uri, experiment, run name) -> the runs' params, tags, metrics.
READ_RUNS = """
import json, sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
experiment = client.get_experiment_by_name(sys.argv[2])
runs = client.search_runs([experiment.experiment_id], "attributes.run_name = '%s'" % sys.argv[3])
print(json.dumps([{"id": r.info.run_id, "status": r.info.status, "params": r.data.params, "tags": r.data.tags,
                   "metrics": {k: [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, k)]
                               for k in r.data.metrics}} for r in runs]))
"""


def _runs(uri, experiment, run_name):
    output = subprocess.run([os.path.join(VENV_MLFLOW, "python"), "-c", READ_RUNS, uri, experiment, run_name],
                            stdout=subprocess.PIPE, check=True, text=True, timeout=120).stdout
    return json.loads(output)


def _train(data_dir, tmp, uri, job_name, **hyperparameters):
    """lm.training.train in .venv-mlflow, without XLA (tracking does not depend on it; its compile costs CPU)."""
    env = helpers.environment(MLFLOW_TRACKING_URI=uri, MLFLOW_EXPERIMENT_NAME="lmstack-test",
                              TRAINING_JOB_NAME=job_name)
    args = [os.path.join(VENV_MLFLOW, "python"), "-m", "lm.training.train"] + helpers.cli_args(
        data_dir, tmp, xla=False, **hyperparameters)
    return subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def job_1(mlflow_server, text_dataset, tmp_path_factory):
    """Training job "job-1" (6 steps): (its directory, its output, its MLflow run as read when it ended)."""
    directory = str(tmp_path_factory.mktemp("job-1"))
    result = _train(text_dataset, directory, mlflow_server, "job-1", max_steps=6, eval_every=3)
    assert result.returncode == 0, result.stdout
    (run,) = _runs(mlflow_server, "lmstack-test", "job-1")
    return directory, result, run


@pytest.mark.slow
def test_a_training_run_logs_params_metrics_and_tags_to_mlflow(job_1, text_dataset):
    _, result, run = job_1
    assert "MLflow run %s (job-1)" % run["id"] in result.stdout
    assert run["status"] == "FINISHED"
    assert run["params"]["preset"] == "tiny" and run["params"]["max_steps"] == "6"
    assert run["params"]["global_batch_size"] == "8"
    assert run["tags"]["preset"] == "tiny"
    assert run["tags"]["dataset_fingerprint"] == shards.fingerprint(shards.load_manifest(text_dataset))
    metrics = run["metrics"]
    for name in ("loss", "learning_rate", "grad_norm", "tokens_per_s", "mfu"):
        assert [step for step, _ in metrics["train/" + name]] == [1, 2, 3, 4, 5, 6], name
    assert [round(value, 4) for _, value in metrics["train/loss"]] == [
        round(loss, 4) for _, loss in sorted(helpers.losses(result.stdout).items())]
    assert [step for step, _ in metrics["validation/loss"]] == [3, 6]
    # the goodput totals at the last step's save and at the end, as the [goodput] lines give them
    totals = [line for line in result.stdout.splitlines() if line.startswith("[goodput] kept_steps=")]
    assert totals and metrics["goodput/kept_steps"] == [[6, 6.0]] * len(totals)  # [step, value] as JSON gives them
    assert metrics["goodput/kept_tokens"] == [[6, float(re.search(r"kept_tokens=(\d+)", line).group(1))]
                                              for line in totals]


@pytest.mark.slow
def test_the_run_of_the_job_name_is_continued(mlflow_server, text_dataset, tmp_path):
    """SageMaker opens a run for MlflowConfig (MlflowRunName = the job name), and a job restarted
    after a spot interruption keeps its name: the training logs into that run, not a second one."""
    create = """
import sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
experiment = client.get_experiment_by_name("lmstack-test") or client.get_experiment(client.create_experiment("lmstack-test"))
print(client.create_run(experiment.experiment_id, run_name="job-2").info.run_id)
"""
    opened = subprocess.run([os.path.join(VENV_MLFLOW, "python"), "-c", create, mlflow_server], check=True,
                            stdout=subprocess.PIPE, text=True, timeout=120).stdout.strip()
    result = _train(text_dataset, str(tmp_path), mlflow_server, "job-2", max_steps=2)
    assert result.returncode == 0, result.stdout
    (run,) = _runs(mlflow_server, "lmstack-test", "job-2")
    assert run["id"] == opened
    assert [step for step, _ in run["metrics"]["train/loss"]] == [1, 2]
    # Restarted (the first process ended the run): still the same run.
    again = _train(text_dataset, str(tmp_path), mlflow_server, "job-2", max_steps=3)
    assert again.returncode == 0, again.stdout
    (run,) = _runs(mlflow_server, "lmstack-test", "job-2")
    assert run["id"] == opened and run["status"] == "FINISHED"
    assert [step for step, _ in run["metrics"]["train/loss"]] == [1, 2, 3]
    assert run["params"]["max_steps"] == "2"  # a logged param keeps its first value


def _with_validation_documents(dataset, directory):
    """A copy of `dataset` whose manifest lists validation documents of two sources (lm.data.prepare keeps them)."""
    shutil.copytree(dataset, directory)
    documents = [{"text": "def main():\n    return 0\n", "meta": {"pile_set_name": "Github"}},
                 {"text": "The Python tutorial begins here.", "meta": {"pile_set_name": "Pile-CC"}}]
    relative = shards.val_documents_name("sample")
    os.makedirs(os.path.dirname(os.path.join(directory, relative)))
    with open(os.path.join(directory, relative), "w") as handle:
        handle.writelines(json.dumps(document) + "\n" for document in documents)
    manifest = shards.load_manifest(directory)
    manifest.val_documents[relative] = {"documents": len(documents)}
    shards.save_manifest(directory, manifest)
    return directory


@pytest.mark.slow
def test_the_evaluation_job_logs_its_headline_into_the_training_jobs_run(mlflow_server, job_1, text_dataset, tmp_path):
    """The evaluate stage's job (lm.eval.stage) names the training job's run in LM_MLFLOW_RUN_NAME: its headline goes
    into that run, as evaluation/<metric> at step 0, beside the training's metrics."""
    model_channel = tmp_path / "model"
    model_channel.mkdir()
    with tarfile.open(str(model_channel / "model.tar.gz"), "w:gz") as archive:
        archive.add(os.path.join(job_1[0], "model"), arcname=".")
    output = tmp_path / "output"
    env = helpers.environment(MLFLOW_TRACKING_URI=mlflow_server, MLFLOW_EXPERIMENT_NAME="lmstack-test",
                              LM_MLFLOW_RUN_NAME="job-1", TMPDIR=str(tmp_path), SM_OUTPUT_DATA_DIR=str(output),
                              SM_CHANNEL_MODEL=str(model_channel),
                              SM_CHANNEL_TRAIN=_with_validation_documents(text_dataset, str(tmp_path / "dataset")))
    result = subprocess.run([os.path.join(VENV_MLFLOW, "python"), "-m", "lm.eval.stage", "--batch_size", "4"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert result.returncode == 0, result.stdout
    with open(str(output / "results.json")) as handle:
        headline = json.load(handle)["headline"]
    assert sorted(headline) == ["pile_bpb/Github", "pile_bpb/Pile-CC", "pile_bpb/total"]
    (run,) = _runs(mlflow_server, "lmstack-test", "job-1")
    assert run["id"] == job_1[2]["id"]
    for key, value in headline.items():
        assert run["metrics"]["evaluation/" + key] == [[0, pytest.approx(value, rel=1e-6)]]
    assert "train/loss" in run["metrics"]


def test_without_mlflow_tracking_is_off_with_a_log_line(monkeypatch):
    said = []
    monkeypatch.setitem(__import__("sys").modules, "mlflow", None)  # import mlflow raises ImportError
    assert tracking.start({"preset": "tiny"}, {}, said.append, {"MLFLOW_TRACKING_URI": "http://127.0.0.1:1"}) is None
    assert said == ["MLFLOW_TRACKING_URI is set but this image has no mlflow package: experiment tracking is off"]
    assert tracking.start({"preset": "tiny"}, {}, said.append, {}) is None and len(said) == 1
