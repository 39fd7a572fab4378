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
