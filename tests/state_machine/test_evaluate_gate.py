"""The evaluate stage's input (issue 41.3): the gate refuses before any job what it can know, plans and prices the
evaluation job, and the request builder makes its CreateTrainingJob request (botocore's validation)."""
import importlib.util
import json

import botocore.session
import botocore.validate
import pytest
from state_machine.harness import StandInSettings

import aws_rules
from controlplane import bucket_layout, evaluation, gate, inputs, metrics, prices, request
from lm.spec import contract
from lm.spec import evaluation as evaluation_spec
from lmstack import evaluation_tasks, local_sfn
from lmstack.local_sfn import ACCOUNT, REGION
from stacks.state_machine import jobs, render

CONTEXT = gate.Context(gate.Deployment.of(StandInSettings()))
TASK_DATA = "s3://lmstack-artifacts/%ssample/" % bucket_layout.TASK_DATA_PREFIX
MODEL = "s3://lmstack-artifacts/%slmstack-train-abc-1/output/model.tar.gz" % bucket_layout.OUTPUT_PREFIX


def _evaluate(**given):
    return {"preset": "tiny", "evaluate": dict({"enabled": True}, **given)}


def _refusal(execution_input):
    with pytest.raises(gate.Refusal) as refused:
        gate.decide(execution_input, CONTEXT)
    return str(refused.value)


def test_an_unknown_built_in_task_is_refused_naming_it_and_where_the_names_come_from():
    cause = _refusal(_evaluate(tasks=["hellaswag", "helaswag"], data_s3_uri=TASK_DATA))
    assert "evaluate.tasks entry \"helaswag\" is not one of lm-eval's tasks" in cause
    assert "lm_eval_tasks.json" in cause and "YAML file in data_s3_uri" in cause


@pytest.mark.parametrize("tasks, why", [
    ("hellaswag", "must be a list"), (["hellaswag", "hellaswag"], "names a task twice"),
    (["../secret.yaml"], "letters, digits"), (["a,b.yaml"], "letters, digits"),
    (["t%d.yaml" % index for index in range(evaluation.MAX_TASKS + 1)], "at most %d" % evaluation.MAX_TASKS)])
def test_a_task_list_the_job_could_not_take_is_refused(tasks, why):
    assert why in _refusal(_evaluate(tasks=tasks, data_s3_uri=TASK_DATA))


@pytest.mark.parametrize("tasks", [["hellaswag"], ["my_task.yaml"]])
def test_tasks_need_their_data_staged(tasks):
    cause = _refusal(_evaluate(tasks=tasks))
    assert cause.startswith("evaluate.tasks %s need evaluate.data_s3_uri" % tasks[0])
    assert bucket_layout.TASK_DATA_PREFIX in cause


@pytest.mark.parametrize("uri", ["s3://lmstack-artifacts/output/x/", "s3://lmstack-artifacts/tasks/*"])
def test_task_data_outside_the_readable_prefix_is_refused(uri):
    assert "evaluate.data_s3_uri must be a prefix" in _refusal(_evaluate(tasks=["lambada_openai"], data_s3_uri=uri))


def test_an_instance_type_that_cannot_hold_the_model_is_refused_with_types_that_can():
    big = {"preset": "gpt-1.3b", "instance_type": "ml.p4d.24xlarge",
           "hyperparameters": {"global_batch_size": 8, "recompute": True}}
    cause = _refusal(dict(big, evaluate={"enabled": True}))  # the default, one A10G
    assert cause.startswith("evaluate.instance_type %s cannot hold preset gpt-1.3b's evaluation" %
                            evaluation.DEFAULT_INSTANCE_TYPE)
    suggested = cause.split("the cheapest types that hold it: ")[1].split(", ")
    assert len(suggested) == 4
    for instance_type in suggested:
        decision = gate.decide(dict(big, evaluate={"enabled": True, "instance_type": instance_type}), CONTEXT)
        assert decision.plan["evaluate"]["memory_gib"] <= decision.plan["evaluate"]["usable_gib"]
    assert gate.decide(_evaluate(instance_type="ml.m5.xlarge"), CONTEXT).plan["evaluate"]["usable_gib"] > 0


