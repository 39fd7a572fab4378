"""controlplane.prices: a dated, sourced record for every training type the input accepts, and what the plan
output makes of it (a cost, or why none; spot labelled an estimate)."""
import pytest

from controlplane import planner, prices
from lmstack import plan
from stacks.settings import Settings
from controlplane import inputs


def accepted_training_types():
    """The instance types the execution input accepts (its `instance_type` field's choices)."""
    (field,) = [field for field in inputs.schema(Settings()) if field.name == "instance_type"]
    return field.choices


def test_every_accepted_training_type_has_a_price_record_with_source_and_date():
    accepted = accepted_training_types()
    assert sorted(prices.RECORDS) == sorted(accepted), (
        "without a record: %s; recorded but not accepted: %s" % (
            sorted(set(accepted) - set(prices.RECORDS)), sorted(set(prices.RECORDS) - set(accepted))))
    for name in accepted:
        record = prices.RECORDS[name]
        assert record.source.strip() and record.read[:2] == "20", record
        if record.usd_per_hour is None:
            # No figure is never silent: the record says it was looked for, and the planner prices nothing.
            assert record.source.startswith("not found"), record
            assert prices.on_demand_price(name) is None and name in prices.UNPRICED
        else:
            assert any(origin in record.source for origin in prices.AWS_SOURCES), record
            assert prices.on_demand_price(name) == record.usd_per_hour > 0 and name not in prices.UNPRICED
    assert set(prices.ON_DEMAND_USD_PER_HOUR) | set(prices.UNPRICED) == set(accepted)


@pytest.mark.parametrize("changes, message", [
    (dict(source=" "), "needs its source"),
    (dict(read="June 2024"), "YYYY-MM or YYYY-MM-DD"),
    (dict(read="2024-13"), "YYYY-MM or YYYY-MM-DD"),
    (dict(usd_per_hour=0.0), "positive number or None"),
    (dict(source="a blog's table of 2026"), "comes from AWS"),
])
def test_a_record_without_a_source_a_date_or_a_positive_price_is_refused(changes, message):
    fields = dict(instance_type="ml.p4d.24xlarge", usd_per_hour=37.688, source=prices.PRICING_PAGE, read="2024-06")
    fields.update(changes)
    with pytest.raises(ValueError, match=message) as raised:
        prices.Price(**fields)
    assert "ml.p4d.24xlarge" in str(raised.value)


def test_an_unknown_type_has_no_price_and_the_error_names_the_recorded_ones():
    with pytest.raises(ValueError, match="ml.nosuch.xlarge.*ml.p4d.24xlarge"):
        prices.on_demand_price("ml.nosuch.xlarge")


def test_the_plan_names_the_price_and_its_date_or_says_none_was_found():
    priced = plan.format_table(planner.plan("gpt-125m", "ml.p4d.24xlarge", 1, "mwms", global_batch=64))
    assert "$37.688/h on demand (us-east-1, read 2024-06)" in priced
    unpriced = planner.plan("gpt-125m", "ml.g6e.xlarge", 1, "single", global_batch=8, recompute=True)
    assert unpriced["instance"]["price_date"] == prices.RECORDS["ml.g6e.xlarge"].read
    table = plan.format_table(unpriced)
    assert "no on-demand price (us-east-1: none found, looked for %s" % prices.RECORDS["ml.g6e.xlarge"].read in table
    assert "$- on demand" in table  # the chosen line: no cost rather than a guess
    given = plan.format_table(planner.plan("gpt-125m", "ml.g6e.xlarge", 1, "single", global_batch=8, recompute=True,
                                           usd_per_instance_hour=2.5))
    assert "$2.5/h (the training plan's price)" in given


def test_spot_is_labelled_an_estimate_in_the_plan_and_the_execution_output():
    result = planner.plan("gpt-125m", "ml.p4d.24xlarge", 1, "mwms", global_batch=64, spot=True)
    table = plan.format_table(result)
    assert "spot$ est." in table and prices.SPOT_BASIS in table
    assert any(line.startswith("  ") and line.endswith("spot (an estimate)") for line in table.splitlines())
    assert prices.SPOT_BASIS.startswith("an estimate at 30 % of on demand")
    estimate = planner.estimate("gpt-125m", "ml.p4d.24xlarge", 1, "mwms", global_batch=64)
    assert estimate["spot_basis"] == prices.SPOT_BASIS
    assert estimate["cost_spot_usd"] == pytest.approx(estimate["cost_on_demand_usd"] * (1 - prices.SPOT_DISCOUNT))
    assert estimate["price_date"] == "2024-06"
