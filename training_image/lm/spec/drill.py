"""Divergence drills: the faults `LMSTACK_FAULTS` causes on purpose in a training job (lm.training.divergence
acts on them; the control plane's gate checks an input's `drill.faults` with `parse_faults`).

Never a hyperparameter: the training job reads the faults only from its environment, which the state machine
sets only for an input with `drill.faults`, and the gate accepts that only for a short run.
"""
import re

FAULTS_ENVIRONMENT = "LMSTACK_FAULTS"
DEFAULT_LR_FACTOR = 1000.0
FORMS = "lr_spike@STEP[xFACTOR], nan@STEP, spike@STEP:COUNT (STEP >= 1), separated by commas"
_FAULT = re.compile(r"^(?:(lr_spike)@(\d+)(?:x(\d+(?:\.\d*)?))?|(nan)@(\d+)|(spike)@(\d+):(\d+))$")


def parse_faults(text, label=FAULTS_ENVIRONMENT):
    """{"lr": {step: factor}, "nan": {step}, "spike": {first step: count}} of a faults value (STEP: the 1-based
    step of the log lines); a ValueError names `label`, the bad item and the forms allowed."""
    faults = {"lr": {}, "nan": set(), "spike": {}}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        match = _FAULT.match(item)
        if not match or any(number is not None and int(number) == 0 for number in match.group(2, 5, 7, 8)):
            raise ValueError("%s: %r is not one of %s" % (label, item, FORMS))
        if match.group(1):
            faults["lr"][int(match.group(2))] = float(match.group(3) or DEFAULT_LR_FACTOR)
        elif match.group(4):
            faults["nan"].add(int(match.group(5)))
        else:
            faults["spike"][int(match.group(7))] = int(match.group(8))
    return faults
