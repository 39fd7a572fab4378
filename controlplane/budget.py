"""What a run may cost (execution input `budget_usd`) and when its training job stops itself.

What a run costs, for the budget: its training job (instance count x price per instance-hour x the hours it
runs: the plan's training time plus the job's start-up and its last save, `stop_margin_seconds`), its prepare
job when it has one (at most `prepare.max_runtime_seconds`, on demand: it may be skipped at run time, but
the budget holds whether it runs or not) and the warm pool kept after training (`keep_alive_seconds`). With
spot the price is the planner's estimate (`controlplane.prices.SPOT_DISCOUNT`, labelled one): the budget holds
only as far as that estimate does. The endpoint bills every hour until it is deleted: its first
`deploy.budget_hours` hours count (default 0: its price is stated, not budgeted).

The prices are the gate's (`book`: {(instance_type, component): controlplane.pricing.Price}, read from the AWS
Price List when the gate asks AWS); a type the book lacks is priced from the table (`controlplane.pricing.from_table`).

`check(config, plan, label)`: over budget, a BudgetError with the estimate, the budget and what would fit
(fewer steps, spot, another type, which `alternatives` finds); else the training job's MaxRuntimeInSeconds
capped so that count x price x MaxRuntime stays within what the prepare job and the warm pool leave
(MaxWaitTimeInSeconds stays twice MaxRuntime, as for every spot run: waiting for capacity is not billed).

Every run, budget or not, gets the job's own stop: SageMaker stops a job at MaxRuntimeInSeconds with SIGTERM
and kills it about 120 s later, and the training toolkit does not forward SIGTERM to MPI workers, so the
work since the last periodic checkpoint would be lost. The hyperparameter `stop_after_seconds`
(`stop_after_seconds`: MaxRuntime less the start-up allowance) tells lm.training.train its
deadline; it ends training after the last step it can finish and save before it, with a checkpoint.

Pure Python, no TensorFlow.
"""
import dataclasses
import math

from controlplane import evaluation, presets, prices, pricing
from lm.spec import job
from lm.spec.families import parameter_count
from lm.spec.hardware import INSTANCES

# What a checkpoint holds per parameter: float32 weights and AdamW's two float32 moments.
CHECKPOINT_BYTES_PER_PARAMETER = 12
# MaxRuntime counts from the instances' start (billing starts there too: DescribeTrainingJob TrainingStartTime):
# the image pull and the toolkit come before the training process's clock starts. An allowance, not measured
# here (no account): a DLC image is several GB.
JOB_STARTUP_SECONDS = 600


class BudgetError(ValueError):
    """The run cannot be held to the budget; the message says why and what would fit."""


@dataclasses.dataclass(frozen=True)
class Costs:
    """The parts of a run's cost, in USD, and the hourly price of its training job."""
    training: float
    prepare: float
    warm_pool: float
    usd_per_hour: float  # the training job's: instance count x price per instance-hour (spot: the estimate)
    evaluation: float = 0.0  # the evaluation job's MaxRuntime at its price (evaluate.enabled)
    endpoint: float = 0.0  # the endpoint's first deploy.budget_hours hours

    @property
    def total(self):
        return self.training + self.prepare + self.warm_pool + self.evaluation + self.endpoint


def save_seconds(preset):
    """How long the last save of a run of `preset` may take (`lm.spec.job.save_seconds` of its checkpoint)."""
    return job.save_seconds(parameter_count(presets.ALL_PRESETS[preset]) * CHECKPOINT_BYTES_PER_PARAMETER)


def stop_after_seconds(max_runtime_seconds):
    """The deadline a job with this MaxRuntimeInSeconds is given (0: none, when the start-up takes it all)."""
    return max(0, max_runtime_seconds - JOB_STARTUP_SECONDS)


def stop_margin_seconds(config, plan):
    """The seconds of MaxRuntime that are not training: the start-up before the training process, the step
    during which the deadline falls, and the last save."""
    step = plan["global_batch"] * plan["seq_len"] / plan["tokens_per_second"] if plan.get("tokens_per_second") else 0
    return JOB_STARTUP_SECONDS + int(math.ceil(step)) + save_seconds(config["preset"])


def hourly_price(instance_type, spot, label, book=None, component=pricing.TRAINING):
    """USD per instance-hour of `instance_type` for `component` (spot: the estimate), from `book` or the table;
    BudgetError naming where it was looked for when no source has one."""
    found = (book or {}).get((instance_type, component)) or pricing.from_table(
        instance_type, component, prices.PRICE_REGION)
    if found.usd_per_hour is None:
        looked = "the AWS Price List: %s; " % found.note if found.note else ""
        raise BudgetError(
            "budget_usd: %s %s has no %s price (looked for in %s%s: %s), so the run cannot be held to a budget; "
            "drop budget_usd or choose a type with a price%s" % (
                label, instance_type, component.lower(), looked, found.source.split(" (")[0],
                prices.RECORDS[instance_type].source.split(":")[0] if instance_type in prices.RECORDS
                else "training prices only", "" if component != pricing.TRAINING else ": " + ", ".join(
                    name for name in prices.ON_DEMAND_USD_PER_HOUR if INSTANCES[name].gpus)))
    return prices.spot_cost(found.usd_per_hour) if spot else found.usd_per_hour


