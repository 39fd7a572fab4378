"""The optional deploy stage: quality gate, model, endpoint config, create or update, wait.

- Gate: with `min_quality` set, deploy only when the job's final `validation:loss` (from
  DescribeTrainingJob FinalMetricDataList) is at most that; otherwise the execution
  succeeds with `deploy.skipped` saying why (a job that reported no validation loss fails the
  gate too).
- Names: model and endpoint config `<prefix>-<md5 of the execution ARN>` (one per
  execution), endpoint `<prefix>-<deploy.endpoint_name>`. An endpoint that exists (and is
  not failed) is updated to the new config, otherwise created.
- Container (`deploy.container`): `lmstack` runs `lm.serving.server` in our image on the `lm.serving.export`
  files; `tgi` runs Text Generation Inference (`controlplane.containers`: this region's image) on the
  Hugging Face files `lm.training.train` wrote next to them (hyperparameters.export_hf), with TGI's
  Environment for the preset and instance type (the gate's, `controlplane.gate.check_serving`); `lmi`
  runs AWS's LMI container (vLLM) on the same files with LMI's Environment. All take the training job's
  model.tar.gz, or a deploy-only run's deploy.model_artifact (the Serve stage puts it where the job's would
  be); tgi and lmi also serve a Hugging Face directory, uncompressed (ModelDataSource, S3Prefix).
- Role and network: the model runs as the endpoint role (reads the model artifact, pulls its
  image, writes its logs; nothing else) in the hosting security group (no NFS to the file system).
- Wait: DescribeEndpoint every POLL_SECONDS, at most MAX_POLLS times, until InService with
  our config (an update that rolled back is InService with the old config: a failure), or
  Failed; failures carry FailureReason, are notified and fail the execution.
- Idle alarm: an endpoint bills by the hour until deleted, so once it is InService the machine
  puts an alarm `<endpoint>-no-invocations` (PutMetricAlarm, the same name on every update) that
  notifies the topic when the endpoint had no invocation for IDLE_HOURS. The endpoint's name is
  known only at run time, so a stack-level alarm cannot name it, and one Metrics Insights alarm
  over every endpoint would sum them (a busy endpoint would hide an idle one). Missing data counts
  as idle: SageMaker reports Invocations only for traffic, and after the endpoint is deleted the
  alarm says so until it is deleted too (docs/serving.md, "Deploy the endpoint").
"""
import collections

from controlplane import base_images
from controlplane import containers
from stacks.state_machine import asl
from stacks.state_machine.jobs import RETRY, TRAIN, tags, vpc_config, with_defaults
from stacks.state_machine.names import image_placeholder

POLL_SECONDS = 60
# CloudWatch evaluates at most one day of data for a standard alarm (Period x EvaluationPeriods).
IDLE_HOURS = 24
MAX_POLLS = 120
VARIANT_NAME = "AllTraffic"
MODEL_SERVER_WORKERS = "2"
NOT_FOUND_PATTERN = "*Could not find endpoint*"
SERVING_ENVIRONMENT_PATH = "$.plan.serving_environment"  # controlplane.gate.check_serving
ENDPOINT_BILLS_PATH = "$.plan.endpoint.bills"  # what the endpoint bills an hour (controlplane.gate.check_prices)
# The model to serve: the training job's model.tar.gz, or a deploy-only run's deploy.model_artifact (Serve stage).
MODEL_PATH = TRAIN.slot + ".result.model_artifacts"


