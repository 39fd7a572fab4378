"""The stop-on-abort machine.

An execution of the main machine cannot run states after it is aborted or timed out (and
one that fails while its monitor loop cannot reach SageMaker would leave the job running),
so an EventBridge rule on the main machine's "Step Functions Execution Status Change" events
with status ABORTED, TIMED_OUT or FAILED starts this machine with the whole event as input.
It finds that execution's in-progress jobs by the MD5 of the execution ARN, which every job
name carries (see `jobs.py`), stops them and notifies. Nothing in progress: nothing to do.

Each StopTrainingJob is retried while SageMaker throttles it or fails inside; a job that ended
in the meantime ("The request was rejected because the training job is in status Stopped.")
needs no stop. Any other refusal leaves a job running: after every job was tried the execution
fails with STOP_FAILED naming those jobs, which the stop machine's failed-executions alarm
reports (stacks/monitoring.py).
"""
from stacks.state_machine import asl, jobs

STOP_FAILED = "StopTrainingJobFailed"
ENDED_PATTERN = "*training job is in status*"
# StopTrainingJob repeated on the same job does no harm: besides throttling, SageMaker's own failures are retried.
STOP_RETRY = [dict(jobs.THROTTLE_RETRY[0], ErrorEquals=[
    jobs.THROTTLED, "SageMaker.InternalFailureException", "SageMaker.ServiceUnavailableException"])]


def _outcome(outcome, **fields):
    """What one job's iteration leaves: {name, outcome: stopped | ended | failed, ...}."""
    return asl.pass_state(None, dict({"name.$": "$.name", "outcome": outcome}, **fields))


def build_stop_definition(settings):
    return asl.state_machine(
        "%s: stop the SageMaker jobs of an aborted, timed-out or failed execution" % settings.name_prefix,
        "Execution", {
            "Execution": asl.pass_state("List", {
                "id.$": "States.Hash($.detail.executionArn, 'MD5')",
                "execution.$": "$.detail.executionArn", "status.$": "$.detail.status"}),
            "List": asl.task(asl.sdk("sagemaker", "listTrainingJobs"), {
                "NameContains.$": "$.id", "StatusEquals": "InProgress", "MaxResults": 100,
            }, "Stop", result_path="$.jobs", result_selector={"summaries.$": "$.TrainingJobSummaries"},
                retry=jobs.RETRY),
            "Stop": {
                "Type": "Map", "ItemsPath": "$.jobs.summaries",
                "ItemSelector": {"name.$": "$$.Map.Item.Value.TrainingJobName"},
                "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": "StopJob", "States": {
                    "StopJob": asl.task(
                        asl.sdk("sagemaker", "stopTrainingJob"), {"TrainingJobName.$": "$.name"}, "StopJob.Stopped",
                        retry=STOP_RETRY,
                        catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "StopJob.Refused"}]),
                    "StopJob.Stopped": _outcome("stopped"),
                    "StopJob.Refused": asl.choice([asl.rule(
                        {"Variable": "$.error.Cause", "StringMatches": ENDED_PATTERN}, "StopJob.Ended")],
                        "StopJob.Failed"),
                    "StopJob.Ended": _outcome("ended"),
                    "StopJob.Failed": _outcome("failed", **{"error.$": asl.fmt("{}: {}", "$.error.Error",
                                                                               "$.error.Cause")}),
                }},
                "ResultPath": "$.results", "Next": "Check"},
            # Only after every job was tried: a job whose stop failed fails its iteration here, and so the Map.
            # (No JSONPath filter: one that selects nothing is an error on moto's engine.)
            "Check": {
                "Type": "Map", "ItemsPath": "$.results",
                "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": "Check.Job", "States": {
                    "Check.Job": asl.choice([asl.rule({"Variable": "$.outcome", "StringEquals": "failed"},
                                                      "Check.Failed")], "Check.Done"),
                    "Check.Failed": asl.fail(STOP_FAILED, asl.fmt("{}: {}", "$.name", "$.error")),
                    "Check.Done": {"Type": "Succeed"},
                }},
                "ResultPath": None, "Next": "Notify",
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.check_error", "Next": "NotifyFailed"}]},
            "NotifyFailed": asl.publish("${TopicArn}", asl.fmt(
                "execution {} ended {}: COULD NOT STOP a training job, it may still run and bill: {}",
                "$.execution", "$.status", asl.to_json("$.results")), "Failed"),
            "Failed": asl.fail(STOP_FAILED, asl.fmt(
                "could not stop a training job of execution {}: {}", "$.execution", asl.to_json("$.results"))),
            "Notify": asl.publish("${TopicArn}", asl.fmt(
                "execution {} ended {}: training jobs {}", "$.execution", "$.status", asl.to_json("$.results")),
                "Done"),
            "Done": asl.pass_state(None, {"execution.$": "$.execution", "status.$": "$.status",
                                          "jobs.$": "$.results"}),
        })
