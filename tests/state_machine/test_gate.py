"""The gate (`controlplane.gate`): a list of checks over a small context, one handler for the Lambda
function, one `decide` for lmstack.start. A check that asks AWS gets its client from the context (the quota
check: tests/state_machine/test_quotas.py)."""
import json

import pytest
import quota_tables
from state_machine.harness import StandInSettings

from controlplane import gate, history, inputs, planner

CONTEXT = gate.Context(gate.Deployment.of(StandInSettings()))
SMDDP = {"preset": "gpt-125m", "strategy": "smddp", "instance_type": "ml.p4d.24xlarge", "instance_count": 2,
         "fallback_instance_types": ["ml.p5.48xlarge", "ml.g5.48xlarge"]}


def test_the_handler_reads_the_deployment_from_its_environment_and_answers_json():
    environment = CONTEXT.deployment.environment()
    clients = quota_tables.clients(quota_tables.account())
    answer = gate.handler({"input": {"hyperparameters": {"max_steps": 3}}, "execution_name": "run-1"},
                          environ=environment, clients=clients)
    assert json.loads(json.dumps(answer)) == answer  # a Lambda payload
    assert answer["ok"] and answer["config"]["preset"] == "tiny" and answer["plan"]["steps"] == 3
    assert answer == gate.decide({"hyperparameters": {"max_steps": 3}},
                                 gate.Context(CONTEXT.deployment, clients=clients)).answer()
    refused = gate.handler({"input": {}, "execution_name": "run.1"}, environ=environment, clients=clients)
    assert refused == {"ok": False, "error": "InvalidInput", "cause": refused["cause"]}
    assert refused["cause"].startswith("the execution name must be letters, digits, - and _")
    with pytest.raises(KeyError, match=gate.ENVIRONMENT_KEY):
        gate.handler({"input": {}}, environ={})


@pytest.mark.parametrize("given", [[1], "text", None, 3])
def test_an_input_that_is_no_object_is_refused(given):
    with pytest.raises(gate.Refusal, match="the input must be a JSON object"):
        gate.decide(given, CONTEXT)


def test_a_check_is_one_function_of_the_decision_and_the_context():
    """What a fork adds: one function in CHECKS that reads the decision, refuses or notes."""
    def check_even_steps(decision, context):
        if decision.config["hyperparameters"]["max_steps"] % 2:
            raise gate.Refusal("hyperparameters.max_steps must be even here")
        decision.notes.append("steps checked for %s" % context.deployment.name_prefix)

    checks = gate.CHECKS + (check_even_steps,)
    with pytest.raises(gate.Refusal, match="max_steps must be even"):
        gate.decide({"hyperparameters": {"max_steps": 3}}, CONTEXT, checks=checks)
    assert "steps checked for lmstack" in gate.decide({"hyperparameters": {"max_steps": 4}}, CONTEXT, checks=checks).notes


def test_fallback_types_are_planned_before_any_job_and_each_launch_says_what_changed():
    first = gate.decide(SMDDP, CONTEXT)
    assert first.launches == 3 and first.plan["strategy"] == "smddp" and "changes" not in first.plan
    second = gate.decide(SMDDP, CONTEXT, launch=1)
    # smddp does not run on P5 (its library's list): the cheapest strategy that fits there instead
    assert second.config["instance_type"] == "ml.p5.48xlarge" and second.config["strategy"] != "smddp"
    assert second.plan["strategy"] == second.config["strategy"]
    assert second.plan["changes"].startswith("instance_type: ml.p4d.24xlarge -> ml.p5.48xlarge; strategy: smddp -> ")
    third = gate.decide(SMDDP, CONTEXT, launch=2)
    assert third.plan["changes"].startswith("instance_type: ml.p5.48xlarge -> ml.g5.48xlarge")
    # the batch and its length stay those of the input
    assert {launch.plan["global_batch"] for launch in (first, second, third)} == {64}
    # a fallback type on which nothing fits the run is refused at once, naming it
    with pytest.raises(gate.Refusal, match=r"^fallback_instance_types\[0\] ml.g5.2xlarge: no strategy"):
        gate.decide(dict(SMDDP, fallback_instance_types=["ml.g5.2xlarge"]), CONTEXT)
    for bad in (["ml.p4d.24xlarge"], ["ml.p5.48xlarge"] * 2, ["ml.g5.48xlarge"] * 4, "ml.p5.48xlarge"):
        with pytest.raises(gate.Refusal, match="^fallback_instance_types must be a list of at most %d"
                           % inputs.MAX_FALLBACK_INSTANCE_TYPES):
            gate.decide(dict(SMDDP, fallback_instance_types=bad), CONTEXT)


