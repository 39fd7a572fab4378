"""What an execution's jobs cost: the bill the state machine asks the gate's function for when the run ends.

SageMaker bills a training job `BillableTimeInSeconds` x its instance count at the instance type's on-demand
price per hour; with managed spot the billable time already reflects the saving, `1 - BillableTimeInSeconds /
TrainingTimeInSeconds` (DescribeTrainingJob, SageMaker API reference: BillableTimeInSeconds). The price is the
one the gate used when it decided the run (`plan_prices`, in the plan as `prices`), so the bill and the plan
agree on it; a job whose price the plan lacks is priced from `controlplane.prices`' table, which the bill says.

`usage` (what the machine recorded of each job that ran, `stacks.state_machine.bill`): {job: {"name",
"status", "instance_type", "instance_count", "billable_seconds" (null: DescribeTrainingJob did not report
it, as for a job that never got its instances), "training_seconds", "metrics" (FinalMetricDataList)}}.
A job is any key: prepare, train, and whatever stage records its own (an evaluation job).

The goodput of a job that logs it (`lm.spec.job.format_goodput_log`, read by the metric definitions into
FinalMetricDataList): the seconds of its kept training steps over its billable seconds.

Pure Python, standard library only: no TensorFlow.
"""
import collections

from controlplane import prices, pricing

# The order the bill lists its jobs in; others follow in the order their names sort.
JOB_ORDER = ("prepare", "train", "evaluate")
KEPT_SECONDS_METRIC = "goodput:kept_step_seconds"
KEPT_TOKENS_METRIC = "goodput:kept_tokens"


def _price_entry(instance_type, instance_count, usd_per_hour, source, estimate_usd):
    return collections.OrderedDict([
        ("instance_type", instance_type), ("instance_count", instance_count), ("usd_per_hour", usd_per_hour),
        ("source", source), ("estimate_usd", None if estimate_usd is None else round(estimate_usd, 4))])


def table_source(instance_type):
    """Where the table's price of `instance_type` comes from, as the bill names it."""
    return "controlplane.prices table (%s, read %s)" % (prices.PRICE_REGION, prices.price_date(instance_type))


def _source(source, region, date):
    return "%s (%s%s)" % (source.split(" (")[0], region, ", %s" % date if date else "")


def plan_prices(config, plan, book):
    """The price of each job the run may start (`book`: the gate's `controlplane.pricing.Price`s by (type,
    component)), for the plan's `prices`: what the bill charges each at, and the plan's estimate of each."""
    entries = collections.OrderedDict()
    entries["train"] = _price_entry(config["instance_type"], config["instance_count"], plan["usd_per_instance_hour"],
                                    _source(plan["price_source"], plan["price_region"], plan["price_date"]),
                                    plan["cost_usd"])
    prepare = config["prepare"]
    if prepare["enabled"]:
        price = book[(prepare["instance_type"], pricing.TRAINING)]
        ceiling = None if price.usd_per_hour is None else (
            price.usd_per_hour * prepare["instance_count"] * prepare["max_runtime_seconds"] / 3600)
        entries["prepare"] = _price_entry(prepare["instance_type"], prepare["instance_count"], price.usd_per_hour,
                                          _source(price.source, price.region, price.effective_date), ceiling)
    evaluate = plan.get("evaluate")
    if evaluate:
        entries["evaluate"] = _price_entry(config["evaluate"]["instance_type"], 1, evaluate["usd_per_instance_hour"],
                                           _source(evaluate["price_source"], evaluate["price_region"],
                                                   evaluate["price_date"]), evaluate["max_cost_usd"])
    return entries


def check_prices_billed(decision, context):
    """The gate's check, after the prices were read (`check_prices`): the plan's `prices`, the bill's."""
    if decision.config["deploy"]["model_artifact"] is None:
        decision.plan["prices"] = plan_prices(decision.config, decision.plan, decision.prices)


def _metric(metrics, name):
    for metric in metrics or ():
        if metric.get("MetricName") == name and metric.get("Value") is not None:
            return float(metric["Value"])
    return None


