"""The evaluate stage: after training, before deploy, with `evaluate.enabled` (`controlplane.evaluation`).

An evaluation job (a SageMaker training job of kind "evaluate" on the current-TF image, training_image/
evaluate.py, `jobs.EVALUATE`) reads the training job's model.tar.gz (the model channel), the dataset's validation
documents (the train channel, read-only) and the tasks' data (evaluate.data_s3_uri, the tasks channel), runs
`lm.eval.run` and writes its results JSON, which SageMaker uploads as
s3://<artifact bucket>/evaluation/<execution name>/<job>/output/output.tar.gz. Its log lines give the headline
numbers as the job's metrics (MetricDefinitions the gate made for its tasks: CloudWatch and
DescribeTrainingJob's FinalMetricDataList); the topic hears them, the execution output holds them
(`evaluation`), and with MLflow the job logs them into the training job's run.

A failed evaluation fails the execution before deploy (EvaluateJobFailed): a model nobody could measure is not
served, and the execution says so. The cause names the job's FailureReason and the trained model.tar.gz, which
the evaluation never touches, and how to serve it anyway (deploy.model_artifact).

`check_states` runs before any job: evaluate.data_s3_uri must be in this stack's artifact bucket under
TASK_DATA_PREFIX, what the job role may read (the gate checked its form; the bucket is known only here).
"""
import collections

from controlplane import bucket_layout
from lm.spec.conditions import INVALID
from stacks.state_machine import asl, jobs

EVALUATE = jobs.EVALUATE
RESULT_PATH = "$.evaluate_result"


def check_states(first, next_state):
    """evaluate.data_s3_uri below s3://<artifact bucket>/<TASK_DATA_PREFIX>, or null."""
    allowed = "s3://${ArtifactBucket}/%s" % bucket_layout.TASK_DATA_PREFIX
    return collections.OrderedDict([
        (first, asl.choice([asl.rule(asl.any_of({"Variable": jobs.TASK_DATA_PATH, "IsNull": True},
                                                {"Variable": jobs.TASK_DATA_PATH, "StringMatches": allowed + "*"}),
                                     next_state)], first + ".Outside")),
        (first + ".Outside", asl.fail(INVALID, asl.fmt(
            "evaluate.data_s3_uri must start with %s (the prefix the jobs may read), got {}" % allowed,
            jobs.TASK_DATA_PATH))),
    ])


def results_uri():
    """Where SageMaker puts the job's /opt/ml/output/data (its results JSON)."""
    return asl.fmt("s3://${ArtifactBucket}/%s{}/{}/output/output.tar.gz" % bucket_layout.EVALUATION_PREFIX,
                   "$$.Execution.Name", EVALUATE.slot + ".name")


def states(settings, first, next_state):
    """Entered at `first`; leaves `$.evaluate_result` and goes to `next_state`."""
    s, slot = EVALUATE.state, EVALUATE.slot
    result = collections.OrderedDict()
    result[first] = asl.choice([asl.rule({"Variable": "$.config.evaluate.enabled", "BooleanEquals": True},
                                         s + ".Start")], first + ".NotEnabled")
    result[first + ".NotEnabled"] = asl.pass_state(next_state, result={"skipped": "evaluate.enabled is false"},
                                                   result_path=RESULT_PATH)
    result.update(jobs.job_states(EVALUATE, settings, first + ".Done"))
    # The job's own completion message would name its (empty) model.tar.gz: its result is collected instead, and the
    # topic hears the headline.
    result[s + ".Succeeded"] = asl.pass_state(first + ".Done", collections.OrderedDict([
        ("job_name.$", slot + ".name"), ("model_artifacts.$", jobs.TRAIN.slot + ".result.model_artifacts"),
        ("results.$", results_uri()), ("metrics.$", slot + ".metrics"),
        ("billable_seconds.$", slot + ".result.billable_seconds"), ("console_url.$", slot + ".result.console_url")]),
        result_path=RESULT_PATH)
    result[first + ".Done"] = asl.publish("${TopicArn}", asl.fmt(
        "execution {}: evaluation job {} of model {} completed: {} (results {})", "$$.Execution.Name",
        RESULT_PATH + ".job_name", RESULT_PATH + ".model_artifacts", asl.to_json(RESULT_PATH + ".metrics"),
        RESULT_PATH + ".results"), next_state)
    return result
