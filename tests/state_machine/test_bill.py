"""The bill at the end of every execution that ran a job, on moto (issue 43 item 2)."""
import io
import json

import boto3
import price_lists
import pytest
import quota_tables
from state_machine.harness import StandInSettings

from controlplane import bill, gate, prices
from lmstack import start
from lmstack.local_sfn import REGION

INSTANCE_TYPE = "ml.g5.12xlarge"
COUNT = 2
BILLABLE = 5417
TRAINING = 6100
GOODPUT = [{"MetricName": bill.KEPT_SECONDS_METRIC, "Value": 4875.3},
           {"MetricName": bill.KEPT_TOKENS_METRIC, "Value": 9.8e8}]
ENDED = {"BillableTimeInSeconds": BILLABLE, "TrainingTimeInSeconds": TRAINING, "FinalMetricDataList": GOODPUT}
SCRIPTS = {
    "completed": [("InProgress", "Training", {}), ("Completed", "Completed", ENDED)],
    "failed": [("InProgress", "Training", {}), ("Failed", "Failed", dict(ENDED, FailureReason="AlgorithmError: boom"))],
    "stopped": [("InProgress", "Training", {}), ("Stopped", "Stopped", ENDED)],
}
RUN = {"instance_type": INSTANCE_TYPE, "instance_count": COUNT, "strategy": "horovod", "hyperparameters": {"max_steps": 200}}


def _expected_usd():
    return BILLABLE * COUNT * prices.on_demand_price(INSTANCE_TYPE) / 3600


def _train_line(result):
    (line,) = [line for line in result["jobs"] if line["job"] == "train"]
    return line


def _data_points():
    cloudwatch = boto3.client("cloudwatch", region_name=REGION)
    found = {}
    for metric in cloudwatch.list_metrics(Namespace="lmstack", MetricName="JobCostUSD")["Metrics"]:
        dimensions = {dimension["Name"]: dimension["Value"] for dimension in metric["Dimensions"]}
        statistics = cloudwatch.get_metric_statistics(
            Namespace="lmstack", MetricName="JobCostUSD", Dimensions=metric["Dimensions"],
            StartTime="2000-01-01T00:00:00Z", EndTime="2100-01-01T00:00:00Z", Period=86400, Statistics=["Sum"])
        found[dimensions["Job"]] = sum(point["Sum"] for point in statistics["Datapoints"])
    return found


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["completed", "failed", "stopped"])
def test_the_bill_charges_billable_seconds_times_instances_at_the_plans_price(deployment, ending):
    deployment.jobs.scripts.append(SCRIPTS[ending])
    run = deployment.run(RUN, name="bill-%s" % ending)
    expected = _expected_usd()
    if ending == "completed":
        assert run.status == "SUCCEEDED", run.description.get("cause")
        result = run.output["bill"]
        assert run.output["plan"]["prices"]["train"]["usd_per_hour"] == prices.on_demand_price(INSTANCE_TYPE)
        shown = io.StringIO()
        start.report_end(run.description, shown)  # lmstack.start --watch's last lines
        assert shown.getvalue().splitlines()[-1] == result["text"]
    else:
        assert run.status == "FAILED" and run.description["error"] == "TrainJobFailed"
        # a failed run has no output: its cause holds the bill's text, and the bill is in its last state
        assert ". %s. Its checkpoints are kept" % _bill_state(run)["text"] in run.description["cause"]
        result = _bill_state(run)
    (billed,) = run.gate_invocations(bills=True)  # the gate's function computed it
    assert billed.payload["total_usd"] == result["total_usd"]
    line = _train_line(result)
    assert line["status"] == ending.capitalize()
    assert line["billable_instance_seconds"] == BILLABLE * COUNT
    assert round(line["usd"], 2) == round(expected, 2)
    assert round(result["total_usd"], 2) == round(expected, 2)
    assert line["goodput"] == pytest.approx(4875.3 / BILLABLE, abs=1e-4)
    assert line["spot_saving"] == pytest.approx(1 - BILLABLE / TRAINING, abs=1e-4)
    assert line["usd_per_million_kept_tokens"] == pytest.approx(expected / 980, rel=1e-3)
    assert "$%.2f" % expected in result["text"]
    assert any("$%.2f" % expected in message and "bill:" in message for message in deployment.notifications())
    assert _data_points() == {"train": pytest.approx(round(expected, 4))}


