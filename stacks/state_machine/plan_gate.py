"""The plan gate: reject what `lm.plan` says cannot fit or run, before any job exists.

The rules are `lm.plan.feasibility_table()` (one row per preset x GPU instance type x
strategy, for the smallest run: one sequence per replica), turned into Choice rules at
synth. Rejections name the reason and the planner's suggested strategy. The gate runs
before the other cross-field rules, so a strategy on an instance type outside its support
list gets the planner's suggestion too. A combination that fits only with activation recomputation is rejected while
`hyperparameters.recompute` is false.
"""
import collections

from lm import plan
from stacks.state_machine import asl

ERROR = "PlanRejected"


def _message(row, suffix=""):
    text = "lm.plan: %s%s" % (row["reason"] or "", suffix)
    if row["suggestion"]:
        text += "; suggestion: %s" % row["suggestion"]
    return text


def states(first, next_state):
    grouped = collections.OrderedDict()  # (instance type, strategy, message, recompute rule) -> presets
    for row in plan.feasibility_table():
        if not row["ok"]:
            key = (row["instance_type"], row["strategy"], _message(row), False)
        elif row["recompute_required"]:
            key = (row["instance_type"], row["strategy"],
                   "lm.plan: this preset fits %s on %s only with activation recomputation; "
                   "set hyperparameters.recompute to true" % (row["strategy"], row["instance_type"]), True)
        else:
            continue
        grouped.setdefault(key, []).append(row["preset"])

    result = collections.OrderedDict()
    rules = []
    for index, ((instance_type, strategy, message, needs_recompute), presets) in enumerate(grouped.items()):
        conditions = [{"Variable": "$.config.strategy", "StringEquals": strategy},
                      {"Variable": "$.config.instance_type", "StringEquals": instance_type},
                      asl.string_in("$.config.preset", presets)]
        if needs_recompute:
            conditions.append({"Variable": "$.config.hyperparameters.recompute", "BooleanEquals": False})
        name = "Rejected.%d.%s.%s" % (index, strategy, instance_type)
        rules.append(asl.rule(asl.all_of(*conditions), name))
        result[name] = {"Type": "Fail", "Error": ERROR, "Cause": message}
    result[first] = asl.choice(rules, next_state)
    result.move_to_end(first, last=False)
    return result
