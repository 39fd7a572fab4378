"""The gate: one decision about an execution input, made by the same Python whoever asks.

The state machine's first state invokes `handler` as an AWS Lambda function (stacks.gate stages this
package and `lm.spec` as its code); `lmstack.start` calls `decide` before it starts anything. Either
way the input is checked against the schema (`controlplane.inputs`), the rules between fields
(`controlplane.rules`), the names AWS restricts, and planned exactly as asked with
`controlplane.planner.plan`, the function `python -m lmstack.plan` prints: the global batch, sequence
length, precision, strategy and instance count of the input. The answer is the input with its
defaults and the plan (`plan_summary`), or a refusal naming the field and what it allows, which the
state machine's Fail state shows as the execution's cause. Before any job it also prices every instance type
it plans or budgets (`controlplane.pricing`: the AWS Price List for the stack's region, else the table, said so),
holds the run to the account's SageMaker quotas (`controlplane.quotas`, asked of Service Quotas) and to
`budget_usd` (`controlplane.budget`: MaxRuntime capped, the job's deadline), and plans a deploy-only run
(`deploy.model_artifact`) as serving only.

A decision is a list of checks (CHECKS), each `check(decision, context)`: it reads `decision.given` and
`decision.config`, refuses with `Refusal(message, error)`, or sets `decision.config`, `decision.plan`
and `decision.notes` (lines for the run's notification). `context` holds what a check may need from
outside the input: the deployment's settings (`Deployment`), the execution's name and a factory of
AWS clients (`context.client("service-quotas")`: boto3's in the Lambda function, the session's in
`lmstack.start`, None where nothing may ask AWS) and the stack's region (the function's AWS_REGION). A new
check is one function in CHECKS.

The event of the Lambda function: {"input": <execution input>, "execution_name": <name>, "launch": k},
k the instance type to plan for: 0 for `instance_type`, k for `fallback_instance_types[k - 1]` (the
state machine asks again when a type's capacity errors outlast their retries; the plan then says what
changed). Its answer: {"ok": true, "config", "plan", "notes", "launches"} or {"ok": false, "error",
"cause"}; an exception is the function's error (the machine fails with GateFailed). The machine asks the same
function for an execution's bill at its end ({"bill": {"usage", "plan"}}: `controlplane.bill`).

Pure Python, standard library only (boto3 only where a check calls AWS): no TensorFlow.
"""
import collections
import dataclasses
import json
import os
import re
from typing import Any, Callable, Optional

from controlplane import (aws_clients, bill, bucket_layout, budget, checkpoint_plan, containers, evaluation, history,
                          inputs, planner, presets, prices, pricing, quotas, rules)
from controlplane.inputs import check_object, with_defaults
from lm.spec import conditions, drill, hardware, job
from lm.spec.fields import check

INVALID = conditions.INVALID
PLAN_REJECTED = "PlanRejected"  # the planner says the run cannot fit or run (check_plan)
QUOTA_TOO_LOW = "QuotaTooLow"  # a SageMaker quota of the account is below what the run needs (check_quotas)
OVER_BUDGET = "OverBudget"  # the run's estimate exceeds budget_usd, or it cannot be held to it (check_budget)
# The gate's time with AWS, inside its function's 60 s (stacks.gate_code.TIMEOUT_SECONDS), the rest for planning:
# one call at most AWS_CALL_SECONDS (retries included), and no page of quotas asked for after QUOTA_SECONDS.
AWS_CALL_SECONDS = 20
QUOTA_SECONDS = 20
# How many other instance types a refusal over budget names that would fit.
BUDGET_ALTERNATIVES = 2
# deploy.model_artifact: a training job's model.tar.gz, or a Hugging Face directory (the state machine checks
# that the bucket is the stack's artifact bucket; S3 bucket names: 3-63 lower-case letters, digits, . and -).
_BUCKET = r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/"
MODEL_ARCHIVE = re.compile(r"^%s%s[^/*?]+/output/model\.tar\.gz$" % (_BUCKET, re.escape(bucket_layout.OUTPUT_PREFIX)))
MODEL_DIRECTORY = re.compile(r"^%s%s[^*?]+/$" % (_BUCKET, re.escape(bucket_layout.INIT_PREFIX)))
ENVIRONMENT_KEY = "LMSTACK_DEPLOYMENT"  # the Lambda function's environment: the Deployment as JSON
# What a fallback changes of the plan, in the order the notification names them.
PLAN_CHANGES = ("instance_type", "strategy", "per_device_batch", "micro_batch", "mp_parameters", "recompute",
                "memory_gib", "usd_per_instance_hour", "hours", "cost_usd")


