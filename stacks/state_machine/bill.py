"""The bill at the end of every execution that ran a job: what each job cost, and in total.

Each job that ends (completed, failed or stopped; `stacks.state_machine.jobs`) records its usage in
`$.run.usage.<job>` (`usage_state`): its name, status, instance type and count, and what
DescribeTrainingJob reports of its billable and training seconds and its final metrics (optional members:
merged over `stacks.state_machine.jobs.BILLED_DEFAULTS` first, null where the service did not report them). A stage of its own
(an evaluation job) records its job the same way under its own key, and the bill lists it.

`states(settings, first, next_state, notify, retries)`: the gate's function computes the bill (`controlplane.bill`: BillableTimeInSeconds
x instance count x the price the plan used; Step Functions' JSONPath intrinsics cannot multiply) into `$.bill`,
each priced job's dollars go to CloudWatch (METRIC, one data point per job), and with `notify` the topic hears
the bill; then `next_state`. The bill never stops the execution: an error of the function or of CloudWatch is
written where the bill would be (`$.bill.text`) and the execution goes on to its end (the failure's cause and
its notification carry `$.bill.text`, the output of a completed run `$.bill`).
"""
import collections

from stacks.state_machine import asl

USAGE_PATH = "$.run.usage"
BILL_PATH = "$.bill"
# The dollars of each job, one data point when it ends: namespace, name, unit (CloudWatch has no currency
# unit: PutMetricData's StandardUnit list, CloudWatch API reference), and the dimensions that tell jobs apart.
NAMESPACE = "lmstack"
METRIC = "JobCostUSD"


def usage_state(kind, next_state, one_instance=False):
    """$.run.usage.<job> from the job's describe result merged over its defaults ($.scratch.job); `one_instance`:
    the job's settings have no instance_count (it always runs on one)."""
    described = "$.scratch.job."
    count = ("instance_count", 1) if one_instance else ("instance_count.$", kind.config + ".instance_count")
    return asl.pass_state(next_state, collections.OrderedDict([
        ("name.$", kind.slot + ".name"), ("status.$", described + "TrainingJobStatus"),
        ("instance_type.$", kind.config + ".instance_type"), count,
        ("billable_seconds.$", described + "BillableTimeInSeconds"),
        ("training_seconds.$", described + "TrainingTimeInSeconds"),
        ("metrics.$", described + "FinalMetricDataList"),
    ]), result_path="%s.%s" % (USAGE_PATH, kind.kind))


def metric_data(name_prefix):
    """PutMetricData's parameters for one line of the bill (the Map's item)."""
    return {"Namespace": NAMESPACE, "MetricData": [{
        "MetricName": METRIC, "Value.$": "$.usd", "Unit": "None",
        "Dimensions": [{"Name": "Deployment", "Value": name_prefix}, {"Name": "Job", "Value.$": "$.job"}]}]}


def states(settings, first, next_state, notify, retries):
    """The bill (the module docstring), entered at `first`; `retries`: (the gate's invocation's Retry, a
    CloudWatch call's), as `stacks.state_machine.jobs` retries them."""
    lambda_retry, retry = retries
    s = first
    result = collections.OrderedDict()
    after_metrics = s + ".Notify" if notify else next_state
    result[s] = asl.task("arn:aws:states:::lambda:invoke", {
        "FunctionName": "${GateFunctionArn}",
        "Payload": {"bill": {"usage.$": USAGE_PATH, "plan.$": "$.plan"}, "execution_name.$": "$$.Execution.Name"},
    }, s + ".Metrics", result_path=BILL_PATH, result_selector={
        "jobs.$": "$.Payload.jobs", "total_usd.$": "$.Payload.total_usd", "estimate_usd.$": "$.Payload.estimate_usd",
        "text.$": "$.Payload.text"},
        retry=lambda_retry, catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": "$.bill_error",
                                         "Next": s + ".Unbilled"}])
    result[s + ".Unbilled"] = asl.pass_state(after_metrics, {
        "jobs": [], "total_usd": None, "estimate_usd": None,
        "text.$": asl.fmt("bill: not computed ({}: {})", "$.bill_error.Error", "$.bill_error.Cause")},
        result_path=BILL_PATH)
    put = asl.sdk("cloudwatch", "putMetricData")
    result[s + ".Metrics"] = {
        "Type": "Map", "ItemsPath": BILL_PATH + ".jobs",
        "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": s + ".Metric.Priced", "States": {
            s + ".Metric.Priced": asl.choice([asl.rule({"Variable": "$.usd", "IsNull": True}, s + ".Metric.Unpriced")],
                                             s + ".Metric"),
            s + ".Metric.Unpriced": {"Type": "Succeed"},
            s + ".Metric": asl.task(put, metric_data(settings.name_prefix), None, retry=retry)}},
        "ResultPath": None, "Next": after_metrics,
        # a lost data point must not change how the run ends
        "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.metric_error", "Next": after_metrics}]}
    if notify:
        result[s + ".Notify"] = asl.publish("${TopicArn}", asl.fmt("execution {}: {}", "$$.Execution.Name",
                                                                  BILL_PATH + ".text"), next_state)
    return result
