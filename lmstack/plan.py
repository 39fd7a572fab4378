"""`python -m lmstack.plan`: memory, strategy, time and cost of a run, as a table, JSON or a chart.

    python -m lmstack.plan --preset gpt-1.3b --instance-type ml.p4d.24xlarge --instance-count 2
    python -m lmstack.plan --input '{"preset": "gpt-125m", "instance_type": "ml.g5.2xlarge"}'
    python -m lmstack.plan --list               every preset of every family, one a line
    python -m lmstack.plan --describe gpt-1.3b  one preset's shape and size as JSON

Costs are at the table's on-demand price (`controlplane.prices`); `--region` reads the type's price from the
AWS Price List for that region instead (`controlplane.pricing`: it needs AWS credentials allowed
pricing:GetProducts; where the Price List cannot answer, the table's price is used and the output says why).

The arithmetic is `controlplane.planner`'s (its docstring says what is counted and why). The deployment's
settings come from the app's cdk.json as `lmstack.start` reads them (`--cdk-json`): its
`inter_container_traffic_encryption` and `spot` unless a flag says otherwise, and with `--input` everything
the gate reads, so an execution input is planned exactly as the gate plans it (`controlplane.gate`), and the
gate's verdict is printed after the plan. Exit status 0: the run fits; 1: it does not (the plan says why).
"""
import argparse
import collections
import json
import re
import sys

from controlplane import budget, checkpoint_plan, gate, prices, pricing
from controlplane.planner import DEFAULT_GLOBAL_BATCH, PRECISIONS, SCALE_LR_DEFAULT, SMP_PIPELINES, plan, resolve_config
from lm.spec import hardware, job
from controlplane.presets import ALL_PRESETS, get_preset
from lm.spec.families import FAMILIES, flops_per_token, get_family
from lmstack import cdk_settings
from stacks.settings import SettingsError