class Refusal(Exception):
    """The input cannot run: `message` names the field and what it allows; `error` is the execution's error."""

    def __init__(self, message, error=INVALID):
        super().__init__(message)
        self.error = error


@dataclasses.dataclass(frozen=True)
class Deployment:
    """What the gate knows of the deployment: the settings the input's defaults and checks read
    (`stacks.settings.Settings` has each of them)."""
    name_prefix: str
    runtimes: tuple
    default_preset: str
    default_strategy: str
    default_instance_type: str
    default_instance_count: int
    default_max_runtime_seconds: int
    default_hyperparameters: tuple  # (name, value) pairs
    spot: bool
    dataset_directory: str
    inter_container_traffic_encryption: bool

    @classmethod
    def of(cls, settings):
        values = {field.name: getattr(settings, field.name) for field in dataclasses.fields(cls)}
        return cls._typed(values)

    @classmethod
    def _typed(cls, values):
        """Lists (as JSON gives them back) as the tuples the fields hold."""
        return cls(**dict(values, runtimes=tuple(values["runtimes"]),
                          default_hyperparameters=tuple(tuple(pair) for pair in values["default_hyperparameters"])))

    def environment(self):
        """The Lambda function's environment variables that carry it."""
        return {ENVIRONMENT_KEY: json.dumps(dataclasses.asdict(self), sort_keys=True)}

    @classmethod
    def from_environment(cls, environ):
        if ENVIRONMENT_KEY not in environ:
            raise KeyError("the gate's environment has no %s (stacks.gate sets it)" % ENVIRONMENT_KEY)
        return cls._typed(json.loads(environ[ENVIRONMENT_KEY]))


def aws_client(service, region_name=None):
    """A boto3 client, for checks that ask AWS (the Lambda runtime has boto3; nothing else imports it), whose
    calls end within AWS_CALL_SECONDS (`controlplane.aws_clients`); in `region_name` (default the function's: the
    Price List answers in a few regions only)."""
    return aws_clients.client(service, region_name, AWS_CALL_SECONDS)


def from_aws_sdk(error):
    """Whether `error` is the AWS SDK's (botocore's ClientError or BotoCoreError: refused, throttled, no
    endpoint, no credentials) or a runtime without the SDK: AWS did not answer, as opposed to a bug."""
    if isinstance(error, ImportError):
        return (error.name or "").split(".")[0] in ("boto3", "botocore")
    return any(cls.__module__.split(".")[0] == "botocore" for cls in type(error).__mro__)


@dataclasses.dataclass
class Context:
    """`clients`: a factory of AWS clients by service name (`aws_client` in the Lambda function, the session's in
    `lmstack.start`), or None, the default, where the caller does not ask AWS (`lmstack.start --dry-run`, tests):
    checks that would ask AWS then note that they did not. `region`: the stack's (its prices are that region's;
    None: controlplane.prices.PRICE_REGION)."""
    deployment: Deployment
    execution_name: Optional[str] = None
    clients: Optional[Callable[..., Any]] = None
    region: Optional[str] = None

    def client(self, service):
        return self.clients(service)


@dataclasses.dataclass
class Decision:
    given: Any
    launch: int = 0
    config: Optional[dict] = None
    plan: Optional[dict] = None
    launches: int = 1
    notes: list = dataclasses.field(default_factory=list)
    # (config, plan) of every launch check_plan planned: all of the input's types at launch 0, else up to `launch`
    planned: list = dataclasses.field(default_factory=list)
    # {(instance_type, component): controlplane.pricing.Price} of every type the run plans or budgets (check_prices)
    prices: dict = dataclasses.field(default_factory=dict)

    def answer(self):
        return collections.OrderedDict([("ok", True), ("config", self.config), ("plan", self.plan),
                                        ("notes", self.notes), ("launches", self.launches)])


# ---- the checks, in order ----

def _typed(fields, values):
    """`values` (checked, with defaults) with every number as its field's type: 2.0 given for an integer is 2."""
    typed = collections.OrderedDict()
    for spec in fields:
        value = values[spec.name]
        typed[spec.name] = _typed(spec.fields, value) if spec.type is dict else check(spec, value, spec.name)
    return typed


def check_fields(decision, context):
    """The schema: unknown fields, types, bounds, choices; then the defaults, and the hyperparameters as the
    runtime reads them (`lm.spec.job.validate_hyperparameters`, which applies the job's rules too)."""
    given = decision.given
    if not isinstance(given, dict):
        raise Refusal("the input must be a JSON object, got %s" % json.dumps(given))
    fields = inputs.schema(context.deployment)
    try:
        check_object(fields, given)
        config = _typed(fields, with_defaults(fields, json.loads(json.dumps(given))))
        # The preset implies its family: an input that names no model is of the preset's
        # (a model the preset is not of is refused by controlplane.rules.preset_family_rules).
        config["hyperparameters"]["model"] = given.get("hyperparameters", {}).get(
            "model", presets.preset_family(config["preset"]))
        job.validate_hyperparameters(dict(given.get("hyperparameters", {}), preset=config["preset"],
                                          strategy=config["strategy"], model=config["hyperparameters"]["model"]))
    except ValueError as error:
        raise Refusal(str(error))
    decision.config = config


