"""Capacity-adaptive launch: `fallback_instance_types` in order when a type's capacity errors outlast their
retries. The gate plans the run for the next type (instance type, strategy, batch per device, SMP parameters,
price all that type's), the machine launches that plan and the topic hears what changed; a quota is no
capacity error and falls through to nothing."""
import json

import quota_tables
from state_machine.harness import SUCCESS, invalid_sagemaker_requests

from controlplane import gate
from stacks.state_machine import jobs

CAPACITY = [("InProgress", "Starting", {}),
            ("Failed", "Failed", {"FailureReason": "CapacityError: Unable to provision requested ML compute capacity"})]
# smddp runs only on its library's types: on P5 the gate picks the cheapest strategy that fits there
RUN = {"preset": "gpt-125m", "strategy": "smddp", "instance_type": "ml.p4d.24xlarge", "instance_count": 2,
       "hyperparameters": {"global_batch_size": 64, "max_steps": 100}, "fallback_instance_types": ["ml.p5.48xlarge"]}
QUOTA = ("The account-level service limit 'ml.p4d.24xlarge for training job usage' is 0 Instances, with current "
         "utilization of 0 Instances and a request delta of 2 Instances. Please use AWS Service Quotas to request "
         "an increase for this quota.")


def test_a_run_whose_first_type_has_no_capacity_trains_on_the_second_with_its_plan(deployment):
    deployment.jobs.scripts += [CAPACITY] * jobs.MAX_ATTEMPTS + [SUCCESS]
    run = deployment.run(RUN, name="fallback")
    assert run.status == "SUCCEEDED", (run.description.get("cause"), run.states_entered()[-5:])
    first, second = run.gate_answers()  # the Validate state's, then the fallback's
    assert first["plan"]["instance_type"] == "ml.p4d.24xlarge" and first["plan"]["strategy"] == "smddp"
    planned = second["plan"]
    context = gate.Context(gate.Deployment.of(deployment.settings), execution_name="fallback",
                           clients=quota_tables.clients(quota_tables.account()))
    assert second == json.loads(json.dumps(gate.decide(RUN, context, launch=1).answer()))
    assert planned["instance_type"] == "ml.p5.48xlarge" and planned["strategy"] != "smddp"

    requests = [request for _, _, request in run.calls("createTrainingJob")]
    names = [request["TrainingJobName"] for request in requests]
    assert [name.rsplit("-", 1)[1] for name in names] == [str(attempt) for attempt in range(1, jobs.MAX_ATTEMPTS + 2)]
    for request in requests[:-1]:
        assert request["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge"
        assert request["HyperParameters"]["sagemaker_distributed_dataparallel_enabled"] == "true"
    last = requests[-1]
    hyperparameters = last["HyperParameters"]
    assert last["ResourceConfig"]["InstanceType"] == "ml.p5.48xlarge" and last["ResourceConfig"]["InstanceCount"] == 2
    assert hyperparameters["strategy"] == json.dumps(planned["strategy"])
    assert "sagemaker_distributed_dataparallel_enabled" not in hyperparameters
    assert hyperparameters["global_batch_size"] == "64"  # the run's batch: its learning dynamics stay
    assert last["AlgorithmSpecification"]["TrainingImage"] == deployment.values["Image_tfcurrent"]
    assert invalid_sagemaker_requests(run) == []
    assert run.output["plan"] == planned and run.output["job_name"] == names[-1]

    notices = [message for message in deployment.notifications() if "no capacity" in message]
    assert notices == ["train job: no capacity for ml.p4d.24xlarge after %d attempts (the last: CapacityError: "
                       "Unable to provision requested ML compute capacity); training on ml.p5.48xlarge with its own "
                       "plan: %s" % (jobs.MAX_ATTEMPTS, planned["changes"])]
    assert planned["changes"].startswith("instance_type: ml.p4d.24xlarge -> ml.p5.48xlarge; strategy: smddp -> ")
    assert "usd_per_instance_hour: " in planned["changes"]


def test_a_quota_error_does_not_fall_through(deployment):
    deployment.jobs.create_errors.append(("ResourceLimitExceeded", QUOTA))
    run = deployment.run(RUN, name="quota")
    assert (run.status, run.description["error"]) == ("FAILED", "TrainJobFailed")
    assert "account quota, not capacity" in run.description["cause"] and "ml.p4d.24xlarge" in run.description["cause"]
    assert len(run.calls("createTrainingJob")) == 1 and len(run.gate_answers()) == 1
    assert "Train.Replan" not in run.states_entered()


def test_without_capacity_on_any_type_the_run_fails_naming_the_last(deployment):
    deployment.jobs.scripts += [CAPACITY] * (2 * jobs.MAX_ATTEMPTS)
    run = deployment.run(RUN, name="nowhere")
    assert (run.status, run.description["error"]) == ("FAILED", "TrainJobFailed")
    cause = run.description["cause"]
    assert "(attempt %d of at most %d on instance type ml.p5.48xlarge)" % (jobs.MAX_ATTEMPTS, jobs.MAX_ATTEMPTS) in cause
    assert "CapacityError" in cause and '"resume_from": "nowhere"' in cause
    assert len(deployment.jobs.created) == 2 * jobs.MAX_ATTEMPTS
