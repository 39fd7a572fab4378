"""Bad input fails in the gate (the Validate state's Lambda function), naming the field, before any job exists."""
import pytest
from state_machine.harness import StandInSettings

from controlplane import planner
from lm.spec.hardware import INSTANCES

CASES = [
    # (input, field named in the cause, what the cause must also say)
    ({"presett": "tiny"}, "the input has an unknown field", "presett"),
    ({"hyperparameters": {"learning_rte": 0.1}}, "hyperparameters has an unknown field", "learning_rte"),
    ({"hyperparameters": {"preset": "tiny"}}, "hyperparameters has an unknown field", "preset"),
    ({"hyperparameters": {"max_steps": "100"}}, "hyperparameters.max_steps must be an integer", "'100'"),
    ({"hyperparameters": {"max_steps": 10.5}}, "hyperparameters.max_steps must be an integer", "10.5"),
    ({"hyperparameters": {"learning_rate": 2.0}}, "hyperparameters.learning_rate must be between 0.0 and 1.0", "2.0"),
    ({"hyperparameters": {"xla": "yes"}}, "hyperparameters.xla must be true or false", "'yes'"),
    ({"hyperparameters": {"precision": "fp8"}}, "hyperparameters.precision must be one of auto, fp32, fp16, bf16",
     "'fp8'"),
    ({"hyperparameters": 3}, "hyperparameters must be a JSON object", "3"),
    ({"instance_count": 0}, "instance_count must be between 1 and", "0"),
    ({"strategy": "deepspeed"}, "strategy must be one of single, mwms, horovod, smddp, smp", "'deepspeed'"),
    ({"instance_type": "ml.p9.large"}, "instance_type must be one of", "'ml.p9.large'"),
    ({"preset": "gpt-1t"}, "preset must be one of", "'gpt-1t'"),
    ({"data_directory": "datasets"}, "data_directory must start with /", "'datasets'"),
    ({"mp_parameters": {"pipeline": "fast"}}, "mp_parameters.pipeline must be one of simple, interleaved", "'fast'"),
    ({"deploy": {"enabled": True, "instance_count": -1}}, "deploy.instance_count must be between 1 and", "-1"),
    ({"prepare": {"hyperparameters": {"seq_len": 0}}}, "prepare.hyperparameters.seq_len must be between 1 and 65536",
     "0"),
    ({"min_quality": "low"}, "min_quality must be a number or null", "'low'"),
    ({"strategy": "smddp", "instance_type": "ml.m5.4xlarge", "instance_count": 2},
     "strategy smddp runs only on instance_type ml.p3.16xlarge", ""),
    ({"strategy": "single", "instance_count": 2}, "strategy single runs on one instance", ""),
    ({"deploy": {"endpoint_name": "my_model"}}, "deploy.endpoint_name must be letters, digits and hyphens",
     '"my_model"'),
    ({"deploy": {"endpoint_name": "gpt-"}}, "deploy.endpoint_name must be", '"gpt-"'),
    ({"deploy": {"endpoint_name": ""}}, "deploy.endpoint_name must be", '""'),
    ({"deploy": {"enabled": True, "endpoint_name": "a" * 56}}, "deploy.endpoint_name must be",
     "at most 55 characters"),
    ({"strategy": "smp", "instance_type": "ml.p3.16xlarge", "mp_parameters": {"partitions": 3}},
     "mp_parameters.partitions 3 must divide the 8 GPUs per host of instance_type ml.p3.16xlarge", ""),
    ({"fallback_instance_types": ["ml.p9.large"]}, "fallback_instance_types must be a list of at most 3 instance "
     "types other than instance_type", "['ml.p9.large']"),
    ({"hyperparameters": {"precision": "bf16"}, "instance_type": "ml.p3.16xlarge"}, "controlplane.planner: precision "
     "'bf16' is not supported on ml.p3.16xlarge", "allowed there"),
    # lm.data.prepare would refuse it after the instances started (it trains the tokenizer on one instance)
    ({"prepare": {"enabled": True, "instance_count": 3}},
     "prepare trains its tokenizer (prepare.hyperparameters.tokenizer is empty, init_from is null) on one instance, "
     "got prepare.instance_count=3", ""),
    ({"resume_from": 7}, "resume_from must be a string or null", "7"),
    ({"strategy": "smp", "instance_type": "ml.p3.16xlarge", "hyperparameters": {"dropout": 0.1}},
     "hyperparameters.dropout must be 0 with strategy smp", "got 0.1"),
]


@pytest.mark.slow
def test_each_kind_of_bad_input_names_the_field(deployment):
    for index, (execution_input, field, detail) in enumerate(CASES):
        run = deployment.run(execution_input, name="bad-%d" % index)
        assert run.status == "FAILED", execution_input
        assert run.description["error"] == "InvalidInput", (execution_input, run.description.get("cause"))
        cause = run.description["cause"]
        assert field in cause and detail in cause, (execution_input, cause)
        assert [action for _, action, _ in run.calls()] == ["invoke"], execution_input  # the gate, nothing else
    assert deployment.jobs.created == []


