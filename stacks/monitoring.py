"""Monitoring: the notification topic, the training dashboard and the failed-execution alarms."""
from typing import Optional

from aws_cdk import Aws, Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

# SageMaker publishes the MetricDefinitions and the instance metrics of a training job here,
# with the dimension Host = "<job name>/algo-<n>".
TRAINING_NAMESPACE = "/aws/sagemaker/TrainingJobs"
PERIOD = Duration.minutes(1)
# Low GPU utilization: a Metrics Insights alarm over the whole training namespace, not one alarm per job made by
# the state machine: it needs no extra state, no PutMetricAlarm/DeleteMetricAlarm permissions and no clean-up
# when an execution dies, and it covers every host of every running job ("Create a CloudWatch alarm based on a
# Metrics Insights query", CloudWatch User Guide: the query must return one time series, so no GROUP BY).
# MIN over the hosts: one idle host in a distributed job is enough to warn. Per GPU: SageMaker's
# GPUUtilization is summed over a host's GPUs (0-800 % on 8), so the alarm reads the mean per GPU that
# lm.training.gpu_usage logs on every host (metric definition gpu:utilization_per_gpu), 0-100 on every type. Metrics
# Insights cannot filter on a name prefix; only our jobs log that metric.
LOW_GPU_UTILIZATION_PERCENT = 20
LOW_GPU_MINUTES = 15
PER_GPU_METRIC = "gpu:utilization_per_gpu"
LOW_GPU_QUERY = 'SELECT MIN("%s") FROM SCHEMA("%s", Host)' % (PER_GPU_METRIC, TRAINING_NAMESPACE)


class Notifications(Construct):
    """The SNS topic the state machines publish phase changes and failures to (HTTPS-only publishing)."""

    def __init__(self, scope: Construct, construct_id: str, *, notification_email: Optional[str],
                 key: kms.IKey) -> None:
        super().__init__(scope, construct_id)
        self.topic = sns.Topic(self, "Topic", display_name="lmstack training", enforce_ssl=True, master_key=key)
        # CloudWatch alarms publish with the cloudwatch.amazonaws.com principal; only this account's alarms
        # (confused-deputy protection, SNS Developer Guide "Amazon SNS access control: cross-service").
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchAlarmsOfThisAccount", actions=["sns:Publish"], resources=[self.topic.topic_arn],
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                        "ArnLike": {"aws:SourceArn": "arn:%s:cloudwatch:%s:%s:alarm:*" % (
                            Aws.PARTITION, Aws.REGION, Aws.ACCOUNT_ID)}}))
        if notification_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(notification_email))


class Monitoring(Construct):
    """Dashboard (training and instance metrics per host, executions), alarms on failed executions and low GPU use."""

    def __init__(self, scope: Construct, construct_id: str, *, name_prefix: str, state_machine: sfn.IStateMachine,
                 stop_machine: sfn.IStateMachine, topic: sns.ITopic) -> None:
        super().__init__(scope, construct_id)
        self._prefix = name_prefix
        self.failed_alarm = self._failed_executions_alarm(
            "FailedExecutions", state_machine, topic,
            "An lmstack training execution failed; the execution's error cause says why.")
        # The stop machine fails when a StopTrainingJob kept failing: a job may still run (and bill).
        self.stop_failed_alarm = self._failed_executions_alarm(
            "StopFailedExecutions", stop_machine, topic,
            "The lmstack stop-on-abort machine could not stop a training job of an ended execution: the job may "
            "still be running; the stop execution's error cause names it. Stop it by hand.")
        self.low_gpu_alarm = cloudwatch.Alarm(
            self, "LowGpuUtilization",
            metric=cloudwatch.MathExpression(expression=LOW_GPU_QUERY, using_metrics={}, period=PERIOD,
                                             label="lowest mean per-GPU utilization of any training host (%)"),
            threshold=LOW_GPU_UTILIZATION_PERCENT, evaluation_periods=LOW_GPU_MINUTES,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            # No training job running: no data, not an alarm.
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description="A training host's GPUs were under %d%% busy on average per GPU for %d minutes: "
                              "input-bound, hung, or waiting on a peer; see the dashboard." % (LOW_GPU_UTILIZATION_PERCENT, LOW_GPU_MINUTES))
        self.low_gpu_alarm.add_alarm_action(cloudwatch_actions.SnsAction(topic))
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=name_prefix + "-training")
        self.dashboard.add_widgets(
            self._per_host("Training loss", "train:loss"),
            self._per_host("Tokens per second (per host)", "train:tokens_per_second"),
            self._per_host("Model FLOPs utilization", "train:mfu"),
        )
        self.dashboard.add_widgets(
            self._per_host("GPU utilization per host (%)", "GPUUtilization", width=6),
            self._per_host("GPU memory utilization per host (%)", "GPUMemoryUtilization", width=6),
            self._per_host("CPU utilization per host (%)", "CPUUtilization", width=6),
            self._per_host("Disk utilization per host (%)", "DiskUtilization", width=6),
        )
        self.dashboard.add_widgets(
            self._per_host("Validation loss", "validation:loss"),
            self._per_host("Step time (s)", "train:step_time"),
            cloudwatch.GraphWidget(title="Executions", width=8, left=[
                state_machine.metric_started(period=PERIOD, statistic="Sum"),
                state_machine.metric_succeeded(period=PERIOD, statistic="Sum"),
                state_machine.metric_failed(period=PERIOD, statistic="Sum"),
                state_machine.metric_aborted(period=PERIOD, statistic="Sum"),
                state_machine.metric_timed_out(period=PERIOD, statistic="Sum"),
            ]),
            cloudwatch.AlarmStatusWidget(title="Alarms", width=8,
                                         alarms=[self.failed_alarm, self.stop_failed_alarm, self.low_gpu_alarm]),
        )

    def _failed_executions_alarm(self, construct_id, machine, topic, description):
        alarm = cloudwatch.Alarm(
            self, construct_id, metric=machine.metric_failed(period=Duration.minutes(5), statistic="Sum"),
            threshold=1, evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING, alarm_description=description)
        alarm.add_alarm_action(cloudwatch_actions.SnsAction(topic))
        return alarm

    def _per_host(self, title, metric_name, width=8):
        """One line per host of every job with our prefix: a metrics SEARCH over the Host dimension."""
        search = "SEARCH('{%s,Host} MetricName=\"%s\" %s', 'Average', %d)" % (
            TRAINING_NAMESPACE, metric_name, self._prefix, PERIOD.to_seconds())
        return cloudwatch.GraphWidget(title=title, width=width, left=[
            cloudwatch.MathExpression(expression=search, using_metrics={}, label="", period=PERIOD)])