def deploy_only(config):
    """Whether the run serves an existing model (deploy.model_artifact) and trains nothing."""
    return config["deploy"][inputs.MODEL_ARTIFACT] is not None


def check_deploy_only(decision, context):
    """deploy.model_artifact: an input that only deploys gives the preset (the model the artifact holds), deploy
    and hyperparameters.model, nothing for training; the artifact is a training job's model.tar.gz, or for tgi
    and lmi a Hugging Face directory."""
    config = decision.config
    if not deploy_only(config):
        return
    given = decision.given
    extra = [name for name in given if name not in ("preset", "deploy", "hyperparameters")]
    extra += ["hyperparameters.%s" % name for name in given.get("hyperparameters", {}) if name != "model"]
    if extra:
        raise Refusal("deploy.model_artifact serves an existing model and starts no prepare or training job: %s "
                      "%s for those; a deploy-only input gives only %s" % (
                          ", ".join(extra), "is" if len(extra) == 1 else "are", ", ".join(inputs.DEPLOY_ONLY_FIELDS)))
    deploy, artifact = config["deploy"], config["deploy"][inputs.MODEL_ARTIFACT]
    if not deploy["enabled"]:
        raise Refusal("deploy.model_artifact needs deploy.enabled true: serving it is all the run does")
    if MODEL_DIRECTORY.match(artifact):
        if deploy["container"] not in containers.HF_CONTAINERS:
            raise Refusal("deploy.model_artifact %s is a Hugging Face directory, which deploy.container %s or %s "
                          "serves; deploy.container %s serves a training job's model.tar.gz" % (
                              artifact, containers.HF_CONTAINERS[0], containers.HF_CONTAINERS[1], deploy["container"]))
    elif not MODEL_ARCHIVE.match(artifact):
        raise Refusal("deploy.model_artifact must be a training job's model.tar.gz (s3://<artifact bucket>/%s<job>/output/"
                      "model.tar.gz) or, for deploy.container tgi or lmi, a Hugging Face directory (s3://<artifact "
                      "bucket>/%s<name>/), got %s" % (bucket_layout.OUTPUT_PREFIX, bucket_layout.INIT_PREFIX, json.dumps(artifact)))
    elif deploy["container"] in containers.HF_CONTAINERS:
        decision.notes.append("deploy.container %s serves the Hugging Face files in %s: the training job that wrote "
                              "it must have had hyperparameters.export_hf true, or the endpoint fails to start" % (
                                  deploy["container"], artifact))


def check_fallback_instance_types(decision, context):
    """fallback_instance_types: distinct instance types, at most MAX_FALLBACK_INSTANCE_TYPES, not instance_type."""
    config = decision.config
    value = config[inputs.FALLBACK_FIELD]
    allowed = "a list of at most %d instance types other than instance_type, each one of %s" % (
        inputs.MAX_FALLBACK_INSTANCE_TYPES, ", ".join(hardware.INSTANCES))
    if (not isinstance(value, (list, tuple)) or len(value) > inputs.MAX_FALLBACK_INSTANCE_TYPES
            or any(item not in hardware.INSTANCES for item in value)
            or len(set(value) | {config["instance_type"]}) != len(value) + 1):
        raise Refusal("%s must be %s, got %r" % (inputs.FALLBACK_FIELD, allowed, value))
    config[inputs.FALLBACK_FIELD] = list(value)
    decision.launches = 1 + len(value)
    if not 0 <= decision.launch < decision.launches:
        raise Refusal("launch %r: this input has %d instance types" % (decision.launch, decision.launches))


def check_rules(decision, context):
    """Every rule between fields (`controlplane.rules.cross_field_rules` for the deployment's images); a drill's
    faults as the training job reads them (lm.spec.drill)."""
    message = conditions.broken(rules.cross_field_rules(context.deployment.runtimes), decision.config)
    if message:
        raise Refusal(message)
    try:
        drill.parse_faults(decision.config["drill"]["faults"], "drill.faults")
    except ValueError as error:
        raise Refusal(str(error))


