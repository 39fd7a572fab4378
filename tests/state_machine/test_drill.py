"""A divergence drill (issue 42 item 4): the input's drill.faults, accepted only for a short run and as the
training job parses it, reaches the training job as LMSTACK_FAULTS, and no other input sets it; the completion
notification carries the final metrics (skipped steps and rollbacks among them)."""
import pytest
from state_machine.harness import invalid_sagemaker_requests
from state_machine.test_gate import CONTEXT

from controlplane import gate


def test_the_gate_takes_a_drill_only_for_a_short_run_and_in_the_job_s_syntax():
    accepted = gate.decide({"hyperparameters": {"max_steps": 999}, "drill": {"faults": "nan@30,lr_spike@40x1000"}},
                           CONTEXT)
    assert accepted.config["drill"]["faults"] == "nan@30,lr_spike@40x1000"
    with pytest.raises(gate.Refusal, match="drill.faults is a drill tool, accepted only with "
                                           "hyperparameters.max_steps under 1000, got 1000"):
        gate.decide({"hyperparameters": {"max_steps": 1000}, "drill": {"faults": "nan@30"}}, CONTEXT)
    with pytest.raises(gate.Refusal, match=r"drill.faults: 'nan30' is not one of lr_spike@STEP\[xFACTOR\], nan@STEP"):
        gate.decide({"hyperparameters": {"max_steps": 100}, "drill": {"faults": "nan30"}}, CONTEXT)
    assert gate.decide({"hyperparameters": {"max_steps": 5000}}, CONTEXT).config["drill"] == {"faults": None}


@pytest.mark.slow
def test_the_training_job_gets_the_faults_in_its_environment_only_for_a_drill(deployment):
    run = deployment.run({"preset": "tiny", "hyperparameters": {"max_steps": 100}, "drill": {"faults": "nan@30"}},
                         name="drill-1")
    assert run.status == "SUCCEEDED", run.description
    (_, _, sent), = run.calls("createTrainingJob")
    assert sent["Environment"] == {"LMSTACK_FAULTS": "nan@30"}
    assert "faults" not in str(sent["HyperParameters"])
    assert invalid_sagemaker_requests(run) == []
    # The completion names the final metrics, where a run's skipped steps and rollbacks are (lm.training.divergence).
    (completed,) = [message for message in deployment.notifications() if " completed: model " in message]
    assert ", final metrics [" in completed, completed