@pytest.mark.slow
def test_a_strategy_whose_image_is_not_built_is_rejected(make_deployment):
    deployment = make_deployment(StandInSettings(runtimes=("tfcurrent",)))
    run = deployment.run({"strategy": "horovod", "instance_type": "ml.p3.16xlarge", "instance_count": 2})
    assert run.status == "FAILED"
    assert run.description["error"] == "InvalidInput"
    assert "strategy horovod needs the tf211 image" in run.description["cause"]
    assert deployment.jobs.created == []


def test_valid_overrides_of_every_type_pass(deployment):
    run = deployment.run({"preset": "gpt-125m", "instance_type": "ml.p3.16xlarge", "strategy": "horovod",
                          "instance_count": 2, "min_quality": 4,
                          "hyperparameters": {"learning_rate": 0.001, "max_steps": 2.0, "xla": False,
                                              "precision": "fp16", "recompute": True}})
    assert run.status == "SUCCEEDED", (run.description.get("cause"), run.states_entered()[-5:])
    (_, _, request), = run.calls("createTrainingJob")
    hyperparameters = request["HyperParameters"]
    assert hyperparameters["learning_rate"] == "0.001" and hyperparameters["xla"] == "false"
    assert hyperparameters["max_steps"] == "2"  # an integral number written as a float is the integer
    assert hyperparameters["sagemaker_mpi_num_of_processes_per_host"] == "8"
    assert request["ResourceConfig"]["InstanceCount"] == 2


def test_a_batch_that_does_not_fit_fails_before_any_job_with_the_planner_s_reason(deployment):
    """The gate plans the run as asked (its global batch, sequence length, precision, strategy and instance
    count), not a preset's smallest run: 16 sequences of gpt-125m fit one A10G with recomputation, 64 do not."""
    fits = {"preset": "gpt-125m", "strategy": "single", "instance_type": "ml.g5.2xlarge",
            "hyperparameters": {"global_batch_size": 16, "recompute": True, "max_steps": 10}}
    assert deployment.run(fits, name="fits").status == "SUCCEEDED"
    too_big = dict(fits, hyperparameters=dict(fits["hyperparameters"], global_batch_size=64))
    run = deployment.run(too_big, name="too-big")
    verdict = planner.check("gpt-125m", "ml.g5.2xlarge", 1, "single", global_batch=64, recompute=True)
    assert not verdict.ok
    assert (run.status, run.description["error"]) == ("FAILED", "PlanRejected")
    assert run.description["cause"].startswith("lmstack.plan: %s" % verdict.reason), run.description["cause"]
    shorter = dict(too_big, hyperparameters=dict(too_big["hyperparameters"], seq_len=512))
    assert deployment.run(shorter, name="shorter").status == "SUCCEEDED"  # its sequence length planned too
    assert len(deployment.jobs.created) == 2


@pytest.mark.slow
def test_plan_gate_rejects_what_cannot_fit_or_run(deployment):
    too_big = deployment.run({"preset": "gpt-1.3b", "strategy": "horovod", "instance_type": "ml.p3.16xlarge",
                              "instance_count": 2}, name="plan-1")
    assert too_big.status == "FAILED"
    assert too_big.description["error"] == "PlanRejected"
    assert "16 GiB V100" in too_big.description["cause"]

    cannot_run = deployment.run({"preset": "gpt-125m", "strategy": "smddp", "instance_type": "ml.p5.48xlarge",
                                 "instance_count": 2}, name="plan-2")
    assert cannot_run.status == "FAILED"
    assert cannot_run.description["error"] == "InvalidInput"  # lm.spec.job's rule, before any plan
    assert "smddp runs only on" in cannot_run.description["cause"]
    assert deployment.jobs.created == []

    smp = {"preset": "gpt-1.3b", "strategy": "smp", "instance_type": "ml.p3.16xlarge", "instance_count": 2,
           "mp_parameters": {"partitions": 4, "microbatches": 8}, "hyperparameters": {"global_batch_size": 32}}
    recomputed = deployment.run(dict(smp, hyperparameters={"recompute": True}), name="plan-3")
    assert recomputed.description["error"] == "InvalidInput"  # controlplane.rules: SMP's ranks cannot recompute
    assert "hyperparameters.recompute must be false with strategy smp" in recomputed.description["cause"]
    # 2,048 tokens do not fit; the planner names what does, and that runs
    full_length = deployment.run(smp, name="plan-4")
    assert full_length.description["error"] == "PlanRejected"
    assert "fits at seq_len 1024" in full_length.description["cause"]
    fits = deployment.run(dict(smp, hyperparameters={"global_batch_size": 32, "seq_len": 1024}), name="plan-5")
    assert fits.status == "SUCCEEDED", fits.description.get("cause")
    # 16 sequences of gpt-125m fit one A10G only with recomputation
    data_parallel = {"preset": "gpt-125m", "strategy": "single", "instance_type": "ml.g5.2xlarge",
                     "hyperparameters": {"global_batch_size": 16}}
    without_recompute = deployment.run(data_parallel, name="plan-6")
    assert without_recompute.description["error"] == "PlanRejected"
    assert "set hyperparameters.recompute to true" in without_recompute.description["cause"]


