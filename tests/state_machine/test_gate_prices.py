"""The gate's prices (`controlplane.gate.check_prices`, `controlplane.pricing`): each instance type it plans or
budgets priced from the AWS Price List (`lmstack.local_pricing`, answered through botocore) for the stack's
region; the table's price, said so, when the Price List fails, hangs or answers what cannot be read; the
endpoint's hourly price in the plan, and in the budget for deploy.budget_hours."""
import pytest

import price_lists
import quota_tables
from state_machine.harness import StandInSettings

from controlplane import gate, pricing, prices
from lmstack.local_pricing import PriceList, Product
from stacks.gate import PRICING_ACTIONS

DEPLOYMENT = gate.Deployment.of(StandInSettings())
# 20,000 steps of gpt-125m on two ml.p4d.24xlarge: about half an hour
RUN = {"preset": "gpt-125m", "strategy": "smddp", "instance_type": "ml.p4d.24xlarge", "instance_count": 2,
       "max_runtime_seconds": 86400, "hyperparameters": {"global_batch_size": 64, "max_steps": 20000}}
P4D = "ml.p4d.24xlarge"
PRICE = 25.2513  # what the stand-in's Price List answers for P4D: not the table's
TABLE = prices.on_demand_price(P4D)


def decide(execution_input, price_list, region=None, launch=0):
    clients = price_lists.clients(price_list, others=quota_tables.clients(quota_tables.account()))
    return gate.decide(execution_input, gate.Context(DEPLOYMENT, clients=clients, region=region), launch=launch)


def test_the_plan_budget_and_notes_use_the_price_list_s_price_and_name_it():
    price_list = price_lists.training({P4D: PRICE}, effective_date="2026-10-01")
    decision = decide(dict(RUN, budget_usd=1000.0), price_list)
    plan = decision.plan
    assert PRICE != TABLE and plan["usd_per_instance_hour"] == PRICE
    assert plan["cost_on_demand_usd"] == pytest.approx(plan["hours"] * 2 * PRICE) == plan["cost_usd"]
    assert plan["price_source"].startswith("AWS Price List") and (plan["price_region"], plan["price_date"]) == (
        "us-east-1", "2026-10-01")
    assert plan["budget"]["usd_per_hour"] == round(2 * PRICE, 4)
    assert "price of ml.p4d.24xlarge for training: $25.2513/h (AWS Price List, us-east-1, effective 2026-10-01)" \
        in decision.notes
    assert "at $%.2f/h" % (2 * PRICE) in next(note for note in decision.notes if note.startswith("budget_usd"))
    # the request is what the gate's role may do (stacks.gate grants pricing:GetProducts, nothing more)
    assert {"pricing:GetProducts"} == set(PRICING_ACTIONS) and len(price_list.calls) == 1


def test_a_budget_the_table_s_stale_price_would_refuse_fits_at_the_price_list_s():
    estimate_at_table = gate.decide(dict(RUN, budget_usd=1e6), gate.Context(DEPLOYMENT)).plan["budget"]["estimate_usd"]
    budget_usd = round(estimate_at_table * PRICE / TABLE * 1.05, 2)
    with pytest.raises(gate.Refusal, match="is estimated at"):
        gate.decide(dict(RUN, budget_usd=budget_usd), gate.Context(DEPLOYMENT))
    decision = decide(dict(RUN, budget_usd=budget_usd), price_lists.training({P4D: PRICE}))
    assert decision.plan["budget"]["estimate_usd"] <= budget_usd


@pytest.mark.parametrize("price_list, why", [
    (PriceList(errors={"GetProducts": ("ThrottlingException", "Rate exceeded")}),
     "the AWS Price List could not answer (ThrottlingException: Rate exceeded)"),
    (PriceList(raw=["{\"product\": {}}"]), "could not be read: an unreadable answer (KeyError: 'attributes')"),
    (PriceList(), "the AWS Price List has no on-demand price of ml.p4d.24xlarge for Training in us-east-1"),
])
def test_a_price_list_that_cannot_say_leaves_the_table_s_price_and_the_notes_say_so(price_list, why):
    decision = decide(dict(RUN, budget_usd=1000.0), price_list)
    assert decision.plan["usd_per_instance_hour"] == TABLE and decision.plan["budget"]["usd_per_hour"] == 2 * TABLE
    assert decision.plan["price_source"].startswith("controlplane.prices")
    (note,) = [note for note in decision.notes if note.startswith("price of ")]
    assert note.startswith("price of ml.p4d.24xlarge for training: $%g/h (controlplane.prices, us-east-1, read %s); "
                           "the table's, as " % (TABLE, prices.price_date(P4D))) and why in note


def test_a_price_list_that_does_not_answer_leaves_the_decision_to_the_table_within_the_time_limit(monkeypatch):
    monkeypatch.setattr(pricing, "TIME_LIMIT_SECONDS", 0.5)
    price_list = price_lists.training({P4D: PRICE})
    price_list.hang()  # answered only after the decision returned: the gate cannot have waited for it
    try:
        decision = decide(dict(RUN, budget_usd=1000.0), price_list)
    finally:
        price_list.release()
    assert decision.plan["usd_per_instance_hour"] == TABLE
    assert any("the AWS Price List did not answer within 0.5 s" in note for note in decision.notes)


