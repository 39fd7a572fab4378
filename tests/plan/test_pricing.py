"""controlplane.pricing: a type's on-demand SageMaker price from the AWS Price List (answered by
`lmstack.local_pricing` through botocore), the table's with a note when the Price List cannot say, within a
time limit whatever the Price List does."""
import json

import pytest

import price_lists
from controlplane import pricing, prices
from lmstack.local_pricing import PriceList, Product

P4D = "ml.p4d.24xlarge"


def test_the_price_list_s_price_is_used_and_named_with_its_region_and_effective_date():
    price_list = price_lists.training({P4D: 25.2513}, region="eu-west-1", effective_date="2026-10-01")
    (found,) = pricing.prices_of([(P4D, pricing.TRAINING)], "eu-west-1", price_lists.clients(price_list)).values()
    assert (found.usd_per_hour, found.region, found.effective_date, found.note) == (25.2513, "eu-west-1", "2026-10-01", "")
    assert found.from_price_list and found.described() == "$25.2513/h (AWS Price List, eu-west-1, effective 2026-10-01)"
    (call,) = price_list.calls
    # the stack's region is the filter's; the request goes to the Query API's region nearest it
    assert call["endpoint"] == "https://api.pricing.eu-central-1.amazonaws.com/"
    assert call["ServiceCode"] == "AmazonSageMaker" and {(f["Type"], f["Field"], f["Value"]) for f in call["Filters"]} == {
        ("TERM_MATCH", "regionCode", "eu-west-1"), ("TERM_MATCH", "instanceName", P4D),
        ("TERM_MATCH", "component", "Training")}


def test_training_and_hosting_are_different_products():
    price_list = PriceList([Product("ml.g5.12xlarge", "Training", "us-east-1", 7.09),
                            Product("ml.g5.12xlarge", "Hosting", "us-east-1", 7.9)])
    found = pricing.prices_of([("ml.g5.12xlarge", pricing.TRAINING), ("ml.g5.12xlarge", pricing.HOSTING)],
                              "us-east-1", price_lists.clients(price_list))
    assert [price.usd_per_hour for price in found.values()] == [7.09, 7.9]


@pytest.mark.parametrize("region, api_region", [("us-west-2", "us-east-1"), ("eu-west-1", "eu-central-1"),
                                                ("ap-northeast-1", "ap-south-1"), ("sa-east-1", "us-east-1")])
def test_the_query_api_is_asked_in_one_of_its_regions(region, api_region):
    assert pricing.api_region(region) == api_region in pricing.API_REGIONS


def table_price(note_part, found):
    assert not found.from_price_list and found.usd_per_hour == prices.on_demand_price(P4D)
    assert found.source.startswith("controlplane.prices") and found.effective_date == prices.price_date(P4D)
    assert note_part in found.note, found.note


@pytest.mark.parametrize("price_list, note", [
    (PriceList(errors={"GetProducts": ("ThrottlingException", "Rate exceeded")}),
     "the AWS Price List could not answer (ThrottlingException: Rate exceeded)"),
    (PriceList(errors={"GetProducts": ("AccessDeniedException", "not authorized to perform pricing:GetProducts")}),
     "could not answer (AccessDeniedException"),
    (PriceList(reachable=False), "could not answer (EndpointConnectionError"),
    (PriceList(), "the AWS Price List has no on-demand price of ml.p4d.24xlarge for Training in us-east-1"),
])
def test_a_price_list_that_cannot_say_gives_the_table_s_price_and_says_why(price_list, note):
    (found,) = pricing.prices_of([(P4D, pricing.TRAINING)], "us-east-1", price_lists.clients(price_list)).values()
    table_price(note, found)


def product(**changes):
    item = json.loads(Product(P4D, "Training", "us-east-1", 25.2513).item())
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = item
        for key in parents:
            target = target[key] if key in target else next(iter(target.values()))
        target[last] = value
    return json.dumps(item)


