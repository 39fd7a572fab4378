"""budget_usd (`controlplane.budget`, the gate's check_budget): a run whose estimate exceeds the budget is refused
before any job with the estimate, the budget and what would fit; one within it gets its training job's
MaxRuntimeInSeconds capped so that instance count x price x MaxRuntime stays within it, and every job gets its
deadline (hyperparameter stop_after_seconds) a start-up before MaxRuntime."""
import re

import pytest
from state_machine.harness import StandInSettings, invalid_sagemaker_requests

from controlplane import budget
from controlplane import gate, prices

CONTEXT = gate.Context(gate.Deployment.of(StandInSettings()))
# 20,000 steps of gpt-125m on two ml.p4d.24xlarge: about half an hour, about $40 on demand
RUN = {"preset": "gpt-125m", "strategy": "smddp", "instance_type": "ml.p4d.24xlarge", "instance_count": 2,
       "max_runtime_seconds": 86400, "hyperparameters": {"global_batch_size": 64, "max_steps": 20000}}
P4D = prices.on_demand_price("ml.p4d.24xlarge")


def estimate(execution_input):
    decision = gate.decide(dict(execution_input, budget_usd=1e6), CONTEXT)
    return decision.plan["budget"]["estimate_usd"]


def test_a_budget_below_the_estimate_is_refused_with_what_would_fit():
    needed = estimate(RUN)
    with pytest.raises(gate.Refusal) as refused:
        gate.decide(dict(RUN, budget_usd=round(needed * 0.4, 2)), CONTEXT)
    assert refused.value.error == gate.OVER_BUDGET
    message = str(refused.value)
    assert message.startswith("budget_usd %.2f: the run on instance_type ml.p4d.24xlarge is estimated at $%.2f "
                              "(training $%.2f at $%.2f/h)" % (round(needed * 0.4, 2), needed, needed, 2 * P4D))
    # fewer steps, spot (an estimate, labelled), or another type, each within the budget; or more budget
    steps = int(message.split("hyperparameters.max_steps ")[1].split()[0])
    assert 0 < steps < 20000
    assert estimate(dict(RUN, hyperparameters=dict(RUN["hyperparameters"], max_steps=steps))) <= needed * 0.4
    assert "spot: true (estimated $" in message and prices.SPOT_BASIS in message
    assert 0 <= float(message.rsplit("budget_usd ", 1)[1]) - needed <= 0.01  # the estimate, rounded up to a cent
    # on P5 (faster, dearer) the same run fits a budget that P4d's cost fits: the refusal names that type
    p5 = dict(RUN, instance_type="ml.p5.48xlarge", strategy="mwms")
    with pytest.raises(gate.Refusal) as refused:
        gate.decide(dict(p5, budget_usd=round(needed * 1.1, 2)), CONTEXT)
    other = str(refused.value).split("; instance_type ml.p4d.24xlarge (")[1]
    strategy, estimated = other.split(", estimated $")[0], float(other.split(", estimated $")[1].split(")")[0])
    assert estimate(dict(RUN, strategy=strategy)) == estimated <= needed * 1.1


def test_a_budget_above_the_estimate_caps_max_runtime_so_count_x_price_x_runtime_fits():
    needed = estimate(RUN)
    decision = gate.decide(dict(RUN, budget_usd=round(needed * 1.5, 2)), CONTEXT)
    cap = decision.config["max_runtime_seconds"]
    assert cap < RUN["max_runtime_seconds"]
    assert 2 * P4D * cap / 3600 <= needed * 1.5 < 2 * P4D * (cap + 1) / 3600
    # the plan's training, its start-up, a step and the last save fit within the cap
    assert decision.plan["hours"] * 3600 + budget.stop_margin_seconds(decision.config, decision.plan) <= cap
    assert decision.plan["stop_after_seconds"] == cap - budget.JOB_STARTUP_SECONDS
    assert decision.plan["budget"]["max_runtime_seconds"] == cap
    assert "capped from max_runtime_seconds 86400" in decision.notes[0]
    # a budget above what max_runtime_seconds allows changes nothing
    assert gate.decide(dict(RUN, budget_usd=1e6), CONTEXT).config["max_runtime_seconds"] == 86400