def test_the_stack_s_region_is_priced_through_the_query_api_s_nearest_region():
    price_list = PriceList([Product(P4D, "Training", "eu-west-1", 30.0), Product(P4D, "Training", "us-east-1", PRICE)])
    decision = decide(RUN, price_list, region="eu-west-1")
    assert (decision.plan["usd_per_instance_hour"], decision.plan["price_region"]) == (30.0, "eu-west-1")
    assert price_list.calls[0]["endpoint"] == "https://api.pricing.eu-central-1.amazonaws.com/"


def test_every_type_planned_or_budgeted_is_priced_the_prepare_job_s_and_the_endpoint_s_too():
    price_list = PriceList([Product(P4D, "Training", "us-east-1", PRICE),
                            Product("ml.p5.48xlarge", "Training", "us-east-1", 63.296),
                            Product("ml.c5.18xlarge", "Training", "us-east-1", 3.5),
                            Product("ml.g5.12xlarge", "Hosting", "us-east-1", 7.5)])
    run = dict(RUN, fallback_instance_types=["ml.p5.48xlarge"], budget_usd=1000.0,
               prepare={"enabled": True, "instance_type": "ml.c5.18xlarge", "raw_s3_uri": "s3://bucket/raw/"},
               deploy={"enabled": True, "instance_type": "ml.g5.12xlarge", "instance_count": 2})
    decision = decide(run, price_list)
    assert decision.plan["budget"]["prepare_usd"] == round(3.5 * 6, 2)  # one instance, its 6 h max_runtime_seconds
    endpoint = decision.plan["endpoint"]
    assert (endpoint["usd_per_instance_hour"], endpoint["usd_per_hour"], endpoint["budget_usd"]) == (7.5, 15.0, 0.0)
    assert endpoint["price_source"].startswith("AWS Price List")
    # what the deploy stage's note says when the endpoint is InService (stacks.state_machine.deploy)
    assert endpoint["bills"] == ("2 x ml.g5.12xlarge at $7.5/h (AWS Price List, us-east-1, effective 2026-11-01) bills "
                                 "$15.00 an hour until deleted")
    assert "price of ml.g5.12xlarge for hosting: $7.5/h (AWS Price List, us-east-1, effective 2026-11-01)" \
        in decision.notes
    assert any("budget_usd counts the jobs, not the endpoint" in note for note in decision.notes)
    # the fallback's launch is planned and budgeted at its own price, and says what changed
    fallback = decide(run, price_list, launch=1)
    assert fallback.plan["usd_per_instance_hour"] == 63.296
    assert "usd_per_instance_hour: 25.25 -> 63.30" in fallback.plan["changes"]


def test_deploy_budget_hours_puts_the_endpoint_s_first_hours_in_the_budget():
    price_list = PriceList([Product(P4D, "Training", "us-east-1", PRICE),
                            Product("ml.g5.12xlarge", "Hosting", "us-east-1", 7.5)])
    deploy = {"enabled": True, "instance_type": "ml.g5.12xlarge", "instance_count": 2, "budget_hours": 10}
    without = decide(dict(RUN, budget_usd=1000.0), price_list).plan["budget"]
    decision = decide(dict(RUN, budget_usd=1000.0, deploy=deploy), price_list)
    found = decision.plan["budget"]
    assert found["endpoint_usd"] == 150.0 and found["estimate_usd"] == pytest.approx(without["estimate_usd"] + 150.0)
    assert found["max_runtime_seconds"] == int((1000.0 - 150.0) / (2 * PRICE) * 3600)
    assert not any("budget_usd counts the jobs, not the endpoint" in note for note in decision.notes)
    # an endpoint whose hosting price no source has cannot be budgeted: refused, naming where it was looked for
    with pytest.raises(gate.Refusal) as refused:
        decide(dict(RUN, budget_usd=1000.0, deploy=dict(deploy, instance_type="ml.g5.2xlarge")), price_list)
    assert refused.value.error == gate.OVER_BUDGET
    assert str(refused.value).startswith(
        "budget_usd: deploy.instance_type ml.g5.2xlarge has no hosting price (looked for in the AWS Price List: the "
        "AWS Price List has no on-demand price of ml.g5.2xlarge for Hosting in us-east-1; controlplane.prices")


def test_deploy_budget_hours_without_deploy_is_refused():
    with pytest.raises(gate.Refusal, match="deploy.budget_hours 5.0 counts an endpoint's hours in budget_usd: it "
                                           "needs deploy.enabled true"):
        gate.decide(dict(RUN, budget_usd=100.0, deploy={"budget_hours": 5}), gate.Context(DEPLOYMENT))


def test_a_caller_that_does_not_ask_aws_uses_the_table_and_its_plan_says_so():
    decision = gate.decide(RUN, gate.Context(DEPLOYMENT))
    assert decision.plan["usd_per_instance_hour"] == TABLE and decision.plan["price_source"].startswith(
        "controlplane.prices") and decision.plan["price_date"] == prices.price_date(P4D)
