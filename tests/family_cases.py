"""The model families a test covers, read from the registry (`lm.spec.families`) and what each declares,
never written out: a family added as docs/fork.md says is tested by every test below that applies to it,
with no test edited. Each family is tried on its smallest preset, so a family adds seconds, not minutes."""
from lm.spec.families import FAMILIES, FAMILY_PRESETS, families_with, parameter_count


def smallest_preset(family):
    """The preset of `family` with the fewest parameters (the `tiny` one each family ships)."""
    return min(FAMILY_PRESETS[family], key=lambda name: parameter_count(FAMILY_PRESETS[family][name]))


def tiny_presets(capability=None):
    """[(smallest preset, family)] of every family with presets, or of those declaring `capability`."""
    names = FAMILIES if capability is None else families_with(capability)
    return [(smallest_preset(family), family) for family in names if FAMILY_PRESETS[family]]


def lacking(capability):
    """The families that do not declare `capability`."""
    return [family for family in FAMILIES if not FAMILIES[family].supports(capability)]


def having_message(capability):
    """How a refusal names the families that declare `capability` (`lm.spec.families.capability_message`)."""
    having = families_with(capability)
    return "families with it: %s" % ", ".join(having) if having else "no family has it"


def lacking_cases(capabilities):
    """[(smallest preset, family, capability)] for each of `capabilities` and each family that does not
    declare it: what the refusals of a family's missing capabilities are tried on."""
    return [(preset, family, capability) for capability in capabilities
            for preset, family in tiny_presets() if not FAMILIES[family].supports(capability)]


DEPLOY = {"enabled": True, "instance_type": "ml.g4dn.12xlarge"}
# capability -> (the execution input of preset `p`, model `m` that asks it, what a refusal says was asked).
# Where the capability's field does not need it, the input names no model: the preset implies it.
ASKING = {
    "smp": (lambda p, m: {"preset": p, "strategy": "smp", "instance_type": "ml.p3.16xlarge"}, "strategy smp"),
    "recompute": (lambda p, m: {"preset": p, "hyperparameters": {"model": m, "recompute": True}},
                  "hyperparameters.recompute true"),
    "hf_export": (lambda p, m: {"preset": p, "hyperparameters": {"model": m, "export_hf": True}},
                  "hyperparameters.export_hf true"),
    "hf_import": (lambda p, m: {"preset": p, "init_from": "s3://lmstack-artifacts/init/gpt2/"},
                  "init_from (a Hugging Face checkpoint)"),
    "tgi": (lambda p, m: {"preset": p, "deploy": dict(DEPLOY, container="tgi")}, "deploy.container tgi"),
    "lmi": (lambda p, m: {"preset": p, "deploy": dict(DEPLOY, container="lmi")}, "deploy.container lmi"),
}