def states(settings, first, next_state):
    """Entered at `first`; leaves `$.deploy_result` and goes to `next_state`."""
    d = "Deploy"
    result = collections.OrderedDict()
    names = "$.deploy"
    failure = d + ".Failure"
    catch = [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.deploy_error", "Next": d + ".CallFailed"}]

    result[first] = asl.choice([
        asl.rule({"Variable": "$.config.deploy.enabled", "BooleanEquals": False}, d + ".NotEnabled"),
        asl.rule({"Variable": "$.config.min_quality", "IsNull": True}, d + ".Names"),
    ], d + ".Gate")
    result[d + ".NotEnabled"] = asl.pass_state(next_state, result={"skipped": "deploy.enabled is false"},
                                               result_path="$.deploy_result")
    result[d + ".Gate"] = {
        "Type": "Map", "ItemsPath": TRAIN.slot + ".metrics",
        "ItemSelector": {"name.$": "$$.Map.Item.Value.name", "value.$": "$$.Map.Item.Value.value",
                         "limit.$": "$.config.min_quality"},
        "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": "Vote", "States": {
            "Vote": asl.choice([
                asl.rule(asl.all_of({"Variable": "$.name", "StringEquals": "validation:loss"},
                                    {"Variable": "$.value", "NumericLessThanEqualsPath": "$.limit"}), "Pass"),
                asl.rule({"Variable": "$.name", "StringEquals": "validation:loss"}, "Fail"),
            ], "Other"),
            "Pass": {"Type": "Pass", "Result": "pass", "End": True},
            "Fail": {"Type": "Pass", "Result": "fail", "End": True},
            "Other": {"Type": "Pass", "Result": "other", "End": True},
        }},
        "ResultSelector": {"passed.$": "States.ArrayContains($, 'pass')"},
        "ResultPath": "$.deploy_gate", "Next": d + ".GateCheck"}
    result[d + ".GateCheck"] = asl.choice(
        [asl.rule({"Variable": "$.deploy_gate.passed", "BooleanEquals": True}, d + ".Names")], d + ".Gated")
    result[d + ".Gated"] = asl.pass_state(d + ".GatedNotify", {"skipped.$": asl.fmt(
        "final validation:loss is above min_quality {} or was not reported", asl.to_json("$.config.min_quality"))},
        result_path="$.deploy_result")
    result[d + ".GatedNotify"] = asl.publish("${TopicArn}", asl.fmt(
        "model of {} not deployed: {}", TRAIN.slot + ".name", "$.deploy_result.skipped"), next_state)

    resource = asl.fmt("%s-{}" % settings.name_prefix, "$.run.id")
    result[d + ".Names"] = asl.pass_state(d + ".Container", {
        "model.$": resource, "config.$": resource,
        "endpoint.$": asl.fmt("%s-{}" % settings.name_prefix, "$.config.deploy.endpoint_name"),
        "polls": 0}, result_path=names)
    chosen = [{"Variable": "$.config.deploy.container", "StringEquals": container}
              for container in containers.HF_CONTAINERS]
    # A Hugging Face directory (a deploy-only run's deploy.model_artifact ending with /) is read uncompressed.
    directory = {"Variable": MODEL_PATH, "StringMatches": "*/"}
    result[d + ".Container"] = asl.choice(
        [asl.rule(asl.all_of(rule, directory), "%s.%sDirectory" % (d, container.title()))
         for rule, container in zip(chosen, containers.HF_CONTAINERS)]
        + [asl.rule(rule, "%s.%sModel" % (d, container.title()))
           for rule, container in zip(chosen, containers.HF_CONTAINERS)], d + ".Model")

    def create_model(name, image, environment, model_data=None):
        result[name] = asl.task(asl.sdk("sagemaker", "createModel"), {
            "ModelName.$": names + ".model",
            "PrimaryContainer": dict({"Image": image}, **(model_data or {"ModelDataUrl.$": MODEL_PATH}), **environment),
            "ExecutionRoleArn": "${EndpointRoleArn}",
            "VpcConfig": vpc_config(settings, "HostingSecurityGroupId"),
            "EnableNetworkIsolation": False,
            "Tags": tags("model")}, d + ".Config", catch=catch)

    create_model(d + ".Model", "${%s}" % image_placeholder(base_images.SERVING_RUNTIME),
                 {"Environment": {"SAGEMAKER_MODEL_SERVER_WORKERS": MODEL_SERVER_WORKERS}})
    for container in containers.HF_CONTAINERS:  # the gate's Environment for the preset and instance type
        create_model("%s.%sModel" % (d, container.title()), containers.image(container, settings.region),
                     {"Environment.$": SERVING_ENVIRONMENT_PATH})
        # ContainerDefinition.ModelDataSource (SageMaker API reference): S3Prefix, CompressionType None: the
        # files under the prefix as they are (S3Uri then ends with a /)
        create_model("%s.%sDirectory" % (d, container.title()), containers.image(container, settings.region),
                     {"Environment.$": SERVING_ENVIRONMENT_PATH}, {"ModelDataSource": {"S3DataSource": {
                         "S3Uri.$": MODEL_PATH, "S3DataType": "S3Prefix", "CompressionType": "None"}}})
    result[d + ".Config"] = asl.task(asl.sdk("sagemaker", "createEndpointConfig"), {
        "EndpointConfigName.$": names + ".config",
        "ProductionVariants": [{
            "VariantName": VARIANT_NAME, "ModelName.$": names + ".model",
            "InstanceType.$": "$.config.deploy.instance_type",
            "InitialInstanceCount.$": "$.config.deploy.instance_count", "InitialVariantWeight": 1}],
        "Tags": tags("endpoint-config")}, d + ".Exists", catch=catch)
    result[d + ".Exists"] = asl.task(
        asl.sdk("sagemaker", "describeEndpoint"), {"EndpointName.$": names + ".endpoint"}, d + ".ExistingStatus",
        result_selector={"status.$": "$.EndpointStatus"}, result_path="$.deploy_existing",
        catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": "$.deploy_error", "Next": d + ".Missing"}])
    result[d + ".Missing"] = asl.choice([asl.rule(
        {"Variable": "$.deploy_error.Cause", "StringMatches": NOT_FOUND_PATTERN}, d + ".Create")], d + ".CallFailed")
    result[d + ".ExistingStatus"] = asl.choice([asl.rule(
        {"Variable": "$.deploy_existing.status", "StringEquals": "Failed"}, d + ".Replace")], d + ".Update")
    result[d + ".Replace"] = asl.pass_state(d + ".CallFailed", result={
        "Error": "EndpointFailed", "Cause": "the endpoint exists in status Failed; delete it, then run again"},
        result_path="$.deploy_error")
    result[d + ".Create"] = asl.task(asl.sdk("sagemaker", "createEndpoint"), {
        "EndpointName.$": names + ".endpoint", "EndpointConfigName.$": names + ".config",
        "Tags": tags("endpoint")}, d + ".Wait", catch=catch)
    result[d + ".Update"] = asl.task(asl.sdk("sagemaker", "updateEndpoint"), {
        "EndpointName.$": names + ".endpoint", "EndpointConfigName.$": names + ".config"}, d + ".Wait", catch=catch)
    result[d + ".Wait"] = {"Type": "Wait", "Seconds": POLL_SECONDS, "Next": d + ".Describe"}
    result[d + ".Describe"] = asl.task(
        asl.sdk("sagemaker", "describeEndpoint"), {"EndpointName.$": names + ".endpoint"}, d + ".Reported",
        result_path="$.scratch", retry=RETRY)
    # EndpointConfigName is optional in DescribeEndpoint's output. Not reported after our
    # create or update: InService is then taken as serving our config.
    result[d + ".Reported"] = asl.choice([asl.rule(
        {"Variable": "$.scratch.EndpointConfigName", "IsPresent": True}, d + ".Status")], d + ".StatusOfOurs")
    result[d + ".Status"] = asl.pass_state(d + ".Check", {
        "status.$": "$.scratch.EndpointStatus", "config.$": "$.scratch.EndpointConfigName"},
        result_path="$.deploy_status")
    result[d + ".StatusOfOurs"] = asl.pass_state(d + ".Check", {
        "status.$": "$.scratch.EndpointStatus", "config.$": names + ".config"}, result_path="$.deploy_status")
    result[d + ".Check"] = asl.choice([
        asl.rule(asl.all_of({"Variable": "$.deploy_status.status", "StringEquals": "InService"},
                            {"Variable": "$.deploy_status.config", "StringEqualsPath": names + ".config"}),
                 d + ".IdleAlarm"),
        asl.rule(asl.any_of({"Variable": "$.deploy_status.status", "StringEquals": "Failed"},
                            {"Variable": "$.deploy_status.status", "StringEquals": "InService"}), d + ".Failed"),
        asl.rule({"Variable": names + ".polls", "NumericGreaterThanEquals": MAX_POLLS}, d + ".TimedOut"),
    ], d + ".Count")
    result[d + ".Count"] = asl.pass_state(d + ".Wait", {
        "model.$": names + ".model", "config.$": names + ".config", "endpoint.$": names + ".endpoint",
        "polls.$": "States.MathAdd(%s.polls, 1)" % names}, result_path=names)
    result[d + ".Failed"] = asl.task(
        asl.sdk("sagemaker", "describeEndpoint"), {"EndpointName.$": names + ".endpoint"}, d + ".FailedDefaults",
        result_path="$.scratch", retry=RETRY)
    result[d + ".FailedDefaults"] = with_defaults("failed_endpoint", d + ".FailureReason")
    result[d + ".FailureReason"] = asl.pass_state(failure, {"reason.$": asl.fmt(
        "endpoint {} is {} with config {}: {}", names + ".endpoint", "$.deploy_status.status",
        "$.deploy_status.config", "$.scratch.job.FailureReason")}, result_path="$.deploy_failure")
    result[d + ".TimedOut"] = asl.pass_state(failure, {"reason.$": asl.fmt(
        "endpoint {} not InService after %d checks %d s apart (status {})" % (MAX_POLLS, POLL_SECONDS),
        names + ".endpoint", "$.deploy_status.status")}, result_path="$.deploy_failure")
    result[d + ".CallFailed"] = asl.pass_state(failure, {"reason.$": asl.fmt(
        "deploying to {} failed: {}: {}", names + ".endpoint", "$.deploy_error.Error", "$.deploy_error.Cause")},
        result_path="$.deploy_failure")
    result[failure] = asl.publish("${TopicArn}", "$.deploy_failure.reason", d + ".Fail")
    result[d + ".Fail"] = asl.fail("DeployFailed", "$.deploy_failure.reason")
    result[d + ".IdleAlarm"] = asl.task(asl.sdk("cloudwatch", "putMetricAlarm"), idle_alarm(names + ".endpoint"),
                                        d + ".Done", result_path=None, retry=RETRY, catch=catch)
    result[d + ".Done"] = asl.pass_state(d + ".Succeeded", {
        "endpoint_name.$": names + ".endpoint", "endpoint_config_name.$": names + ".config",
        "model_name.$": names + ".model", "status": "InService",
        "console_url.$": asl.fmt("https://%s.console.aws.amazon.com/sagemaker/home?region=%s#/endpoints/{}" % (
            settings.region, settings.region), names + ".endpoint")}, result_path="$.deploy_result")
    result[d + ".Succeeded"] = asl.publish("${TopicArn}", asl.fmt(
        "endpoint {} is InService with model {}: {}", names + ".endpoint", names + ".model", ENDPOINT_BILLS_PATH),
        next_state)
    return result


def idle_alarm(endpoint_path):
    """PutMetricAlarm's parameters: the endpoint at `endpoint_path` had no invocation for IDLE_HOURS."""
    return {
        "AlarmName.$": asl.fmt("{}-no-invocations", endpoint_path),
        "AlarmDescription.$": asl.fmt(
            "endpoint {} had no invocation for %d hours and bills until deleted: aws sagemaker delete-endpoint "
            "--endpoint-name {}, then delete this alarm" % IDLE_HOURS, endpoint_path, endpoint_path),
        "Namespace": "AWS/SageMaker", "MetricName": "Invocations",
        "Dimensions": [{"Name": "EndpointName", "Value.$": endpoint_path},
                       {"Name": "VariantName", "Value": VARIANT_NAME}],
        "Statistic": "Sum", "Period": 3600, "EvaluationPeriods": IDLE_HOURS,
        "Threshold": 1, "ComparisonOperator": "LessThanThreshold", "TreatMissingData": "breaching",
        "AlarmActions": ["${TopicArn}"]}
