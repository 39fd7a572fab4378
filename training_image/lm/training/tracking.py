"""Experiment tracking on MLflow, by rank 0, beside the TensorBoard scalars (`lm.training.summaries`).

On when MLFLOW_TRACKING_URI is set (MLflow's own variable: an http(s) server, a local store, or
on SageMaker the ARN of a managed MLflow tracking server or app, which needs the
`sagemaker-mlflow` plugin). The experiment is MLFLOW_EXPERIMENT_NAME (MLflow's own variable,
default experiment without it). The run is named after the training job (TRAINING_JOB_NAME,
which SageMaker sets; the request's MlflowConfig.MlflowRunName is the same name; the evaluation job names the
training job's in LM_MLFLOW_RUN_NAME, lm.spec.contract.MLFLOW_RUN_NAME): the latest run
of that name in the experiment is continued (the run SageMaker opened for MlflowConfig, or the
job's own run before a spot interruption restarted it from its checkpoint; a retried job has a
new name), otherwise one is created.

Logged: every hyperparameter as a param, the training scalars (train/loss, train/learning_rate,
train/grad_norm, train/tokens_per_s, train/mfu, train/loss_scale) and validation/loss as metrics
at the global step, the dataset fingerprint and model preset as tags. The run id is printed; the
execution reads it from DescribeTrainingJob's MlflowDetails.

`mlflow` is imported only when tracking is on: an image without it (the TF 2.6, 2.11 and 2.19
DLCs; the TF 2.21 DLC ships MLflow and the SageMaker plugin) logs one line saying tracking is off
and trains on. A tracking call that fails (server gone) is logged once and tracking stops; the
training goes on.
"""
import os

from lm.spec import contract

TRACKING_URI = "MLFLOW_TRACKING_URI"
JOB_NAME = "TRAINING_JOB_NAME"


def start(hyperparameters, tags, say, environ=None):
    """A Tracker logging to the configured MLflow, or None (not configured, or no mlflow)."""
    environ = os.environ if environ is None else environ
    uri = environ.get(TRACKING_URI)
    if not uri:
        return None
    try:
        import mlflow
    except ImportError:
        say("%s is set but this image has no mlflow package: experiment tracking is off" % TRACKING_URI)
        return None
    run_name = environ.get(contract.MLFLOW_RUN_NAME) or environ.get(JOB_NAME) or None
    experiment = mlflow.get_experiment_by_name(environ["MLFLOW_EXPERIMENT_NAME"]) \
        if environ.get("MLFLOW_EXPERIMENT_NAME") else None
    run_id = _active_run(mlflow, experiment, run_name)
    run = mlflow.start_run(run_id=run_id, run_name=None if run_id else run_name)
    tracker = Tracker(mlflow, run.info.run_id, say)
    # A param cannot change once logged (MLflow refuses it): a continued run keeps its first values.
    logged = run.data.params if run_id else {}
    tracker.call(mlflow.log_params, {name: str(value) for name, value in hyperparameters.items() if name not in logged})
    tracker.call(mlflow.set_tags, {name: str(value) for name, value in tags.items()})
    say("MLflow run %s (%s) at %s" % (tracker.run_id, run_name, uri))
    return tracker


def _active_run(mlflow, experiment, run_name):
    """The id of the latest run called `run_name` in the experiment, or None."""
    if not run_name:
        return None
    experiment_ids = [experiment.experiment_id] if experiment is not None else None
    found = mlflow.search_runs(experiment_ids=experiment_ids, output_format="list", max_results=1,
                               filter_string="attributes.run_name = '%s'" % run_name.replace("'", ""),
                               order_by=["attributes.start_time DESC"])
    return found[0].info.run_id if found else None


class Tracker:
    def __init__(self, mlflow, run_id, say):
        self._mlflow, self.run_id, self._say = mlflow, run_id, say

    def call(self, function, *args, **kwargs):
        if self._mlflow is None:
            return
        try:
            function(*args, **kwargs)
        except Exception as error:  # tracking must never stop a training run
            self._say("MLflow tracking stopped: %s: %s" % (type(error).__name__, error))
            self._mlflow = None

    def metrics(self, step, prefix, values):
        if self._mlflow is not None:
            self.call(self._mlflow.log_metrics, {"%s/%s" % (prefix, name): float(value)
                                                 for name, value in values.items()}, step=int(step))

    def close(self):
        if self._mlflow is not None:
            self.call(self._mlflow.end_run)
            self._mlflow = None
