"""The plan gate: reject what `controlplane.planner` says cannot fit or run, before any job exists.

The rules are `controlplane.rules.plan_rules()` (made from `controlplane.planner.feasibility_table()`), turned into
Choice states at synth. Rejections name the reason and the planner's suggested strategy. The
gate runs before the other cross-field rules, so a strategy on an instance type outside its
support list gets the planner's suggestion too. A combination that fits only with activation
recomputation is rejected while `hyperparameters.recompute` is false.

Every plan rule tests the strategy and the instance type first (`plan_rules`), so the gate branches
on them before it tests presets: a Choice on the instance type, one on the strategy per instance
type, then that pair's rules in their order, each testing only the rest of its conditions (the
presets, and recompute). The same rule matches the same inputs as a flat Choice of whole rules
would; the definition holds each instance type and strategy test once per pair instead of once
per rule (tests/state_machine/test_definition_budget.py measures it).
"""
import collections

from controlplane import rules
from lm.spec.conditions import INSTANCE_TYPE_FIELD, STRATEGY_FIELD, All, Is
from stacks.state_machine import asl


def _by_instance_type_and_strategy():
    """instance type -> strategy -> [(rule, the conditions it tests besides those two)], in rule order."""
    grouped = collections.OrderedDict()
    for found in rules.plan_rules():
        strategy, instance_type = found.when.conditions[:2]
        if (strategy.path, instance_type.path) != (STRATEGY_FIELD, INSTANCE_TYPE_FIELD):
            raise ValueError("plan rule %s must test the strategy, then the instance type" % found.name)
        rest = found.when.conditions[2:]
        grouped.setdefault(instance_type.value, collections.OrderedDict()).setdefault(strategy.value, []).append(
            (found, rest[0] if len(rest) == 1 else All(rest)))
    return grouped


def states(first, next_state):
    """The Choice states of the branches and one Fail state (error PlanRejected) per
    `controlplane.rules.plan_rules()` entry."""
    result = collections.OrderedDict()
    instance_choices = []
    for instance_index, (instance_type, strategies) in enumerate(_by_instance_type_and_strategy().items()):
        instance_state = "%s.%d" % (first, instance_index)
        instance_choices.append(asl.rule(asl.condition(Is(INSTANCE_TYPE_FIELD, instance_type)), instance_state))
        strategy_choices = []
        for strategy, found in strategies.items():
            strategy_state = "%s.%s" % (instance_state, strategy)
            strategy_choices.append(asl.rule(asl.condition(Is(STRATEGY_FIELD, strategy)), strategy_state))
            preset_choices = []
            for rule, rest in found:
                name = "Rejected.%s" % rule.name.split(".")[0]
                preset_choices.append(asl.rule(asl.condition(rest), name))
                result[name] = {"Type": "Fail", "Error": rule.error, "Cause": rule.message}
            result[strategy_state] = asl.choice(preset_choices, next_state)
        result[instance_state] = asl.choice(strategy_choices, next_state)
    result[first] = asl.choice(instance_choices, next_state)
    result.move_to_end(first, last=False)
    return result
