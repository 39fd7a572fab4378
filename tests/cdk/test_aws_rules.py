"""The strict stand-in rules (tests/aws_rules.py) on the synthesized template: ours passes, wrong copies fail."""
import json

import pytest

import aws_rules


def _first(template, type_name):
    return next(value for value in template["Resources"].values() if value["Type"] == type_name)


def _drop_log_group_name(template):
    for value in template["Resources"].values():
        if value["Type"] == "AWS::Logs::LogGroup":
            value["Properties"].pop("LogGroupName", None)


def _rotation_off(template):
    _first(template, "AWS::KMS::Key")["Properties"]["EnableKeyRotation"] = False


def _topic_unencrypted(template):
    _first(template, "AWS::SNS::Topic")["Properties"].pop("KmsMasterKeyId")


def _extra_principal(template):
    _first(template, "AWS::KMS::Key")["Properties"]["KeyPolicy"]["Statement"].append(
        {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "kms:*", "Resource": "*"})


def _logs_without_condition(template):
    for statement in _first(template, "AWS::KMS::Key")["Properties"]["KeyPolicy"]["Statement"]:
        if statement.get("Sid") == "CloudWatchLogsOfThisAccount":
            statement.pop("Condition")


def _topic_policy_unconditioned(template):
    for value in template["Resources"].values():
        if value["Type"] == "AWS::SNS::TopicPolicy":
            for statement in value["Properties"]["PolicyDocument"]["Statement"]:
                statement.pop("Condition", None) if statement.get("Sid") == "CloudWatchAlarmsOfThisAccount" else None


def _no_topic_policy(template):
    for key in [k for k, v in template["Resources"].items() if v["Type"] == "AWS::SNS::TopicPolicy"]:
        del template["Resources"][key]


def _low_gpu_query(template):
    return next(value for key, value in template["Resources"].items()
                if key.startswith("MonitoringLowGpuUtilization"))["Properties"]


def _group_by(template):
    query = _low_gpu_query(template)["Metrics"][0]
    query["Expression"] += " GROUP BY Host"


def _window_too_long(template):
    _low_gpu_query(template)["EvaluationPeriods"] = 181


def _named_log_groups_retained(template):
    for value in template["Resources"].values():
        if value["Type"] == "AWS::Logs::LogGroup" and "LogGroupName" in value["Properties"]:
            value["DeletionPolicy"] = value["UpdateReplacePolicy"] = "Retain"


def _map_item_named_like_the_first_state(template):
    for value in template["Resources"].values():
        if value["Type"] == "AWS::StepFunctions::StateMachine":
            definition = json.loads(value["Properties"]["DefinitionString"])
            item_processor = next(state["ItemProcessor"] for state in definition["States"].values()
                                  if state["Type"] == "Map")
            item_processor["States"][definition["StartAt"]] = {"Type": "Pass", "End": True}
            value["Properties"]["DefinitionString"] = json.dumps(definition)
def _third_zone(template):
    subnet = next(value for value in template["Resources"].values() if value["Type"] == "AWS::EC2::Subnet")
    subnet["Properties"]["AvailabilityZone"] = {"Fn::Select": [2, {"Fn::GetAZs": ""}]}


def test_our_template_passes_every_rule(default):
    assert aws_rules.check_template(default.template) == []


@pytest.mark.parametrize("rule, change", [
    (aws_rules.state_machine_log_groups_are_vended, _drop_log_group_name),
    (aws_rules.customer_managed_key_with_rotation, _rotation_off),
    (aws_rules.customer_managed_key_with_rotation, _topic_unencrypted),
    (aws_rules.key_policy_service_principals, _extra_principal),
    (aws_rules.key_policy_service_principals, _logs_without_condition),
    (aws_rules.alarm_actions_can_publish, _topic_policy_unconditioned),
    (aws_rules.alarm_actions_can_publish, _no_topic_policy),
    (aws_rules.metrics_insights_alarms_are_evaluable, _group_by),
    (aws_rules.metrics_insights_alarms_are_evaluable, _window_too_long),
    (aws_rules.named_resources_not_retained_on_create, _named_log_groups_retained),
    (aws_rules.state_names_unique, _map_item_named_like_the_first_state),
    (aws_rules.get_azs_picks_within_the_first_two, _third_zone),
])
def test_rule_fails_on_a_wrong_template(default, rule, change):
    assert rule(default.template) == []
    assert rule(aws_rules.mutated(default.template, change))