def test_the_memory_estimate_counts_weights_logits_and_keys_and_values():
    from controlplane import presets
    config = presets.ALL_PRESETS["gpt-125m"]
    memory = evaluation.inference_memory(config, 8, 1024)
    # GPT-2 small's 124,439,808 parameters (tied embeddings, 1024 positions), with this preset's longer context
    # and the vocabulary padded to a multiple of 128
    gpt2_small, d_model = 124439808, 768
    parameters = gpt2_small + (config.block_size - 1024) * d_model + (config.padded_vocab_size - 50257) * d_model
    assert memory["weights"] == 4 * parameters
    assert memory["logits"] == 2 * 4 * 8 * 1024 * config.padded_vocab_size
    assert memory["keys_values"] == 2 * 4 * 12 * 8 * 1024 * 768
    assert memory["peak"] == memory["weights"] + memory["logits"] + memory["keys_values"] + memory["block"]


def test_a_deploy_only_run_has_nothing_to_evaluate():
    given = {"preset": "tiny", "evaluate": {"enabled": True}, "deploy": {"enabled": True, "model_artifact": MODEL}}
    assert "evaluate" in _refusal(given)


def test_the_plan_holds_what_the_job_gets_and_its_price_counts_in_the_budget():
    given = dict(_evaluate(tasks=["lambada_openai", "mine.yaml"], data_s3_uri=TASK_DATA, limit=50,
                           instance_type="ml.g5.xlarge", max_runtime_seconds=7200), budget_usd=1000.0)
    decision = gate.decide(given, CONTEXT)
    planned = decision.plan["evaluate"]
    assert planned["tasks"] == "lambada_openai,mine.yaml" and planned["limit"] == 50
    assert planned["batch_size"] == evaluation.BATCH_SIZE
    assert [d["Name"] for d in planned["metric_definitions"]] == [
        "evaluation:pile_bpb", "evaluation:lambada_openai", "evaluation:mine.yaml"]
    price = prices.on_demand_price("ml.g5.xlarge")
    assert planned["max_cost_usd"] == round(price * 2, 2)
    assert decision.plan["budget"]["evaluation_usd"] == round(price * 2, 2)
    assert any("the evaluation job at most $%.2f" % (price * 2) in note for note in decision.notes)
    assert decision.plan["poll"] == gate.decide(dict(given, evaluate={"enabled": False}), CONTEXT).plan["poll"]
    assert gate.decide({"preset": "tiny"}, CONTEXT).plan["evaluate"] is None


def test_the_score_lines_the_job_logs_are_what_its_metric_definitions_read():
    definitions = metrics.evaluation_definitions(["pile_bpb", "arc_easy", "my-task.v2.yaml"])
    lines = [evaluation_spec.format_score_log("arc_easy", "acc", 0.4375),
             evaluation_spec.format_score_log("my-task.v2.yaml", "exact_match,strict-match", 0.125),
             evaluation_spec.format_score_log("pile_bpb", "bits_per_byte", 1.2345678),
             evaluation_spec.format_score_log("my-taskxv2.yaml", "acc", 0.9)]  # "." is no wildcard
    found = [metrics.parse_metrics(line, definitions) for line in lines]
    assert found == [{"evaluation:arc_easy": 0.4375}, {"evaluation:my-task.v2.yaml": 0.125},
                     {"evaluation:pile_bpb": 1.2345678}, {}]


