"""The Validate stage refuses what a model family does not declare (lm.spec.families.CAPABILITIES),
before any job exists, naming the family and the capability; the same input with a family that
declares it gets past that check. lmstack.start's side: tests/start/test_start.py."""
import pytest

from lm.spec import conditions
from lm.spec.families import FAMILIES
from lm.spec.job import family_rules

RNN = {"preset": "rnn-tiny", "hyperparameters": {"model": "rnn"}}
DEPLOY = {"enabled": True, "instance_type": "ml.g4dn.12xlarge"}
# (input asking one capability of rnn, what the message says was asked, the capability)
ASKS = [
    (dict(RNN, strategy="smp", instance_type="ml.p3.16xlarge"), "strategy smp", "smp"),
    (dict(RNN, hyperparameters={"model": "rnn", "recompute": True}), "hyperparameters.recompute true", "recompute"),
    (dict(RNN, hyperparameters={"model": "rnn", "export_hf": True}), "hyperparameters.export_hf true", "hf_export"),
    (dict(RNN, init_from="s3://bucket/init/gpt2/"), "init_from (a Hugging Face checkpoint)", "hf_import"),
    (dict(RNN, deploy=dict(DEPLOY, container="tgi")), "deploy.container tgi", "tgi"),
    (dict(RNN, deploy=dict(DEPLOY, container="lmi")), "deploy.container lmi", "lmi"),
]
# The families that declare each capability, as the message names them: llama has all but smp.
HAVING = {"smp": "gpt"}


def test_rnn_declares_what_its_code_does():
    """rnn: no smp.DistributedModel class, its builder refuses recompute, its model has no init_cache,
    lm.hf writes and reads neither Hugging Face layout. Every rule rnn's declaration generates is
    asked above; llama's one missing capability (no SMP wrapper) is its only other rule."""
    assert FAMILIES["rnn"].capabilities == () and FAMILIES["rnn"].hf_model_type is None
    assert FAMILIES["gpt"].hf_model_type == "gpt2" and FAMILIES["gpt"].supports("smp")
    assert FAMILIES["llama"].hf_model_type == "llama" and not FAMILIES["llama"].supports("smp")
    assert sorted(found.name for found in family_rules()) == sorted(
        ["family.rnn.%s" % c for _, _, c in ASKS] + ["family.llama.smp"])


@pytest.mark.slow
def test_the_validate_stage_refuses_each_capability_rnn_lacks(deployment):
    for index, (execution_input, asked, capability) in enumerate(ASKS):
        run = deployment.run(execution_input, name="family-%d" % index)
        assert run.status == "FAILED", execution_input
        assert run.description["error"] == conditions.INVALID, run.description
        cause = run.description["cause"]
        assert cause.startswith("model rnn cannot use %s (capability %s: " % (asked, capability)), cause
        assert cause.endswith("; families with it: %s" % HAVING.get(capability, "gpt, llama")), cause
    assert deployment.jobs.created == []


@pytest.mark.slow
def test_the_same_input_for_gpt_is_not_refused_for_a_capability(deployment):
    execution_input = dict(RNN, preset="tiny", hyperparameters={"model": "gpt", "recompute": True, "max_steps": 2})
    run = deployment.run(execution_input, name="family-gpt")
    assert run.status == "SUCCEEDED", (run.description.get("cause"), run.states_entered()[-5:])