@pytest.mark.parametrize("raw, reason", [
    (["{not json"], "an unreadable answer (JSONDecodeError"),
    ([product(terms={})], "an unreadable answer (KeyError: 'OnDemand')"),
    ([product(terms__OnDemand__term__priceDimensions__rate__unit="Quantity")], "a price per 'Quantity', not per hour"),
    ([product(terms__OnDemand__term__priceDimensions__rate__pricePerUnit={"USD": "a lot"})], "an unreadable answer (ValueError"),
    ([product(terms__OnDemand__term__priceDimensions__rate__pricePerUnit={"USD": "0.0000000000"})], "a price of 0"),
    ([product(), product(terms__OnDemand__term__priceDimensions__rate__pricePerUnit={"USD": "30.0"})],
     "2 different prices (25.2513, 30)"),
])
def test_an_answer_that_cannot_be_read_is_a_fallback_with_a_note_never_a_crash(raw, reason):
    (found,) = pricing.prices_of([(P4D, pricing.TRAINING)], "us-east-1",
                                 price_lists.clients(PriceList(raw=raw))).values()
    table_price("the AWS Price List's answer for ml.p4d.24xlarge Training in us-east-1 could not be read: " + reason,
                found)


def test_a_price_list_that_does_not_answer_is_bounded_by_the_time_limit():
    price_list = price_lists.training({P4D: 25.2513})
    price_list.hang()  # no request is answered until the lookup has returned
    try:
        (found,) = pricing.prices_of([(P4D, pricing.TRAINING)], "us-east-1", price_lists.clients(price_list),
                                     time_limit=0.2).values()
    finally:
        price_list.release()
    table_price("the AWS Price List did not answer within 0.2 s", found)
    # the gate's own time limit leaves room inside its Lambda timeout: every lookup runs at once, bounded together,
    # and the quota lookup has its time (no page after QUOTA_SECONDS, the last one call at most)
    from controlplane import gate
    from stacks import gate_code
    assert pricing.TIME_LIMIT_SECONDS + gate.QUOTA_SECONDS + gate.AWS_CALL_SECONDS < gate_code.TIMEOUT_SECONDS


def test_without_a_client_the_table_s_price_is_used_without_a_note():
    found = pricing.price_of(P4D, pricing.TRAINING, "us-east-1")
    assert found.note == "" and found.described() == "$%g/h (controlplane.prices, us-east-1, read %s)" % (
        prices.on_demand_price(P4D), prices.price_date(P4D))
    # in another region the table's price is us-east-1's, and says so
    assert "the table's price is us-east-1's, not eu-west-1's" in pricing.price_of(P4D, "Training", "eu-west-1").note
    # the table has no hosting prices
    assert pricing.price_of("ml.g5.12xlarge", pricing.HOSTING, "us-east-1").usd_per_hour is None


def test_a_component_other_than_training_or_hosting_is_refused():
    with pytest.raises(ValueError, match="component must be one of Training, Hosting, got 'Notebook'"):
        pricing.request(P4D, "Notebook", "us-east-1")


def test_lmstack_plan_prices_a_region_from_the_price_list_and_says_where_the_price_came_from(capsys):
    from lmstack import plan

    argv = ["--preset", "gpt-125m", "--instance-type", P4D, "--instance-count", "2", "--region", "eu-west-1"]
    price_list = price_lists.training({P4D: 25.2513}, region="eu-west-1", effective_date="2026-10-01")
    assert plan.main(argv + ["--json"], clients=price_lists.clients(price_list)) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["instance"]["on_demand_usd_per_hour"] == 25.2513 and result["instance"]["price_region"] == "eu-west-1"
    timing = result["chosen"]["time"]
    assert timing["cost_on_demand_usd"] == pytest.approx(timing["hours"] * 2 * 25.2513)
    assert plan.main(argv, clients=price_lists.clients(price_list)) == 0
    assert "$25.2513/h on demand (AWS Price List, eu-west-1, effective 2026-10-01)" in capsys.readouterr().out
    # a Price List that cannot answer: the table's price, and why
    assert plan.main(argv, clients=price_lists.clients(PriceList(reachable=False))) == 0
    assert "$%g/h on demand (us-east-1, read %s; the table's, as the AWS Price List could not answer " \
           "(EndpointConnectionError" % (TABLE_P4D, prices.price_date(P4D)) in capsys.readouterr().out


TABLE_P4D = prices.on_demand_price(P4D)