def check_names(decision, context):
    """The names AWS restricts (`controlplane.rules.name_rules`): the endpoint's, the execution's."""
    for found in rules.name_rules(context.deployment.name_prefix):
        if found.path == rules.EXECUTION_NAME:
            value = context.execution_name
            if value is None:
                continue  # lmstack.start checks the name it starts the execution with
        else:
            value = conditions.value_at(decision.config, found.path)
        message = rules.name_problem(found, value)
        if message:
            raise Refusal(message)


def check_plan(decision, context):
    """The run planned as asked on `instance_type`, refused where the runtime would refuse its batch or the
    planner says it cannot fit or run; each fallback type re-planned (`fallback_launch`), refused where none
    fits. The decision's config and plan are those of the launch it asks for; a fallback's plan says what
    changed from the launch before it."""
    config = decision.config
    if deploy_only(config):
        decision.plan = collections.OrderedDict([
            ("deploy_only", True), ("model_artifact", config["deploy"][inputs.MODEL_ARTIFACT]),
            ("preset", config["preset"]), ("model_config", presets.model_config(config["preset"])), ("warnings", [])])
        return
    launches = [(config, exact_plan(config, context.deployment))]
    fallbacks = config[inputs.FALLBACK_FIELD]
    # The first launch checks every fallback now, before any job; a fallback needs the launches up to it.
    for index, instance_type in enumerate(fallbacks[:decision.launch or len(fallbacks)]):
        launches.append(fallback_launch(config, instance_type, "%s[%d]" % (inputs.FALLBACK_FIELD, index),
                                        context.deployment))
    decision.planned = launches
    decision.config, decision.plan = launches[decision.launch]
    decision.notes.extend("lmstack.plan: %s" % warning for warning in decision.plan["warnings"])
    if decision.launch:
        before = launches[decision.launch - 1][1]
        decision.plan["changes"] = plan_changes(before, decision.plan)


def _launch_labels(config):
    return ["instance_type"] + ["%s[%d]" % (inputs.FALLBACK_FIELD, index)
                                for index in range(len(config[inputs.FALLBACK_FIELD]))]


def check_budget(decision, context):
    """budget_usd (`controlplane.budget`): each launch planned (at launch 0 every type of the input) is refused
    when its estimate exceeds the budget, with what would fit; the launch's MaxRuntimeInSeconds is capped to it.
    Then, budget or not, the job's deadline (hyperparameter stop_after_seconds): MaxRuntime less its start-up."""
    config = decision.config
    if deploy_only(config):
        return  # no job; budget_usd was refused with the other training fields
    if config["budget_usd"] is not None:
        labels = _launch_labels(config)
        for index, (launch, plan) in enumerate(decision.planned):
            if decision.launch and index != decision.launch:
                continue  # launch 0 held the types before this one to the budget
            label = labels[index]
            try:
                capped, costs, note = budget.check(launch, plan, label, alternatives=lambda: budget_alternatives(
                    launch, label, context.deployment, decision.prices), book=decision.prices)
            except budget.BudgetError as error:
                raise Refusal(str(error), OVER_BUDGET)
            if index == decision.launch:
                decision.config = config = capped
                decision.plan["budget"] = collections.OrderedDict([
                    ("budget_usd", config["budget_usd"]), ("estimate_usd", round(costs.total, 2)),
                    ("training_usd", round(costs.training, 2)), ("prepare_usd", round(costs.prepare, 2)),
                    ("warm_pool_usd", round(costs.warm_pool, 2)), ("evaluation_usd", round(costs.evaluation, 2)),
                    ("endpoint_usd", round(costs.endpoint, 2)),
                    ("usd_per_hour", round(costs.usd_per_hour, 4)),
                    ("max_runtime_seconds", config["max_runtime_seconds"])])
                decision.notes.append(note)
        if config["deploy"]["enabled"] and not config["deploy"]["budget_hours"]:
            decision.notes.append("budget_usd counts the jobs, not the endpoint: %s bills every hour it runs, until "
                                  "deleted (deploy.budget_hours counts its first hours)" % config["deploy"][
                                      "instance_type"])
    else:
        decision.plan["budget"] = None
    stop_after = budget.stop_after_seconds(config["max_runtime_seconds"])
    decision.plan["stop_after_seconds"] = stop_after
    decision.plan["save_seconds"] = budget.save_seconds(config["preset"])
    if stop_after == 0:
        decision.notes.append("max_runtime_seconds %d leaves the job no time after its start-up (%d s): it cannot stop "
                              "itself with a checkpoint before SageMaker stops it" % (
                                  config["max_runtime_seconds"], budget.JOB_STARTUP_SECONDS))