def job_bill(job, used, price):
    """One job's line of the bill."""
    billable = used.get("billable_seconds")
    training = used.get("training_seconds")
    count = used["instance_count"]
    instance_seconds = (billable or 0) * count
    if price is None or price.get("usd_per_hour") is None:
        usd_per_hour = prices.on_demand_price(used["instance_type"])
        source, estimate = table_source(used["instance_type"]), None
    else:
        usd_per_hour, source, estimate = price["usd_per_hour"], price["source"], price.get("estimate_usd")
    usd = None if usd_per_hour is None else instance_seconds * usd_per_hour / 3600
    kept_seconds = _metric(used.get("metrics"), KEPT_SECONDS_METRIC)
    kept_tokens = _metric(used.get("metrics"), KEPT_TOKENS_METRIC)
    return collections.OrderedDict([
        ("job", job), ("name", used["name"]), ("status", used["status"]),
        ("instance_type", used["instance_type"]), ("instance_count", count),
        ("billable_seconds", billable), ("billable_reported", billable is not None),
        ("billable_instance_seconds", instance_seconds), ("training_seconds", training),
        ("spot_saving", round(1 - billable / training, 4) if billable is not None and training else None),
        ("usd_per_instance_hour", usd_per_hour), ("price_source", source),
        ("usd", None if usd is None else round(usd, 4)), ("estimate_usd", estimate),
        ("goodput", round(kept_seconds / billable, 4) if kept_seconds is not None and billable else None),
        ("kept_tokens", kept_tokens),
        ("usd_per_million_kept_tokens", round(usd / kept_tokens * 1e6, 6) if usd and kept_tokens else None),
    ])


def _ordered(usage):
    return sorted(usage, key=lambda job: (JOB_ORDER.index(job) if job in JOB_ORDER else len(JOB_ORDER), job))


def bill(usage, plan):
    """The bill of the jobs in `usage` at the prices of `plan` (the module docstring)."""
    plan_prices_ = (plan or {}).get("prices") or {}
    lines = [job_bill(job, usage[job], plan_prices_.get(job)) for job in _ordered(usage)]
    priced = [line["usd"] for line in lines if line["usd"] is not None]
    estimates = [line["estimate_usd"] for line in lines if line["estimate_usd"] is not None]
    result = collections.OrderedDict([
        ("jobs", lines),
        ("total_usd", round(sum(priced), 4) if len(priced) == len(lines) else None),
        ("estimate_usd", round(sum(estimates), 4) if estimates else None),
    ])
    result["text"] = text(result)
    return result


def _usd(value):
    return "unpriced" if value is None else "$%.2f" % value


def text(result):
    """The bill as one line, for the notification and the failure's cause."""
    parts = []
    for line in result["jobs"]:
        seconds = ("%d instance-s (%d s x %d)" % (line["billable_instance_seconds"], line["billable_seconds"],
                                                 line["instance_count"])
                   if line["billable_reported"] else "no billable time reported")
        price = "" if line["usd_per_instance_hour"] is None else " at $%.4f/h" % line["usd_per_instance_hour"]
        estimate = "" if line["estimate_usd"] is None else ", plan %s" % _usd(line["estimate_usd"])
        goodput = "" if line["goodput"] is None else ", goodput %.1f %%" % (100 * line["goodput"])
        parts.append("%s job %s %s: %s, %s%s%s%s" % (line["job"], line["name"], line["status"].lower(),
                                                  _usd(line["usd"]), seconds, price, estimate, goodput))
    estimate = "" if result["estimate_usd"] is None else " (plan %s)" % _usd(result["estimate_usd"])
    return "bill: total %s%s; %s" % (_usd(result["total_usd"]), estimate, "; ".join(parts))


def answer(event):
    """The gate function's answer to a bill event: {"bill": {"usage": ..., "plan": ...}}."""
    request = event["bill"]
    return bill(request.get("usage") or {}, request.get("plan"))
