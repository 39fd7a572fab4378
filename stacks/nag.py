"""cdk-nag acknowledgments, each with its reason, and least-privilege statements that carry their own.

`Grant` is an IAM statement whose wildcards (a `*` in an action or resource) must come with a
written reason; `add_grants` puts grants into a policy and acknowledges exactly the
AwsSolutions-IAM5 findings those wildcards raise, with that reason. A wildcard without a
reason is a synth error, so a new one cannot slip in unexplained.
"""
import json
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_iam as iam
from constructs import IConstruct


class Grant(NamedTuple):
    actions: Sequence[str]
    resources: Sequence[str]
    reason: Optional[str] = None
    conditions: Optional[Mapping[str, Any]] = None


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    Validations.of(scope).acknowledge(Acknowledgment(id=rule, reason=reason))


def add_grants(policy: iam.Policy, grants: Sequence[Grant]) -> None:
    """Add each grant to `policy` and acknowledge its wildcard findings with its reason."""
    stack = Stack.of(policy)
    reasons: Dict[str, List[str]] = {}
    for grant in grants:
        statement = iam.PolicyStatement(actions=list(grant.actions), resources=list(grant.resources),
                                        conditions=dict(grant.conditions) if grant.conditions else None)
        policy.add_statements(statement)
        findings = wildcard_findings(stack.resolve(list(grant.actions)), stack.resolve(list(grant.resources)))
        if findings and not grant.reason:
            raise ValueError("%s: wildcard %s needs a written reason" % (policy.node.path, ", ".join(findings)))
        for finding in findings:
            reasons.setdefault(finding, []).append(grant.reason)
    for finding, texts in reasons.items():
        acknowledge(policy, "AwsSolutions-IAM5[%s]" % finding, " ".join(dict.fromkeys(texts)))


def wildcard_findings(actions: Sequence[Any], resources: Sequence[Any]) -> List[str]:
    """The finding ids cdk-nag's IAM5 rule reports for these (resolved) actions and resources."""
    found = ["Action::%s" % action for action in actions if "*" in action]
    for resource in resources:
        flat = _flatten(resource)
        if "*" in flat:
            found.append("Resource::%s" % flat)
    return list(dict.fromkeys(found))


def _flatten(node: Any) -> str:
    """A resolved CloudFormation value as cdk-nag spells it in finding ids (`<Logical.Attr>`, `<Ref>`)."""
    if isinstance(node, str):
        return node.replace("${", "<").replace("}", ">")
    if isinstance(node, dict) and "Fn::Join" in node:
        delimiter, items = node["Fn::Join"]
        return delimiter.join(_flatten(item) for item in items)
    if isinstance(node, dict) and "Fn::Sub" in node:
        return _flatten(node["Fn::Sub"])
    if isinstance(node, dict) and "Fn::GetAtt" in node:
        resource, attribute = node["Fn::GetAtt"]
        return "<%s.%s>" % (_flatten(resource), _flatten(attribute))
    if isinstance(node, dict) and "Fn::ImportValue" in node:
        return _flatten(node["Fn::ImportValue"])
    if isinstance(node, dict) and "Ref" in node:
        return "<%s>" % _flatten(node["Ref"])
    return json.dumps(node, separators=(",", ":"))