def _request(**evaluate):
    """The request of the evaluation job, placeholders filled with the stand-ins of the deployed resources."""
    settings = StandInSettings()
    config = gate.decide(_evaluate(**evaluate), CONTEXT).config
    values = jobs.concrete_values(jobs.EVALUATE, settings, config, job_name="lmstack-eval-abc-1",
                                  execution_name="run-1", trained=("lmstack-train-abc-1", MODEL))
    stand_ins = local_sfn.stand_in_values(settings, "arn:aws:sns:%s:%s:lmstack-events" % (REGION, ACCOUNT),
                                          "arn:aws:lambda:%s:%s:function:lmstack-gate:1" % (REGION, ACCOUNT))
    return json.loads(render(request.create_training_job_request(values), stand_ins)), stand_ins


@pytest.mark.parametrize("evaluate", [dict(tasks=["arc_easy", "mine.yaml"], data_s3_uri=TASK_DATA, limit=20), {}],
                         ids=["tasks", "bits-per-byte-only"])
def test_the_evaluation_job_request_passes_botocore_s_validation(evaluate):
    built, stand_ins = _request(**evaluate)
    model = botocore.session.get_session().get_service_model("sagemaker")
    report = botocore.validate.ParamValidator().validate(built, model.operation_model("CreateTrainingJob").input_shape)
    assert not report.has_errors(), report.generate_report()
    assert aws_rules.check_requests([("arn:aws:states:::aws-sdk:sagemaker", "createTrainingJob", built)]) == []
    channels = {channel["ChannelName"]: channel["DataSource"] for channel in built["InputDataConfig"]}
    assert channels[contract.MODEL_CHANNEL]["S3DataSource"]["S3Uri"] == MODEL
    assert channels[contract.TRAIN_CHANNEL]["FileSystemDataSource"]["FileSystemAccessMode"] == "ro"
    assert (contract.TASKS_CHANNEL in channels) == bool(evaluate)
    assert built["OutputDataConfig"]["S3OutputPath"] == "s3://%s/%srun-1" % (
        stand_ins["ArtifactBucket"], bucket_layout.EVALUATION_PREFIX)
    hyperparameters = built["HyperParameters"]
    assert json.loads(hyperparameters["sagemaker_program"]) == "evaluate.py"
    assert json.loads(hyperparameters["tasks"]) == ",".join(evaluate.get("tasks", []))
    assert json.loads(hyperparameters["limit"]) == evaluate.get("limit", 0)
    assert "model_dir" not in hyperparameters and "CheckpointConfig" not in built
    assert built["ResourceConfig"]["InstanceCount"] == 1 and "EnableManagedSpotTraining" not in built
    assert built["AlgorithmSpecification"]["MetricDefinitions"][0]["Name"] == "evaluation:pile_bpb"
    assert {tag["Key"]: tag["Value"] for tag in built["Tags"]}[request.KIND_TAG] == "evaluate"


def test_with_mlflow_the_evaluation_logs_into_the_training_job_s_run():
    config = gate.decide(_evaluate(), CONTEXT).config
    arn = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/lmstack"
    values = jobs.concrete_values(jobs.EVALUATE, StandInSettings(mlflow_resource_arn=arn), config,
                                  job_name="lmstack-eval-abc-1", execution_name="run-1",
                                  trained=("lmstack-train-abc-1", MODEL))
    built = request.create_training_job_request(values)
    assert built["Environment"][contract.MLFLOW_RUN_NAME] == "lmstack-train-abc-1"
    assert built["Environment"]["MLFLOW_TRACKING_URI"] == arn and "MlflowConfig" not in built


def test_every_input_field_of_evaluate_has_its_default():
    defaults = inputs.defaults(inputs.schema(StandInSettings()))["evaluate"]
    assert defaults == {"enabled": False, "tasks": (), "data_s3_uri": None,
                        "instance_type": evaluation.DEFAULT_INSTANCE_TYPE,
                        "max_runtime_seconds": evaluation.DEFAULT_MAX_RUNTIME_SECONDS, "limit": None}


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed here")
def test_the_shipped_task_names_are_those_of_the_installed_lm_eval():
    generated = evaluation_tasks.generate()
    with open(evaluation.TASKS_FILE) as handle:
        shipped = json.load(handle)
    assert shipped == generated, "run python -m lmstack.evaluation_tasks"