def costs(config, plan, label="instance_type", book=None):
    """The Costs of the run `config` asks for, planned as `plan` (the gate's plan summary), at `book`'s prices."""
    if config["training_plan_arn"] is not None:
        raise BudgetError("budget_usd with training_plan_arn: the run uses a training plan's reserved capacity, whose "
                          "price the gate does not know; drop one of them")
    per_hour = hourly_price(config["instance_type"], config["spot"], label, book) * config["instance_count"]
    # the job runs as long as the plan says plus its margin, or until its MaxRuntime, whichever comes first
    seconds = min((plan["hours"] or 0.0) * 3600 + stop_margin_seconds(config, plan), config["max_runtime_seconds"])
    prepare = config["prepare"]
    prepare_usd = 0.0
    if prepare["enabled"]:
        prepare_usd = (hourly_price(prepare["instance_type"], False, "prepare.instance_type", book)
                       * prepare["instance_count"] * prepare["max_runtime_seconds"] / 3600)
    warm = per_hour * config["keep_alive_seconds"] / 3600
    return Costs(per_hour * seconds / 3600, prepare_usd, warm, per_hour, evaluation_usd(config, book),
                 endpoint_cost(config["deploy"], book))


def evaluation_usd(config, book=None):
    """The most the evaluation job may cost: its MaxRuntime at its on-demand price (0 without evaluate)."""
    evaluate = config.get("evaluate")
    if not evaluate or not evaluate["enabled"]:
        return 0.0
    return evaluation.max_cost_usd(evaluate, hourly_price(evaluate["instance_type"], False, "evaluate.instance_type",
                                                          book))


def endpoint_cost(deploy, book=None):
    """What the endpoint's first deploy.budget_hours hours cost (0 when none are budgeted)."""
    if not deploy["enabled"] or not deploy["budget_hours"]:
        return 0.0
    return (hourly_price(deploy["instance_type"], False, "deploy.instance_type", book, pricing.HOSTING)
            * deploy["instance_count"] * deploy["budget_hours"])


def max_runtime_seconds(config, found, budget):
    """The most seconds the training job may run within `budget` after the prepare and evaluation jobs, the warm
    pool and the endpoint's budgeted hours."""
    return int((budget - found.prepare - found.warm_pool - found.evaluation - found.endpoint) / found.usd_per_hour
               * 3600)


def described(found, spot):
    parts = ["training $%.2f at $%.2f/h%s" % (found.training, found.usd_per_hour, " (spot, an estimate)" if spot else "")]
    if found.prepare:
        parts.append("the prepare job at most $%.2f" % found.prepare)
    if found.warm_pool:
        parts.append("the warm pool $%.2f" % found.warm_pool)
    if found.evaluation:
        parts.append("the evaluation job at most $%.2f" % found.evaluation)
    if found.endpoint:
        parts.append("the endpoint's first deploy.budget_hours $%.2f" % found.endpoint)
    return "$%.2f (%s)" % (found.total, ", ".join(parts))


def fewer_steps(config, plan, found, budget):
    """The most steps the budget pays for, or None."""
    steps = plan.get("steps")
    if not steps or not plan.get("hours"):
        return None
    training_seconds = max_runtime_seconds(config, found, budget) - stop_margin_seconds(config, plan)
    fitting = int(training_seconds / (plan["hours"] * 3600 / steps))
    return fitting if 0 < fitting < steps else None


def refusal(config, plan, found, budget, label, alternatives):
    """The BudgetError of a run over budget: its estimate, the budget and what would fit."""
    hints = []
    steps = fewer_steps(config, plan, found, budget)
    if steps:
        hints.append("hyperparameters.max_steps %d (of %d)" % (steps, plan["steps"]))
    hints.extend(alternatives)
    hints.append("budget_usd %.2f" % (math.ceil(found.total * 100) / 100))
    return BudgetError("budget_usd %.2f: the run on %s %s is estimated at %s; what would fit: %s" % (
        budget, label, config["instance_type"], described(found, config["spot"]), "; ".join(hints)))


def check(config, plan, label="instance_type", alternatives=lambda: [], book=None):
    """The config with its MaxRuntime capped to `config["budget_usd"]`, and a note; BudgetError when the
    estimate exceeds it (`alternatives()`: phrases of other runs that would fit, asked only then)."""
    budget = config["budget_usd"]
    found = costs(config, plan, label, book)
    if found.total > budget:
        raise refusal(config, plan, found, budget, label, alternatives())
    cap = max_runtime_seconds(config, found, budget)
    capped = dict(config, max_runtime_seconds=min(config["max_runtime_seconds"], cap))
    note = "budget_usd %.2f: the run is estimated at %s; the training job may run %d s (MaxRuntimeInSeconds%s)" % (
        budget, described(found, config["spot"]), capped["max_runtime_seconds"],
        ", capped from max_runtime_seconds %d" % config["max_runtime_seconds"]
        if capped["max_runtime_seconds"] < config["max_runtime_seconds"] else "")
    return capped, found, note
