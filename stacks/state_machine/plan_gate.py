"""The plan gate: reject what `controlplane.planner` says cannot fit or run, before any job exists.

The rules are `controlplane.rules.plan_rules()` (made from `controlplane.planner.feasibility_table()`), turned into
Choice rules at synth. Rejections name the reason and the planner's suggested strategy. The
gate runs before the other cross-field rules, so a strategy on an instance type outside its
support list gets the planner's suggestion too. A combination that fits only with activation
recomputation is rejected while `hyperparameters.recompute` is false.
"""
import collections

from controlplane import rules
from stacks.state_machine import asl


def states(first, next_state):
    """One Choice rule and one Fail state (error PlanRejected) per `controlplane.rules.plan_rules()` entry."""
    result = collections.OrderedDict()
    choices = []
    for found in rules.plan_rules():
        name = "Rejected.%s" % found.name
        choices.append(asl.rule(asl.condition(found.when), name))
        result[name] = {"Type": "Fail", "Error": found.error, "Cause": found.message}
    result[first] = asl.choice(choices, next_state)
    result.move_to_end(first, last=False)
    return result
