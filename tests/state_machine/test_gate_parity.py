"""The gate's answers equal the command line's, on a generated set of inputs.

For each of GENERATED seeded inputs (valid and broken in every way the checks know: unknown fields, types,
bounds, choices, rules between fields, names, batches the runtime would refuse, runs that do not fit,
fallback types), the Lambda handler's answer (its event and its deployment's environment as JSON, as the
state machine sends them) is compared with `lmstack.start`'s (its refusal, word for word, or the plan of the
run it would start), and each plan the gate accepts with `python -m lmstack.plan --json` given the same run
as flags (strategy, batch per device, microbatches, SMP parameters, memory, hours, cost, learning rate).
The bulk calls the handler directly; ENGINE_SAMPLE of them also run through the state machine on moto (the
handler run from its staged code), whose cause must be the same words.
"""
import contextlib
import io
import json
import random

import pytest
import quota_tables

from controlplane import gate, inputs, presets
from lm.spec import hardware, job
from lmstack import plan as plan_cli
from lmstack import start
from state_machine.harness import StandInSettings

pytestmark = pytest.mark.usefixtures("sdk_retries_at_once")
GENERATED = 2000
ENGINE_SAMPLE = 6
SEED = 34
SETTINGS = StandInSettings()
# Both ask the same account's Service Quotas (ample quotas), through botocore and the stand-in.
CLIENTS = quota_tables.clients(quota_tables.account())


def generated_input(rng):
    """One execution input: mostly plausible runs, each field sometimes broken."""
    gpu_types = [name for name, instance in hardware.INSTANCES.items() if instance.gpus]
    strategy = rng.choice(job.STRATEGIES)
    # mostly a type the strategy runs on, one instance for single, a batch the data-parallel size divides
    instance_type = rng.choice(job.STRATEGY_INSTANCE_TYPES.get(strategy, gpu_types) if rng.random() < 0.8
                               else gpu_types)
    count = 1 if strategy == "single" and rng.random() < 0.9 else rng.choice([1, 2, 4])
    given = {"preset": rng.choice(list(presets.ALL_PRESETS)[:5] + ["rnn-tiny"]), "strategy": strategy,
             "instance_type": instance_type, "instance_count": count}
    ranks = 1 if strategy == "single" else hardware.INSTANCES[instance_type].gpus * count
    batch = ranks * rng.choice([1, 2, 4, 8]) if rng.random() < 0.8 else rng.choice([1, 24, 100, 480])
    hyperparameters = {"global_batch_size": batch, "recompute": rng.random() < 0.6,
                       "max_steps": rng.choice([10, 1000, 50000])}
    if rng.random() < 0.4:
        hyperparameters["seq_len"] = rng.choice([128, 256, 512, 1024, 2048, 4096])
    if rng.random() < 0.3:
        hyperparameters["precision"] = rng.choice(["fp32", "fp16", "bf16"])
    if rng.random() < 0.2:
        hyperparameters["xla"] = False
    if rng.random() < 0.2:
        hyperparameters.update(learning_rate=rng.choice([0.0, 3e-4]), scale_lr=rng.random() < 0.5)
    if given["preset"].startswith("rnn"):
        hyperparameters["model"] = "rnn"
    given["hyperparameters"] = hyperparameters
    if given["strategy"] == "smp":
        given["mp_parameters"] = {"partitions": rng.choice([2, 2, 4, 8, 3]), "microbatches": rng.choice([1, 1, 2, 4]),
                                  "pipeline": rng.choice(["interleaved", "simple"])}
        hyperparameters["recompute"] = rng.random() < 0.1
    if rng.random() < 0.15:
        given["fallback_instance_types"] = rng.sample(gpu_types, rng.choice([1, 2]))
    if rng.random() < 0.2:
        given["spot"] = True
        given["max_runtime_seconds"] = rng.choice([3600, 86400, inputs.MAX_RUNTIME_SECONDS])
    if rng.random() < 0.1:
        given["deploy"] = {"enabled": True, "container": rng.choice(["lmstack", "tgi", "lmi"]),
                           "instance_type": rng.choice(["ml.g5.xlarge", "ml.g5.12xlarge", "ml.m5.xlarge"])}
        hyperparameters["export_hf"] = rng.random() < 0.7
    broken = rng.random()
    if broken < 0.03:
        given["presett"] = "tiny"
    elif broken < 0.06:
        hyperparameters["max_steps"] = rng.choice(["100", 10.5, 0, None])
    elif broken < 0.09:
        given["instance_count"] = rng.choice([0, 65, "2", 2.0])
    elif broken < 0.11:
        given["strategy"] = "deepspeed"
    elif broken < 0.13:
        given["deploy"] = {"endpoint_name": rng.choice(["my_model", "gpt-", "a" * 56])}
    return given


