"""The stop-on-abort machine.

An execution of the main machine cannot run states after it is aborted or timed out (and
one that fails while its monitor loop cannot reach SageMaker would leave the job running),
so an EventBridge rule on the main machine's "Step Functions Execution Status Change" events
with status ABORTED, TIMED_OUT or FAILED starts this machine with the whole event as input.
It finds that execution's in-progress jobs by the MD5 of the execution ARN, which every job
name carries (see `jobs.py`), stops them and notifies. Nothing in progress: nothing to do.
"""
from stacks.state_machine import asl


def build_stop_definition(settings):
    return {
        "Comment": "%s: stop the SageMaker jobs of an aborted, timed-out or failed execution" % settings.name_prefix,
        "StartAt": "Execution",
        "States": {
            "Execution": asl.pass_state("List", {
                "id.$": "States.Hash($.detail.executionArn, 'MD5')",
                "execution.$": "$.detail.executionArn", "status.$": "$.detail.status"}),
            "List": asl.task(asl.sdk("sagemaker", "listTrainingJobs"), {
                "NameContains.$": "$.id", "StatusEquals": "InProgress", "MaxResults": 100,
            }, "Stop", result_path="$.jobs", result_selector={"summaries.$": "$.TrainingJobSummaries"}),
            "Stop": {
                "Type": "Map", "ItemsPath": "$.jobs.summaries",
                "ItemSelector": {"name.$": "$$.Map.Item.Value.TrainingJobName"},
                "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": "StopJob", "States": {
                    # A job that ended in the meantime cannot be stopped: not an error here.
                    "StopJob": asl.task(asl.sdk("sagemaker", "stopTrainingJob"), {"TrainingJobName.$": "$.name"},
                                        "Stopped", catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error",
                                                           "Next": "Stopped"}]),
                    "Stopped": {"Type": "Pass", "OutputPath": "$.name", "End": True},
                }},
                "ResultPath": "$.stopped", "Next": "Notify"},
            "Notify": asl.publish("${TopicArn}", asl.fmt(
                "execution {} ended {}: stopped training jobs {}", "$.execution", "$.status",
                asl.to_json("$.stopped")), "Done"),
            "Done": asl.pass_state(None, {"execution.$": "$.execution", "status.$": "$.status",
                                          "stopped.$": "$.stopped"}),
        },
    }