def test_the_prepare_job_and_the_warm_pool_come_out_of_the_budget_first():
    prepare = {"enabled": True, "raw_s3_uri": "s3://bucket/raw/", "instance_type": "ml.c5.18xlarge",
               "max_runtime_seconds": 3600}
    run = dict(RUN, prepare=prepare, keep_alive_seconds=1800)
    decision = gate.decide(dict(run, budget_usd=200.0), CONTEXT)
    found = decision.plan["budget"]
    assert found["prepare_usd"] == round(prices.on_demand_price("ml.c5.18xlarge"), 2)  # one instance, an hour
    assert found["warm_pool_usd"] == round(2 * P4D / 2, 2)
    assert decision.config["max_runtime_seconds"] == int((200.0 - found["prepare_usd"] - 2 * P4D / 2) / (2 * P4D) * 3600)


def test_spot_is_budgeted_at_its_estimate():
    spot = dict(RUN, spot=True, budget_usd=round(estimate(dict(RUN, spot=True)) * 2, 2))
    decision = gate.decide(spot, CONTEXT)
    cap = decision.config["max_runtime_seconds"]
    assert 2 * prices.spot_cost(P4D) * cap / 3600 <= spot["budget_usd"]
    assert "(spot, an estimate)" in decision.notes[0]


@pytest.mark.parametrize("changes, named", [
    ({"instance_type": "ml.p5e.48xlarge", "strategy": "mwms"},
     "budget_usd: instance_type ml.p5e.48xlarge has no training price (looked for in controlplane.prices"),
    ({"fallback_instance_types": ["ml.g6e.48xlarge"]},
     "budget_usd: fallback_instance_types[0] ml.g6e.48xlarge has no training price (looked for in "
     "controlplane.prices"),
    ({"training_plan_arn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p"},
     "budget_usd with training_plan_arn"),
])
def test_a_run_whose_price_is_not_known_is_refused_rather_than_guessed(changes, named):
    with pytest.raises(gate.Refusal, match="^" + re.escape(named)) as refused:
        gate.decide(dict(RUN, budget_usd=1000.0, **changes), CONTEXT)
    assert refused.value.error == gate.OVER_BUDGET


def test_each_fallback_type_is_held_to_the_budget_before_any_job():
    fallback = dict(RUN, fallback_instance_types=["ml.p5.48xlarge"])
    p4d_only = estimate(RUN)
    with pytest.raises(gate.Refusal, match=r"the run on fallback_instance_types\[0\] ml.p5.48xlarge is estimated"):
        gate.decide(dict(fallback, budget_usd=round(p4d_only * 1.05, 2)), CONTEXT)
    # the fallback's launch is capped at its own price
    decision = gate.decide(dict(fallback, budget_usd=1000.0), CONTEXT, launch=1)
    assert decision.config["max_runtime_seconds"] == min(86400, int(1000.0 / (2 * prices.on_demand_price(
        "ml.p5.48xlarge")) * 3600))


# ---- through the state machine ----

def test_a_budget_below_the_estimate_fails_before_any_job(deployment):
    run = deployment.run({"hyperparameters": {"max_steps": 3}, "budget_usd": 0.05})
    assert (run.status, run.description["error"]) == ("FAILED", gate.OVER_BUDGET)
    assert run.description["cause"].startswith("budget_usd 0.05: the run on instance_type ml.g5.2xlarge is estimated")
    assert deployment.jobs.created == []


def test_a_budget_above_the_estimate_caps_the_training_request(deployment):
    run = deployment.run({"hyperparameters": {"max_steps": 3}, "budget_usd": 1.0, "spot": True})
    assert run.status == "SUCCEEDED", run.description.get("cause")
    (_, _, request), = run.calls("createTrainingJob")
    stopping = request["StoppingCondition"]
    cap = int(1.0 / prices.spot_cost(prices.on_demand_price("ml.g5.2xlarge")) * 3600)
    assert stopping == {"MaxRuntimeInSeconds": min(cap, 3600), "MaxWaitTimeInSeconds": 2 * min(cap, 3600)}
    assert request["HyperParameters"]["stop_after_seconds"] == str(min(cap, 3600) - budget.JOB_STARTUP_SECONDS)
    assert invalid_sagemaker_requests(run) == []