def parse_global_batch(text, seq_len):
    """"64" is 64 sequences; "512K" or "1M" (a K/M suffix) is tokens, converted to sequences."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmM]?)\s*", str(text))
    if not match:
        raise ValueError("global batch must be sequences (64) or tokens with K/M (512K, 1M), got %r" % (text,))
    number, unit = float(match.group(1)), match.group(2).lower()
    if not unit:
        if not number.is_integer():
            raise ValueError("global batch in sequences must be an integer, got %r" % (text,))
        return int(number)
    sequences = int(number * {"k": 2 ** 10, "m": 2 ** 20}[unit] // seq_len)
    if sequences < 1:
        raise ValueError("global batch %r is less than one sequence of %d tokens" % (text, seq_len))
    return sequences


def parse_tokens(text):
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbBtT]?)\s*", str(text))
    if not match:
        raise ValueError("tokens must be a number with an optional K/M/B/T suffix, got %r" % (text,))
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def _gib(value):
    return "%.2f" % value


def smp_placement_lines(result):
    """What the smp row's GPU holds: partition 0 (see `memory`)."""
    for candidate in result["candidates"]:
        if candidate["strategy"] == "smp" and (candidate.get("mp_parameters") or {}).get("partitions", 1) > 1:
            layers, partitions = result["model"]["n_layer"], candidate["mp_parameters"]["partitions"]
            return ["(smp: the GPU of partition 0 of %d, the busiest: the embeddings, the output layer, the loss and "
                    "%d of the %d blocks; each GPU holds only its partition's weights, gradients and AdamW state)"
                    % (partitions, -(-layers // partitions), layers)]
    return []


def format_table(result):
    chosen = result["chosen"]
    lines = ["model: %(params)d parameters, %(n_layer)d layers, d_model %(d_model)d, vocab %(vocab)d"
             % result["model"]]
    inst = result["instance"]
    lines.append("instance: %d x %s (%d x %s %s GiB, %s, %s Gbit/s), %s" % (
        inst["count"], inst["type"], inst["gpus_per_host"], inst["gpu"], inst["gpu_memory_gib"],
        inst["interconnect"], inst["network_gbps"], _price_label(inst)))
    s = result["settings"]
    lines.append("settings: global batch %d x %d tokens, %s, recompute %s, %d training tokens" % (
        s["global_batch"], s["seq_len"], s["precision"], s["recompute"], s["tokens"]))
    rate = result["learning_rate"]
    lines.append("peak learning rate %.3g (%s for GPT-3's batch of %d sequences%s)" % (
        rate["peak"], "given %.3g" % rate["given"] if rate["given"] else "GPT-3's %.3g" % rate["gpt3_rate"],
        rate["gpt3_batch"], ", scaled by the square root of %d / %d, at most 1x" % (
            rate["global_batch"], rate["gpt3_batch"]) if rate["scale_lr"] else ", kept at any batch"))
    lines.append("")
    header = "%-8s %-3s %8s %8s %8s %8s %8s %8s %8s %9s %9s %11s %11s" % (
        "strategy", "ok", "weights", "grads", "optim", "acts", "acts_rc", "peak", "usable", "host ckpt", "hours",
        "on-demand$", "spot$ est.")
    lines.append(header)
    lines.append("-" * len(header))
    for c in result["candidates"]:
        m, t = c["memory_gib"], c["time"] or {}
        lines.append("%-8s %-3s %8s %8s %8s %8s %8s %8s %8s %9s %9s %11s %11s" % (
            c["strategy"], "yes" if c["ok"] else "no", _gib(m["weights"]),
            _gib(m["gradients"] + m["gradient_accumulator"]), _gib(m["optimizer"]),
            _gib(m["activations"]), _gib(m["activations_recompute"]), _gib(m["peak"]),
            _gib(c["usable_gib"]), _gib(c["host_memory_gib"]["checkpoint_snapshot"]), "%.1f" % t["hours"] if t else "-",
            _usd(t.get("cost_on_demand_usd")), _usd(t.get("cost_spot_usd"))))
    lines.append("(GiB per GPU; grads: with SMP's accumulator over the microbatches; acts_rc: activations with "
                 "recomputation; host ckpt: a checkpoint save's copy of the state, in the chief's host memory; "
                 "spot$ est.: %s)" % prices.SPOT_BASIS)
    lines.extend(smp_placement_lines(result))
    lines.append("")
    lines.append("chosen: %s%s" % (chosen["strategy"], "" if chosen["ok"] else " - CANNOT: %s" % chosen["reason"]))
    if chosen["recompute"] != s["recompute"]:
        lines.append("  with recompute=%s: %s GiB per GPU of %s usable" % (
            str(chosen["recompute"]).lower(), _gib(chosen["memory_gib"]["peak"]), _gib(chosen["usable_gib"])))
    if chosen.get("mp_parameters"):
        lines.append("  mp_parameters: %s" % json.dumps(chosen["mp_parameters"]))
    t = chosen["time"]
    if t:
        cost = t["cost_spot_usd"] if s["spot"] else t["cost_on_demand_usd"]
        lines.append("  %.0f tokens/s, step %.3f s, %d steps, %.1f hours, $%s %s" % (
            t["tokens_per_second"], t["step_seconds"], t["steps"], t["hours"], _usd(cost),
            "spot (an estimate)" if s["spot"] else "on demand"))
        lines.append("  at %.3g GFLOP per token, MFU %.1f %%: %s" % (
            t["flops_per_token"] / 1e9, 100 * t["mfu"], t["mfu_source"]))
        save_seconds = job.save_seconds(result["model"]["params"] * budget.CHECKPOINT_BYTES_PER_PARAMETER)
        lines.append("  checkpoints: " + checkpoint_plan.described(checkpoint_plan.plan(
            save_seconds, t["step_seconds"], inst["count"], inst["gpus_per_host"], s["spot"], {})))
    if result["suggested_strategy"] and result["suggested_strategy"] != chosen["strategy"]:
        lines.append("  suggested strategy: %s" % result["suggested_strategy"])
    if not chosen["ok"] and result["fits_with_recompute"]:
        lines.append("  fits with recompute=true")
    for warning in chosen["warnings"]:
        lines.append("  warning: %s" % warning)
    return "\n".join(lines)


def chart(model, instance_type, path, strategy="auto", counts=None, **settings):
    """PNG of training hours and cost (on demand and spot) against instance count, each point
    labelled with its strategy. Returns the points: (count, hours, on-demand $, spot $, label)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    counts = counts or [1, 2, 4, 8, 16, 32]
    points = []
    for count in counts:
        if strategy == "single" and count > 1:
            break
        chosen = plan(model, instance_type, count, strategy, **settings)["chosen"]
        timing = chosen["time"]
        if timing:
            points.append((count, timing["hours"], timing["cost_on_demand_usd"], timing["cost_spot_usd"],
                           chosen["strategy"] + ("" if chosen["ok"] else " (does not fit)")))
    if not points:
        raise ValueError("no time estimate for %s (an instance type without GPUs?)" % instance_type)
    xs = [p[0] for p in points]
    figure, hours_axis = pyplot.subplots(figsize=(7, 4.5))
    hours_axis.plot(xs, [p[1] for p in points], "o-", color="tab:blue", label="hours")
    hours_axis.set_xlabel("instance count (%s)" % instance_type)
    hours_axis.set_ylabel("training hours", color="tab:blue")
    hours_axis.set_xscale("log", base=2)
    hours_axis.set_xticks(xs)
    hours_axis.set_xticklabels([str(x) for x in xs])
    for count, hours, _, _, label in points:
        hours_axis.annotate(label, (count, hours), textcoords="offset points", xytext=(4, 6), fontsize=8)
    cost_axis = hours_axis.twinx()
    cost_axis.plot(xs, [p[2] for p in points], "s-", color="tab:red", label="on-demand $")
    cost_axis.plot(xs, [p[3] for p in points], "s--", color="tab:orange", label="spot $ (estimate)")
    cost_axis.set_ylabel("cost, USD (%s, price read %s)" % (prices.PRICE_REGION, prices.price_date(instance_type)),
                         color="tab:red")
    cost_axis.legend(loc="upper right")
    name = model if isinstance(model, str) else "custom model"
    hours_axis.set_title("%s: time and cost against instance count" % name)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)
    pyplot.close(figure)
    return points


def _usd(value):
    """A cost for the table: whole dollars, or "-" without a price (prices.UNPRICED)."""
    return "-" if value is None else "%.0f" % value


def _price_label(instance):
    """The price the costs come from: a training plan's, the table's on-demand one with its date, or why none."""
    if instance["usd_per_instance_hour"] is not None:
        return "$%s/h (the training plan's price)" % instance["usd_per_instance_hour"]
    if instance["on_demand_usd_per_hour"] is None:
        return ("no on-demand price (%s: none found, looked for %s; --usd-per-instance-hour gives a training "
                "plan's)" % (instance["price_region"], instance["price_date"]))
    if instance["price_source"].startswith(pricing.PRICE_LIST):
        return "$%s/h on demand (%s, %s, effective %s)" % (instance["on_demand_usd_per_hour"], pricing.PRICE_LIST,
                                                           instance["price_region"], instance["price_date"])
    return "$%s/h on demand (%s, read %s%s)" % (
        instance["on_demand_usd_per_hour"], instance["price_region"], instance["price_date"],
        "; the table's, as %s" % instance["price_note"] if instance["price_note"] else "")


def describe(config):
    """Shape and size of a model config of any family, from the formulas in lm.spec.families (no model
    is built)."""
    info = config.to_dict()
    info.update(padded_vocab_size=config.padded_vocab_size, params=config.parameter_count(),
                non_embedding_params=config.non_embedding_parameter_count(), flops_per_token=flops_per_token(config),
                capabilities=list(get_family(config.family).capabilities))
    if hasattr(config, "attention_head_dim"):
        info["attention_head_dim"] = config.attention_head_dim
    return info


def _count(value):
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if value >= scale:
            return "%.3g%s" % (value / scale, suffix)
    return str(value)


def preset_lines():
    """`--list`: one line per preset of every family, its name first."""
    width = max(len(name) for name in ALL_PRESETS)
    return ["%-*s  family %-5s %7s parameters, %3d layers, width %5d, context %5d, vocab %6d" % (
        width, name, config.family, _count(config.parameter_count()), config.n_layer, config.d_model,
        config.block_size, config.padded_vocab_size) for name, config in ALL_PRESETS.items()]


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m lmstack.plan", description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print every preset of every family and exit")
    parser.add_argument("--describe", metavar="PRESET", default=None,
                        help="print a preset's shape and size as JSON and exit (no model is built)")
    parser.add_argument("--preset", default=None, help="one of: %s" % ", ".join(ALL_PRESETS))
    parser.add_argument("--config", default=None, help="a model config as JSON (instead of --preset), of --family")
    parser.add_argument("--family", default="gpt", choices=tuple(FAMILIES), help="the family of --config")
    parser.add_argument("--instance-type", help="one of: %s" % ", ".join(hardware.INSTANCES))
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--tokens", default=None, help="training tokens (e.g. 26B); default 20 per parameter")
    parser.add_argument("--seq-len", type=int, default=0, help="default: the model's block size")
    parser.add_argument("--global-batch", default=str(DEFAULT_GLOBAL_BATCH),
                        help="sequences (64) or tokens with a K/M suffix (512K, 1M)")
    parser.add_argument("--precision", default="auto", choices=PRECISIONS)
    parser.add_argument("--strategy", default="auto", choices=("auto",) + job.STRATEGIES)
    parser.add_argument("--recompute", action="store_true", help="recompute activations in the backward pass")
    parser.add_argument("--no-xla", dest="xla", action="store_false",
                        help="the run does not compile with XLA (lm.training.train's xla false): decides when the all-reduce runs")
    parser.add_argument("--partitions", type=int, default=None, help="SMP partitions (default: searched)")
    parser.add_argument("--microbatches", type=int, default=None, help="SMP microbatches (default: searched)")
    parser.add_argument("--pipeline", default=None, choices=SMP_PIPELINES, help="SMP pipeline (default: searched)")
    parser.add_argument("--learning-rate", type=float, default=0.0,
                        help="peak learning rate (default 0: the rate GPT-3 trained the size with, Table 2.1), used at any "
                             "global batch unless --scale-lr")
    parser.add_argument("--scale-lr", dest="scale_lr", action="store_true", default=SCALE_LR_DEFAULT,
                        help="scale the learning rate by the square root of the global batch / GPT-3's batch "
                             "(Adam's rule), never up (lm.training.train's scale_lr)")
    parser.add_argument("--no-scale-lr", dest="scale_lr", action="store_false",
                        help="use the learning rate as given, whatever the global batch (the default)")
    parser.add_argument("--spot", action="store_true", default=None,
                        help="headline cost with managed spot (default: the deployment's spot setting)")
    parser.add_argument("--no-spot", dest="spot", action="store_false", help="headline cost on demand")
    parser.add_argument("--traffic-encryption", action="store_true", default=None,
                        help="EnableInterContainerTrafficEncryption on, a slower all-reduce between hosts (default: "
                             "the deployment's inter_container_traffic_encryption)")
    parser.add_argument("--no-traffic-encryption", dest="traffic_encryption", action="store_false",
                        help="EnableInterContainerTrafficEncryption off")
    parser.add_argument("--cdk-json", default=cdk_settings.DEFAULT_CDK_JSON,
                        help="the app's cdk.json: the deployment's settings the gate plans with (default: this "
                             "repository's)")
    parser.add_argument("--input", metavar="JSON", default=None,
                        help="an execution input, planned exactly as the gate plans it (the deployment's defaults "
                             "for what it does not give); instead of the model and run flags")
    parser.add_argument("--mfu", type=float, default=None, help="model FLOP utilization; default per GPU: bench/gpu.py's measurement where "
                        "recorded (controlplane/measured_mfu.json), else a published run's (lm.spec.hardware)")
    parser.add_argument("--usd-per-instance-hour", type=float, default=None,
                        help="price of a SageMaker training plan's reserved instance-hour (default: on-demand)")
    parser.add_argument("--region", default=None,
                        help="read the on-demand price from the AWS Price List for this region (AWS credentials "
                             "allowed pricing:GetProducts; not with --input, which the gate prices from the "
                             "table); default: the table's (%s)" % prices.PRICE_REGION)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--chart", default=None, help="write a PNG of time and cost against instance count")
    return parser


def price_list_price(instance_type, region, clients=None):
    """The training price of `instance_type` in `region` from the AWS Price List (`clients`: a factory of boto3
    clients, default the default session's), or the table's with a note saying why."""
    hardware.get_instance(instance_type)  # an unknown type is refused before AWS is asked
    wanted = (instance_type, pricing.TRAINING)
    return pricing.prices_of([wanted], region, clients or default_clients())[wanted]


def default_clients():
    import boto3
    return boto3.session.Session().client


def main(argv=None, clients=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(preset_lines()))
        return 0
    try:
        if args.describe:
            print(json.dumps(describe(get_preset(args.describe)), indent=2, sort_keys=True))
            return 0
        settings, source = cdk_settings.load(args.cdk_json)
        if args.input:
            if args.preset or args.config or args.instance_type:
                raise ValueError("--input is the whole run: give its preset and instance type in it, not as flags")
            result = input_plan(args.input, gate.Deployment.of(settings))
        else:
            result = flags_plan(args, settings, clients)
        result["deployment"] = deployment_used(args, settings, source)
    except (ValueError, SettingsError, gate.Refusal) as error:
        parser.error(str(error))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_deployment(result["deployment"]))
        print(format_table(result))
        if "gate" in result:
            print(format_gate(result["gate"]))
    fits = result["gate"]["accepted"] if "gate" in result else result["ok"]
    return 0 if fits else 1


def flags_plan(args, settings, clients=None):
    """The plan of the run the flags describe; the deployment's spot and traffic encryption where no flag says."""
    if bool(args.preset) == bool(args.config):
        raise ValueError("give exactly one of --preset or --config (or an execution input with --input)")
    if not args.instance_type:
        raise ValueError("--instance-type is required to plan a run")
    model = args.preset if args.preset else get_family(args.family).config_class.from_dict(json.loads(args.config))
    config = resolve_config(model)
    seq_len = args.seq_len or config.block_size
    run_settings = dict(global_batch=parse_global_batch(args.global_batch, seq_len), seq_len=seq_len,
                        precision=args.precision, recompute=args.recompute, xla=args.xla,
                        tokens=parse_tokens(args.tokens) if args.tokens else None, mfu=args.mfu,
                        partitions=args.partitions, microbatches=args.microbatches, pipeline=args.pipeline,
                        learning_rate=args.learning_rate, scale_lr=args.scale_lr,
                        traffic_encryption=_given(args.traffic_encryption, settings.inter_container_traffic_encryption),
                        usd_per_instance_hour=args.usd_per_instance_hour,
                        on_demand=price_list_price(args.instance_type, args.region, clients) if args.region else None)
    result = plan(model, args.instance_type, args.instance_count, args.strategy,
                  spot=_given(args.spot, settings.spot), **run_settings)
    if args.chart:
        chart(model, args.instance_type, args.chart, args.strategy, **run_settings)
        result["chart"] = args.chart
    return result


def input_plan(text, deployment):
    """The planner's whole plan of execution input `text` as the gate plans it (`controlplane.gate.planned` of
    the config the gate decides on), with the gate's verdict under "gate": accepted, or refused with its error
    and reason. Refusal where the input itself is invalid (a field, a rule), which the gate refuses unplanned."""
    try:
        execution_input = json.loads(text)
    except ValueError as error:
        raise ValueError("--input is not valid JSON: %s" % error)
    context = gate.Context(deployment)
    try:
        decision = gate.decide(execution_input, context)
        verdict = {"accepted": True, "plan": decision.plan, "notes": decision.notes}
    except gate.Refusal as refusal:
        decision = gate.decide(execution_input, context, checks=UNPLANNED_CHECKS)
        verdict = {"accepted": False, "error": refusal.error, "cause": str(refusal)}
    if gate.deploy_only(decision.config):
        raise ValueError("--input: deploy.model_artifact serves an existing model; there is no training to plan")
    result = gate.planned(decision.config, deployment)
    result["gate"] = verdict
    return result


# The gate's checks before it plans: an input they refuse has nothing to plan.
UNPLANNED_CHECKS = (gate.check_fields, gate.check_deploy_only, gate.check_fallback_instance_types, gate.check_rules)


def _given(flag, setting):
    return setting if flag is None else flag


def deployment_used(args, settings, source):
    """Which of the deployment's settings the plan used, and where each came from (with --input, all of them:
    the input's own `spot` is in the plan)."""
    def used(flag, setting, name):
        value = _given(flag, setting)
        origin = source if flag is None else "--%s%s" % ("" if value else "no-", name)
        return collections.OrderedDict([("value", value), ("from", origin)])

    found = collections.OrderedDict([("settings", source), ("inter_container_traffic_encryption", used(
        None if args.input else args.traffic_encryption, settings.inter_container_traffic_encryption,
        "traffic-encryption"))])
    if not args.input:
        found["spot"] = used(args.spot, settings.spot, "spot")
    return found


def format_deployment(deployment):
    return "deployment: %s; %s" % (deployment["settings"], ", ".join(
        "%s %s%s" % (name, json.dumps(used["value"]), "" if used["from"] == deployment["settings"] else
                     " (%s)" % used["from"]) for name, used in deployment.items() if name != "settings"))


def format_gate(verdict):
    """The gate's verdict on an --input run, in the words the execution would get."""
    if not verdict["accepted"]:
        return "\ngate: refused, %s: %s" % (verdict["error"], verdict["cause"])
    summary = verdict["plan"]
    return "\n".join(["", "gate: accepted: %s on %d x %s, %s hours, %s" % (
        summary["strategy"], summary["instance_count"], summary["instance_type"],
        "-" if summary["hours"] is None else "%.1f" % summary["hours"],
        "-" if summary["cost_usd"] is None else "$%.2f" % summary["cost_usd"])] + [
        "  note: %s" % note for note in verdict["notes"]])


if __name__ == "__main__":
    sys.exit(main())