def budget_alternatives(config, label, deployment, book=None):
    """Phrases of runs like `config` that fit its budget: with spot, or on another type with a price (the
    cheapest BUDGET_ALTERNATIVES, each planned as a fallback type would be)."""
    found = []
    if not config["spot"]:
        spot = dict(config, spot=True)
        try:
            plan = exact_plan(spot, deployment)
            costs = budget.costs(spot, plan, book=book)
            if costs.total <= config["budget_usd"]:
                found.append("spot: true (estimated $%.2f, %s)" % (costs.total, prices.SPOT_BASIS))
        except (Refusal, budget.BudgetError):
            pass
    others = []
    for instance_type in prices.ON_DEMAND_USD_PER_HOUR:
        if instance_type == config["instance_type"] or not hardware.INSTANCES[instance_type].gpus:
            continue
        try:
            other, plan = fallback_launch(config, instance_type, "instance_type", deployment)
            costs = budget.costs(other, plan, book=book)
        except (Refusal, budget.BudgetError):
            continue
        if costs.total <= config["budget_usd"]:
            others.append((costs.total, "%s %s (%s, estimated $%.2f)" % (
                label.split("[")[0] if label == "instance_type" else label, instance_type, other["strategy"],
                costs.total)))
    found.extend(phrase for _, phrase in sorted(others)[:BUDGET_ALTERNATIVES])
    return found


def check_evaluate(decision, context):
    """evaluate.* (`controlplane.evaluation`): its tasks, their data, its instance type's memory; its plan."""
    try:
        decision.plan["evaluate"] = evaluation.check(decision.config, deploy_only(decision.config))
    except evaluation.EvaluateError as error:
        raise Refusal(str(error))


def check_prices(decision, context):
    """The on-demand price of every instance type the run plans or budgets (`controlplane.pricing`): each training
    type, the prepare and evaluation jobs' for training, the endpoint's for hosting, in the stack's region, from the AWS Price
    List when this caller asks AWS (within pricing.TIME_LIMIT_SECONDS), else from the table. Each plan's costs
    are repriced with its type's; the plan's `endpoint` holds the endpoint's hourly price; the notes say which
    price was used and where it came from."""
    config = decision.config
    wanted = [(launch["instance_type"], pricing.TRAINING) for launch, _ in decision.planned]
    if config["prepare"]["enabled"] and not deploy_only(config):
        wanted.append((config["prepare"]["instance_type"], pricing.TRAINING))
    if config["deploy"]["enabled"]:
        wanted.append((config["deploy"]["instance_type"], pricing.HOSTING))
    if decision.plan.get("evaluate"):
        wanted.append((config["evaluate"]["instance_type"], pricing.TRAINING))
    decision.prices = pricing.prices_of(wanted, context.region or prices.PRICE_REGION, context.clients)
    if decision.plan.get("evaluate"):
        evaluation.reprice(decision.plan["evaluate"], config["evaluate"],
                           decision.prices[(config["evaluate"]["instance_type"], pricing.TRAINING)])
    for launch, plan in decision.planned:
        pricing.reprice(plan, decision.prices[(launch["instance_type"], pricing.TRAINING)], launch["spot"])
    if decision.launch:
        decision.plan["changes"] = plan_changes(decision.planned[decision.launch - 1][1], decision.plan)
    if config["deploy"]["enabled"]:
        decision.plan["endpoint"] = pricing.endpoint_plan(
            config["deploy"], decision.prices[(config["deploy"]["instance_type"], pricing.HOSTING)])
    if context.clients is not None:
        decision.notes.extend(pricing.note(price) for price in decision.prices.values())


def check_serving(decision, context):
    """The Environment of the serving container for the preset and deploy.instance_type (tgi, lmi:
    `controlplane.containers.environment`; None for lmstack's own server or without deploy): the deploy
    stage's CreateModel sends it. A pair the container cannot serve was refused by the rules."""
    deploy = decision.config["deploy"]
    environment = None
    if deploy["enabled"] and deploy["container"] in containers.HF_CONTAINERS:
        config = presets.ALL_PRESETS[decision.config["preset"]]
        shards, reason = containers.gpu_shards(deploy["container"], config, deploy["instance_type"])
        if shards is None:
            raise Refusal("deploy.container %s cannot serve preset %s on deploy.instance_type %s: %s" % (
                deploy["container"], decision.config["preset"], deploy["instance_type"], reason))
        environment = containers.environment(deploy["container"], config, shards)
    decision.plan["serving_environment"] = environment