def _bill_state(run):
    """What the execution held at $.bill when its last state was entered."""
    entered = [event for event in run.events if event["type"].endswith("StateEntered")]
    return json.loads(entered[-1]["stateEnteredEventDetails"]["input"])["bill"]


@pytest.mark.slow
def test_a_job_that_reports_no_billable_time_is_billed_nothing_and_says_so(deployment):
    deployment.jobs.scripts.append([("Failed", "Failed", {"FailureReason": "ClientError: no such image"})])
    run = deployment.run(RUN, name="bill-unreported")
    result = _bill_state(run)
    line = _train_line(result)
    assert line["billable_reported"] is False and line["usd"] == 0
    assert "no billable time reported" in run.description["cause"]


def test_the_bill_lists_every_job_it_is_given_with_its_price_and_the_plans_estimate():
    plan = {"prices": {"train": {"usd_per_hour": 10.0, "source": "AWS Price List (us-east-1, 2026-12-01)",
                                 "estimate_usd": 12.5}}}
    usage = {"evaluate": {"name": "e", "status": "Completed", "instance_type": "ml.g5.xlarge", "instance_count": 1,
                          "billable_seconds": 360, "training_seconds": 360, "metrics": []},
             "train": {"name": "t", "status": "Completed", "instance_type": "ml.g5.xlarge", "instance_count": 3,
                       "billable_seconds": 1200, "training_seconds": 1500, "metrics": []}}
    result = bill.bill(usage, plan)
    assert [line["job"] for line in result["jobs"]] == ["train", "evaluate"]
    train, evaluate = result["jobs"]
    assert train["usd"] == 10.0 and train["estimate_usd"] == 12.5 and "Price List" in train["price_source"]
    # a job the plan has no price for is priced from the table, which the line names
    assert evaluate["usd"] == pytest.approx(360 * prices.on_demand_price("ml.g5.xlarge") / 3600, abs=1e-4)
    assert "controlplane.prices table" in evaluate["price_source"]
    assert result["total_usd"] == pytest.approx(train["usd"] + evaluate["usd"])


def test_the_bill_charges_the_price_the_gate_read_from_the_price_list():
    price = 25.2513  # what the stand-in's Price List answers for ml.p4d.24xlarge: not the table's
    clients = price_lists.clients(price_lists.training({"ml.p4d.24xlarge": price}, effective_date="2026-10-01"),
                                  others=quota_tables.clients(quota_tables.account()))
    decision = gate.decide({"preset": "gpt-125m", "strategy": "smddp", "instance_type": "ml.p4d.24xlarge",
                            "instance_count": 2, "hyperparameters": {"global_batch_size": 64, "max_steps": 2000}},
                           gate.Context(gate.Deployment.of(StandInSettings()), clients=clients))
    planned = decision.plan["prices"]["train"]
    assert planned["usd_per_hour"] == price and planned["source"] == "AWS Price List (us-east-1, 2026-10-01)"
    assert planned["estimate_usd"] == pytest.approx(decision.plan["cost_usd"], abs=1e-4)
    usage = {"train": {"name": "t", "status": "Completed", "instance_type": "ml.p4d.24xlarge", "instance_count": 2,
                       "billable_seconds": BILLABLE, "training_seconds": TRAINING, "metrics": []}}
    (line,) = bill.bill(usage, decision.plan)["jobs"]
    assert round(line["usd"], 2) == round(BILLABLE * 2 * price / 3600, 2) and "Price List" in line["price_source"]