def cli_answer(given):
    """lmstack.start's answer: its refusal, or the gate's decision it would start the run with."""
    try:
        return start.validate_input(given, SETTINGS, clients=CLIENTS)
    except start.StartError as error:
        return str(error)


def plan_flags(config, plan):
    """`python -m lmstack.plan` flags for the run `config` asks for, as a user would type them."""
    hyperparameters = config["hyperparameters"]
    flags = ["--preset", config["preset"], "--instance-type", config["instance_type"],
             "--instance-count", str(config["instance_count"]), "--strategy", config["strategy"],
             "--global-batch", str(hyperparameters["global_batch_size"]), "--seq-len", str(plan["seq_len"]),
             "--precision", hyperparameters["precision"], "--tokens", str(plan["tokens"]),
             "--learning-rate", repr(hyperparameters["learning_rate"]),
             "--scale-lr" if hyperparameters["scale_lr"] else "--no-scale-lr", "--json"]
    flags += ["--recompute"] if hyperparameters["recompute"] else []
    flags += [] if hyperparameters["xla"] else ["--no-xla"]
    flags += ["--spot"] if config["spot"] else []
    flags += ["--traffic-encryption"] if SETTINGS.inter_container_traffic_encryption else []
    if config["strategy"] == "smp":
        mp_parameters = config["mp_parameters"]
        flags += ["--partitions", str(mp_parameters["partitions"]), "--microbatches",
                  str(mp_parameters["microbatches"]), "--pipeline", mp_parameters["pipeline"]]
    return flags


def planned_by_the_cli(config, plan):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = plan_cli.main(plan_flags(config, plan))
    return code, json.loads(out.getvalue())


@pytest.fixture(scope="module")
def generated():
    rng = random.Random(SEED)
    return [generated_input(rng) for _ in range(GENERATED)]


def test_the_gate_answers_as_the_command_line_on_generated_inputs(generated):
    environment = gate.Deployment.of(SETTINGS).environment()
    outcomes = {}
    for index, given in enumerate(generated):
        answer = gate.handler(json.loads(json.dumps({"input": given, "execution_name": "parity-%d" % index})),
                              environ=environment, clients=CLIENTS)
        cli = cli_answer(given)
        if isinstance(cli, str):
            assert (answer["ok"], answer["cause"]) == (False, cli), given
            outcomes[answer["error"]] = outcomes.get(answer["error"], 0) + 1
            continue
        assert answer["ok"], (given, answer)
        assert answer == json.loads(json.dumps(cli.answer())), given
        code, printed = planned_by_the_cli(cli.config, cli.plan)
        chosen, plan = printed["chosen"], answer["plan"]
        assert code == 0 and chosen["ok"], given
        timing = chosen["time"] or {}
        assert (plan["strategy"], plan["per_device_batch"], plan["micro_batch"], plan["mp_parameters"],
                plan["memory_gib"], plan["hours"], plan["cost_usd"], plan["learning_rate"]) == (
            chosen["strategy"], chosen["per_replica_batch"], chosen["micro_batch"], chosen.get("mp_parameters"),
            round(chosen["memory_gib"]["peak"], 2), timing.get("hours"),
            timing.get("cost_spot_usd" if cli.config["spot"] else "cost_on_demand_usd"),
            printed["learning_rate"]["peak"]), given
        outcomes["accepted"] = outcomes.get("accepted", 0) + 1
    print("gate and command line agree on %d inputs: %s" % (len(generated), outcomes))
    # the set covers each answer: accepted runs, bad inputs, and runs the planner refuses
    assert min(outcomes.get(kind, 0) for kind in ("accepted", "InvalidInput", "PlanRejected")) >= GENERATED // 20


def test_a_sample_through_the_state_machine_ends_with_the_same_words(generated, make_deployment):
    deployment = make_deployment()
    answers = [(given, cli_answer(given)) for given in generated[:100]]
    refused = [item for item in answers if isinstance(item[1], str)]
    accepted = [item for item in answers if not isinstance(item[1], str)]
    sample = refused[:ENGINE_SAMPLE // 2] + accepted[:ENGINE_SAMPLE - ENGINE_SAMPLE // 2]
    assert len(sample) == ENGINE_SAMPLE
    for index, (given, cli) in enumerate(sample):
        run = deployment.run(given, name="parity-%d" % index)
        if isinstance(cli, str):
            assert run.description.get("cause") == cli, given
        else:
            (answer,) = run.gate_answers()
            assert answer["plan"] == json.loads(json.dumps(cli.plan)) and "Validate.Accepted" in run.states_entered()