def check_history(decision, context):
    """How long the job monitor may wait between polls (`controlplane.history.poll_cap`) so the longest run
    this input allows fits the execution's history."""
    config = decision.config
    walls = [] if deploy_only(config) else [config["max_runtime_seconds"] * (2 if config["spot"] else 1)]
    for stage in ("prepare", evaluation.FIELD):
        if config[stage]["enabled"]:
            walls.append(config[stage]["max_runtime_seconds"])
    cap = history.poll_cap(walls)
    decision.plan["poll"] = collections.OrderedDict([("min_seconds", history.POLL_MIN_SECONDS),
                                                     ("max_seconds", cap), ("half_max_seconds", cap // 2),
                                                     ("phase_resets", history.PHASE_RESETS)])


def quota_needs(decision):
    """The SageMaker quotas the run needs (`controlplane.quotas`): at launch 0 every instance type it may train
    on, its prepare and evaluation jobs and its endpoint; at a fallback launch that type and the endpoint."""
    config = decision.config
    labels = _launch_labels(config)
    needs = []
    if config["training_plan_arn"] is None:  # a training plan's reserved capacity is not the on-demand quota's
        launches = decision.planned if decision.launch == 0 else [decision.planned[decision.launch]]
        offset = 0 if decision.launch == 0 else decision.launch
        for index, (launch, _) in enumerate(launches):
            needs.extend(quotas.training_needs(launch, labels[offset + index]))
    if decision.launch == 0 and config["prepare"]["enabled"]:
        needs.extend(quotas.prepare_needs(config["prepare"]))
    if decision.launch == 0 and config[evaluation.FIELD]["enabled"]:
        needs.extend(quotas.evaluation_needs(config[evaluation.FIELD]))
    if config["deploy"]["enabled"]:
        needs.extend(quotas.endpoint_needs(config["deploy"]))
    return needs


def check_quotas(decision, context):
    """The account's SageMaker quotas (Service Quotas, `controlplane.quotas`) against the instances the run needs:
    refused before any job, naming each quota, its value and the request (a warm pool over its quota is a note:
    the job runs without one). When Service Quotas cannot answer (refused, throttled, unreachable, too slow for
    the function's time), the notes say so and the run goes on: SageMaker still refuses a job or endpoint over a
    quota when it is created."""
    needs = quota_needs(decision)
    if not needs:
        return
    if context.clients is None:
        decision.notes.append("quotas not checked: this caller does not ask AWS")
        return
    try:
        found = quotas.look_up(context.client("service-quotas"), [need.quota for need in needs], QUOTA_SECONDS)
    except Exception as error:
        if not (from_aws_sdk(error) or isinstance(error, quotas.TooSlow)):
            raise
        decision.notes.append("Service Quotas could not answer (%s): the SageMaker quotas this run needs were not "
                              "checked" % quotas.describe_error(error))
        return
    shortfalls, notes = quotas.compare(needs, found)
    decision.notes.extend(notes)
    if shortfalls:
        raise Refusal("Service Quotas: %s. Request an increase of each (Service Quotas console, Amazon SageMaker) "
                      "or ask for fewer instances or another type; no job was started" % "; ".join(shortfalls),
                      QUOTA_TOO_LOW)


CHECKS = (check_fields, check_deploy_only, check_fallback_instance_types, check_rules, check_names, check_plan,
          check_evaluate, check_prices, check_budget, bill.check_prices_billed, checkpoint_plan.check_checkpoints,
          check_serving, check_history, check_quotas)


# ---- the plan ----

def plan_settings(config, deployment):
    """The keyword arguments of `controlplane.planner.plan` for the run `config` asks for, exactly."""
    hyperparameters = config["hyperparameters"]
    seq_len = hyperparameters["seq_len"] or presets.ALL_PRESETS[config["preset"]].block_size
    batch = hyperparameters["global_batch_size"]
    values = dict(global_batch=batch, seq_len=seq_len, precision=hyperparameters["precision"],
                  recompute=hyperparameters["recompute"], xla=hyperparameters["xla"],
                  tokens=hyperparameters["max_steps"] * batch * seq_len, spot=config["spot"],
                  learning_rate=hyperparameters["learning_rate"], scale_lr=hyperparameters["scale_lr"],
                  traffic_encryption=deployment.inter_container_traffic_encryption)
    if config["strategy"] == "smp":
        mp_parameters = config["mp_parameters"]
        values.update(partitions=mp_parameters["partitions"], microbatches=mp_parameters["microbatches"],
                      pipeline=mp_parameters["pipeline"])
    return values


def planned(config, deployment, strategy=None):
    """`controlplane.planner.plan` of the run (with `strategy`: that strategy, "auto" searches them all);
    the planner's own refusals of a value (a precision the GPU lacks, a seq_len over the model's) are the
    input's."""
    try:
        return planner.plan(config["preset"], config["instance_type"], config["instance_count"],
                            strategy or config["strategy"], **plan_settings(config, deployment))
    except ValueError as error:
        raise Refusal("controlplane.planner: %s" % error)


def exact_plan(config, deployment):
    """The plan of the run as asked; Refusal with the planner's words where it cannot run so."""
    gpus = hardware.INSTANCES[config["instance_type"]].gpus
    partitions = config["mp_parameters"]["partitions"]
    if config["strategy"] == "smp" and (partitions < 2 or gpus % partitions):
        raise Refusal("mp_parameters.partitions %d must divide the %d GPUs per host of instance_type %s, at least 2"
                      % (partitions, gpus, config["instance_type"]))
    result = planned(config, deployment)
    chosen = result["chosen"]
    batch = config["hyperparameters"]["global_batch_size"]
    if chosen["global_batch"] != batch:
        raise Refusal("controlplane.planner: %s" % next(
            warning for warning in chosen["warnings"] if "nearest valid" in warning))
    if not chosen["ok"]:
        raise Refusal("lmstack.plan: %s" % refusal_reason(result, config), PLAN_REJECTED)
    return plan_summary(result, config)


def refusal_reason(result, config):
    """Why the planner refuses the run, and what would work (`controlplane.planner.check`'s words)."""
    chosen, best = result["chosen"], result["suggested"]
    reason = "%s on %d x %s: %s" % (chosen["strategy"], config["instance_count"], config["instance_type"],
                                    chosen["reason"])
    if best is None:
        return "%s; no strategy fits on %s: use a GPU with more memory or a smaller global batch" % (
            reason, config["instance_type"])
    hints = []
    if best["strategy"] != chosen["strategy"]:
        hints.append(planner.use_strategy(best))
    if best["recompute"] != result["settings"]["recompute"]:
        hints.append("set hyperparameters.recompute to %s" % str(best["recompute"]).lower())
    if best["global_batch"] != result["settings"]["global_batch"]:
        hints.append("set hyperparameters.global_batch_size to %d" % best["global_batch"])
    return "%s; suggestion: %s" % (reason, " and ".join(hints)) if hints else reason


def fallback_launch(config, instance_type, label, deployment):
    """(config, plan) of the run on `instance_type` after another type had no capacity: the same model,
    global batch, sequence length, precision and instance count; the asked strategy where it fits and this
    deployment runs it there, else the cheapest that does (SMP's parameters searched, recomputation as the
    planner needs it). Refusal naming `label` where none does."""
    base = dict(config, instance_type=instance_type)
    candidates = [base]
    try:
        searched = planned(dict(base, strategy="single"), deployment, strategy="auto")  # SMP's parameters searched
    except Refusal as refusal:
        raise Refusal("%s %s: %s" % (label, instance_type, refusal), refusal.error)
    fitting = [c for c in searched["candidates"] + [searched["suggested"]] if c and c["ok"] and c["time"]]
    for candidate in sorted(fitting, key=lambda c: (c["time"]["cost_on_demand_usd"] or 0.0, c["time"]["hours"],
                                                    job.STRATEGIES.index(c["strategy"]))):
        hyperparameters = dict(config["hyperparameters"], recompute=candidate["recompute"])
        mp_parameters = dict(config["mp_parameters"], **(candidate.get("mp_parameters") or {}))
        candidates.append(dict(base, strategy=candidate["strategy"], hyperparameters=hyperparameters,
                               mp_parameters=mp_parameters))
    reasons = []
    for candidate in candidates:
        message = conditions.broken(rules.cross_field_rules(deployment.runtimes), candidate)
        if message is None:
            try:
                return candidate, exact_plan(candidate, deployment)
            except Refusal as refusal:
                message = str(refusal)
        reasons.append(message)
    raise Refusal("%s %s: no strategy this deployment runs fits the run there (%s)" % (
        label, instance_type, reasons[0]), PLAN_REJECTED)


def plan_summary(result, config):
    """What the state machine and the notifications need of a plan (the planner's whole plan is large)."""
    chosen = result["chosen"]
    timing = chosen["time"] or {}
    instance = result["instance"]
    spot = config["spot"]
    summary = collections.OrderedDict([
        ("instance_type", config["instance_type"]), ("instance_count", config["instance_count"]),
        ("strategy", chosen["strategy"]),
        ("processes_per_host", job.processes_per_host("horovod", instance["gpus_per_host"])),
        ("model_config", presets.model_config(config["preset"])),
        ("global_batch", chosen["global_batch"]), ("seq_len", result["settings"]["seq_len"]),
        ("precision", result["settings"]["precision"]), ("recompute", chosen["recompute"]),
        ("data_parallel", chosen["data_parallel"]), ("per_device_batch", chosen["per_replica_batch"]),
        ("micro_batch", chosen["micro_batch"]), ("mp_parameters", chosen.get("mp_parameters")),
        ("memory_gib", round(chosen["memory_gib"]["peak"], 2)), ("usable_gib", round(chosen["usable_gib"], 2)),
        ("learning_rate", result["learning_rate"]["peak"]),
        ("tokens", result["settings"]["tokens"]), ("steps", timing.get("steps")),
        ("tokens_per_second", timing.get("tokens_per_second")), ("hours", timing.get("hours")),
        ("usd_per_instance_hour", instance["on_demand_usd_per_hour"]),
        ("cost_on_demand_usd", timing.get("cost_on_demand_usd")), ("cost_spot_usd", timing.get("cost_spot_usd")),
        ("cost_usd", timing.get("cost_spot_usd" if spot else "cost_on_demand_usd")),
        ("price_region", instance["price_region"]), ("price_date", instance["price_date"]),
        ("warnings", chosen["warnings"]),
    ])
    return summary


def plan_changes(before, after):
    """What a fallback changed of the plan, as "name: before -> after" phrases."""
    def shown(value):
        if isinstance(value, float):
            return "%.2f" % value
        return json.dumps(value) if isinstance(value, (dict, list)) or value is None else str(value)

    return "; ".join("%s: %s -> %s" % (name, shown(before.get(name)), shown(after.get(name)))
                     for name in PLAN_CHANGES if before.get(name) != after.get(name))


# ---- whoever asks ----

def decide(execution_input, context, launch=0, checks=CHECKS):
    """The Decision about `execution_input` for launch `launch`; Refusal when it cannot run.

    The deployment's default hyperparameters (`default_hyperparameters`) are the defaults of the run `{}` means
    (16 sequences with recomputation, for one A10G). An input whose run they do not let through (more
    data-parallel ranks than sequences, recomputation with smp or a family without it) is judged with
    lm.training.train's own defaults for the hyperparameters it does not give: accepted so, with a note that
    says so, or refused with those defaults' reason."""
    try:
        return _decided(execution_input, context, launch, checks)
    except Refusal as refusal:
        runtime_defaults = _with_runtime_defaults(execution_input, context.deployment)
        if refusal.error not in (INVALID, PLAN_REJECTED) or runtime_defaults is None:
            raise
        reason = str(refusal)
    decision = _decided(runtime_defaults, context, launch, checks)
    decision.given = execution_input
    decision.notes.insert(0, "the deployment's default hyperparameters (%s) do not fit this run (%s): lm.training."
                             "train's own defaults are used (%s)" % (
                                 _pairs(context.deployment.default_hyperparameters), reason,
                                 _pairs((name, runtime_defaults["hyperparameters"][name])
                                        for name, _ in context.deployment.default_hyperparameters
                                        if name in runtime_defaults["hyperparameters"])))
    return decision


def _decided(execution_input, context, launch, checks):
    decision = Decision(given=execution_input, launch=launch)
    for found in checks:
        found(decision, context)
    return decision


def _with_runtime_defaults(execution_input, deployment):
    """The input with lm.training.train's defaults for the deployment's default hyperparameters it does not
    give, or None when that changes nothing."""
    if not isinstance(execution_input, dict) or not isinstance(execution_input.get("hyperparameters", {}), dict):
        return None
    if isinstance(execution_input.get("deploy"), dict) and execution_input["deploy"].get(inputs.MODEL_ARTIFACT):
        return None  # a deploy-only run trains nothing
    given = execution_input.get("hyperparameters", {})
    added = {name: job.HYPERPARAMETERS[name].default for name, value in deployment.default_hyperparameters
             if name not in given and value != job.HYPERPARAMETERS[name].default}
    return dict(execution_input, hyperparameters=dict(given, **added)) if added else None


def _pairs(pairs):
    return ", ".join("%s %s" % (name, json.dumps(value)) for name, value in pairs)


def answer(event, context):
    """The Lambda function's answer to one event (the module docstring)."""
    try:
        decision = decide(event.get("input"), context, launch=event.get("launch", 0))
    except Refusal as refusal:
        return collections.OrderedDict([("ok", False), ("error", refusal.error), ("cause", str(refusal))])
    return decision.answer()


def handler(event, lambda_context=None, environ=os.environ, clients=aws_client):
    """The Lambda function's handler; its environment holds the Deployment (stacks.gate). Lambda passes the
    first two arguments; `environ` and `clients` are the process's environment and boto3's clients. The
    machine asks it for an execution's bill too (`controlplane.bill`, an event with "bill")."""
    if "bill" in event:
        return bill.answer(event)
    context = Context(Deployment.from_environment(environ), execution_name=event.get("execution_name"),
                      clients=clients, region=environ.get("AWS_REGION"))
    return answer(event, context)