def test_an_execution_name_unfit_for_tags_and_s3_keys_is_rejected(deployment):
    run = deployment.run({}, name="run.1!")
    assert run.description.get("error") == "InvalidInput"
    assert run.description["cause"].startswith('the execution name must be letters, digits, - and _')
    assert '"run.1!"' in run.description["cause"]
    assert deployment.jobs.created == []


def test_the_longest_endpoint_name_sagemaker_allows_passes(deployment):
    name = "a" * (63 - len("lmstack-"))
    run = deployment.run({"deploy": {"enabled": True, "endpoint_name": name, "instance_type": "ml.g4dn.12xlarge"}})
    assert run.status == "SUCCEEDED", (run.description.get("cause"), run.states_entered()[-5:])
    assert run.output["deploy"]["endpoint_name"] == "lmstack-" + name


BATCH_GRID = [
    # (strategy, instance type, count, global batch, mp_parameters)
    ("horovod", "ml.p3.16xlarge", 2, 96, None), ("horovod", "ml.p3.16xlarge", 2, 100, None),
    ("mwms", "ml.p4d.24xlarge", 3, 48, None), ("mwms", "ml.p4d.24xlarge", 3, 36, None),
    ("smddp", "ml.p4d.24xlarge", 2, 8, None),
    ("smp", "ml.p3.16xlarge", 1, 32, {"partitions": 2, "microbatches": 4}),
    ("smp", "ml.p3.16xlarge", 1, 32, {"partitions": 2, "microbatches": 3}),
    ("smp", "ml.p3.16xlarge", 10, 480, {"partitions": 2, "microbatches": 12}),
    ("smp", "ml.p3.16xlarge", 10, 512, {"partitions": 2, "microbatches": 4}),
    ("horovod", "ml.g5.12xlarge", 1, 4002, None), ("horovod", "ml.g5.12xlarge", 1, 4000, None),
]


@pytest.mark.slow
def test_the_gate_refuses_a_batch_exactly_when_the_planner_moves_it(deployment):
    """The runtime's batch rule (a multiple of the data-parallel size, and of the microbatches under SMP) and
    the memory, as `controlplane.planner.plan` decides them, on a grid: refused before any job exactly where
    the planner moves the batch (InvalidInput) or finds it does not fit (PlanRejected)."""
    outcomes = set()
    for index, (strategy, instance_type, count, batch, mp) in enumerate(BATCH_GRID):
        recompute = strategy != "smp"  # controlplane.rules refuses recomputation with smp
        execution_input = {"preset": "gpt-125m", "strategy": strategy, "instance_type": instance_type,
                           "instance_count": count,
                           "hyperparameters": {"global_batch_size": batch, "recompute": recompute}}
        if mp:
            execution_input["mp_parameters"] = dict(mp, horovod=True)
        chosen = planner.plan("gpt-125m", instance_type, count, strategy, global_batch=batch, recompute=recompute,
                              partitions=mp and mp["partitions"], microbatches=mp and mp["microbatches"])["chosen"]
        run = deployment.run(execution_input, name="batch-%d" % index)
        if chosen["global_batch"] != batch:
            expected = ("InvalidInput", "controlplane.planner: global_batch %d is not a multiple" % batch)
        elif not chosen["ok"]:
            expected = ("PlanRejected", "lmstack.plan: ")
        else:
            expected = (None, "")
        found = (run.description.get("error"), run.description.get("cause", ""))
        assert found[0] == expected[0] and found[1].startswith(expected[1]), (execution_input, found)
        assert bool(run.calls("createTrainingJob")) == (expected[0] is None)
        outcomes.add(expected[0])
    assert outcomes == {None, "InvalidInput", "PlanRejected"}


def test_hosting_types_are_the_known_types_the_endpoint_api_accepts():
    """CreateEndpointConfig takes ProductionVariantInstanceType (botocore's service model), not the training list."""
    import botocore.session

    from controlplane.containers import HOSTING_INSTANCE_TYPES
    enum = botocore.session.get_session().get_service_model("sagemaker").shape_for("ProductionVariantInstanceType").enum
    assert list(HOSTING_INSTANCE_TYPES) == [name for name in INSTANCES if name in enum]
    assert "ml.p3dn.24xlarge" in INSTANCES and "ml.p3dn.24xlarge" not in HOSTING_INSTANCE_TYPES


def test_a_type_that_trains_but_cannot_host_is_refused_before_training(deployment):
    from lmstack import start
    from stacks.settings import Settings

    execution_input = {"deploy": {"enabled": True, "instance_type": "ml.p3dn.24xlarge"}}
    run = deployment.run(execution_input, name="p3dn-endpoint")
    assert run.description.get("error") == "InvalidInput", run.description.get("cause")
    assert "deploy.instance_type must be one of" in run.description["cause"]
    assert "'ml.p3dn.24xlarge'" in run.description["cause"]
    assert deployment.jobs.created == []
    with pytest.raises(start.StartError, match="deploy.instance_type"):
        start.validate_input(execution_input, Settings())
