"""The Validate stage refuses what a model family does not declare (lm.spec.families.CAPABILITIES),
before any job exists, naming the family and the capability; the same input with a family that
declares it gets past that check. lmstack.start's side: tests/start/test_start.py."""
import pytest
from family_cases import ASKING, having_message, lacking_cases

from lm.spec import conditions
from lm.spec.families import FAMILIES
from lm.spec.job import family_rules

# (input asking one capability of a family that lacks it, the family, what the message says was asked, the
# capability): every family of the registry, on its smallest preset (tests/family_cases.py).
ASKS = [(ASKING[capability][0](preset, family), family, ASKING[capability][1], capability)
        for preset, family, capability in lacking_cases(ASKING)]


def test_rnn_declares_what_its_code_does():
    """rnn: no smp.DistributedModel class, its builder refuses recompute, its model has no init_cache,
    lm.hf writes and reads neither Hugging Face layout. Every rule rnn's declaration generates is
    asked above; llama's one missing capability (no SMP wrapper) is its only other rule."""
    assert FAMILIES["rnn"].capabilities == () and FAMILIES["rnn"].hf_model_type is None
    assert FAMILIES["gpt"].hf_model_type == "gpt2" and FAMILIES["gpt"].supports("smp")
    assert FAMILIES["llama"].hf_model_type == "llama" and not FAMILIES["llama"].supports("smp")
    assert sorted(found.name for found in family_rules()) == sorted("family.%s.%s" % (family, c) for _, family, _, c in ASKS)


@pytest.mark.slow
def test_the_validate_stage_refuses_each_capability_a_family_lacks(deployment):
    for index, (execution_input, family, asked, capability) in enumerate(ASKS):
        run = deployment.run(execution_input, name="family-%d" % index)
        assert run.status == "FAILED", execution_input
        assert run.description["error"] == conditions.INVALID, run.description
        cause = run.description["cause"]
        assert cause.startswith("model %s cannot use %s (capability %s: " % (family, asked, capability)), cause
        assert cause.endswith("; " + having_message(capability)), cause
    assert deployment.jobs.created == []


@pytest.mark.slow
def test_the_same_input_for_gpt_is_not_refused_for_a_capability(deployment):
    execution_input = {"preset": "tiny", "hyperparameters": {"model": "gpt", "recompute": True, "max_steps": 2}}
    run = deployment.run(execution_input, name="family-gpt")
    assert run.status == "SUCCEEDED", (run.description.get("cause"), run.states_entered()[-5:])