def test_the_plan_is_the_planner_s_for_the_run_as_asked():
    run = {"preset": "gpt-125m", "strategy": "smp", "instance_type": "ml.p3.16xlarge", "instance_count": 2,
           "mp_parameters": {"partitions": 2, "microbatches": 4, "pipeline": "simple"},
           "hyperparameters": {"global_batch_size": 32, "seq_len": 1024, "precision": "fp16", "max_steps": 10}}
    plan = gate.decide(run, CONTEXT).plan
    chosen = planner.plan("gpt-125m", "ml.p3.16xlarge", 2, "smp", global_batch=32, seq_len=1024, precision="fp16",
                          partitions=2, microbatches=4, pipeline="simple", tokens=10 * 32 * 1024,
                          traffic_encryption=True)["chosen"]
    assert (plan["per_device_batch"], plan["micro_batch"], plan["mp_parameters"]) == (
        chosen["per_replica_batch"], chosen["micro_batch"], chosen["mp_parameters"])
    assert plan["memory_gib"] == round(chosen["memory_gib"]["peak"], 2)
    assert plan["hours"] == chosen["time"]["hours"] and plan["cost_usd"] == chosen["time"]["cost_on_demand_usd"]
    assert plan["poll"]["max_seconds"] == history.POLL_MAX_FLOOR


def test_the_poll_cap_grows_with_how_long_the_run_may_last():
    def cap(**given):
        return gate.decide(dict({"hyperparameters": {"max_steps": 3}}, **given), CONTEXT).plan["poll"]["max_seconds"]

    day, longest = 86400, inputs.MAX_RUNTIME_SECONDS
    assert cap(max_runtime_seconds=day) == history.POLL_MAX_FLOOR
    spot = cap(max_runtime_seconds=longest, spot=True)
    with_prepare = cap(max_runtime_seconds=longest, spot=True, prepare={"max_runtime_seconds": longest,
                                                                         "enabled": True, "force": True})
    assert history.POLL_MAX_FLOOR < cap(max_runtime_seconds=longest) < spot < with_prepare


def test_the_planner_s_warnings_reach_the_topic(deployment):
    run = deployment.run({"instance_type": "ml.g5.12xlarge", "hyperparameters": {"max_steps": 3}})
    assert run.status == "SUCCEEDED", run.description.get("cause")
    warning = "lmstack.plan: single uses 1 of the 4 GPUs of ml.g5.12xlarge"
    notes = run.gate_answers()[0]["notes"]
    # then the price the plan used (the function's SDK reaches no Price List here: the table's, which it says)
    assert notes[0] == warning and [note.split(":")[0] for note in notes[1:]] == ["price of ml.g5.12xlarge for training"]
    assert "; the table's, as the AWS Price List could not answer (EndpointConnectionError" in notes[1]
    assert "execution run-1: %s" % json.dumps(notes, separators=(",", ":")) in deployment.notifications()



def test_an_unknown_function_or_one_without_the_handler_fails_the_execution(deployment, tmp_path):
    """No silent pass: a function that does not exist, or whose code has no handler, is GateFailed (moto's
    Lambda alone would echo the payload, and a Choice on a missing field takes its default)."""
    from state_machine.harness import _SESSION

    from lmstack import local_lambda

    iam, lambdas = _SESSION.client("iam"), _SESSION.client("lambda")
    name = "%s-gate" % deployment.settings.name_prefix
    lambdas.delete_function(FunctionName=name)
    run = deployment.run({}, name="unknown")
    assert (run.status, run.description["error"]) == ("FAILED", "GateFailed")
    assert "Function not found" in run.description["cause"]

    empty = tmp_path / "code"
    empty.mkdir()
    (empty / "README").write_text("no handler here")
    iam.delete_role(RoleName=name)
    assert local_lambda.create_gate(iam, lambdas, deployment.settings, empty) == deployment.gate  # the same version
    run = deployment.run({}, name="broken")
    assert (run.status, run.description["error"]) == ("FAILED", "GateFailed")
    cause = json.loads(run.description["cause"])
    assert cause["errorType"] == "Runtime.ImportModuleError" and "controlplane.gate" in cause["errorMessage"]
    assert deployment.jobs.created == []


def test_the_deployment_s_default_hyperparameters_give_way_where_they_do_not_fit_the_run():
    """The shipped defaults (16 sequences with recomputation: the run `{}` means, on one A10G) are not forced on
    a run they do not fit: lm.training.train's own defaults are used for what the input does not give, noted."""
    from stacks.settings import Settings

    shipped = gate.Context(gate.Deployment.of(Settings()))
    assert gate.decide({}, shipped).plan["global_batch"] == 16
    wide = {"strategy": "smddp", "instance_type": "ml.p4d.24xlarge", "instance_count": 4}  # 32 data-parallel ranks
    decision = gate.decide(wide, shipped)
    assert (decision.plan["global_batch"], decision.config["hyperparameters"]["recompute"]) == (64, False)
    assert decision.notes[0].startswith("the deployment's default hyperparameters (global_batch_size 16, recompute "
                                        "true) do not fit this run (controlplane.planner: global_batch 16 is not a "
                                        "multiple of 32")
    assert decision.notes[0].endswith("lm.training.train's own defaults are used (global_batch_size 64, recompute false)")
    assert decision.given == wide
    smp = gate.decide({"strategy": "smp", "instance_type": "ml.p3.16xlarge", "preset": "tiny",
                       "mp_parameters": {"partitions": 2, "microbatches": 2}}, shipped)
    assert smp.config["hyperparameters"]["recompute"] is False  # SMP cannot recompute
    # what the input gives is never replaced
    with pytest.raises(gate.Refusal, match="global_batch 16 is not a multiple of 32"):
        gate.decide(dict(wide, hyperparameters={"global_batch_size": 16}), shipped)
