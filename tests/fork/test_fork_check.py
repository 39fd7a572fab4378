"""docs/fork.md, "Add a check to the gate": one function in `controlplane/gate.py`, added to
`controlplane.gate.CHECKS`, refuses on every path that asks the gate: the state machine's Validate state
(the gate's Lambda code, staged after the edit and run from it on moto) and `lmstack.start`, in the same
words, before any job. Without the edit, both accept the input.

The edit is made to a copy of the module's source run in its place (`recipe`), which the harness stages
into the function's code as `cdk synth` would.
"""
from state_machine.harness import StandInSettings

from controlplane import gate
from lmstack import start

from . import recipe

CHECK = '''
def check_instance_cap(decision, context):
    """This fork trains on at most 8 instances."""
    if decision.config["instance_count"] > 8:
        raise Refusal("instance_count must be at most 8 in this fork, got %d" % decision.config["instance_count"])


'''
CHECKS = ("check_serving, check_history, check_quotas)", "check_serving, check_history, check_quotas, check_instance_cap)")
MESSAGE = "instance_count must be at most 8 in this fork, got 10"
RUN = {"strategy": "mwms", "instance_count": 10, "hyperparameters": {"global_batch_size": 80, "max_steps": 5}}


def paths(deployment, execution_input, name):
    run = deployment.run(execution_input, name=name)
    return {"validate": run.description.get("cause") if run.status == "FAILED" else None,
            "start": recipe.rejection(lambda: start.validate_input(execution_input, StandInSettings()),
                                      start.StartError)}


def test_without_the_check_both_paths_accept_the_run(deployment):
    assert paths(deployment, RUN, "ten") == {"validate": None, "start": None}


def test_a_check_added_to_the_list_refuses_on_every_path(monkeypatch, make_deployment):
    source = recipe.replaced(gate, CHECKS)
    at = source.index("\nCHECKS = (")
    recipe.run_in_place(monkeypatch, gate, source[:at + 1] + CHECK + source[at + 1:])
    deployment = make_deployment()  # the gate's code staged after the edit
    assert paths(deployment, RUN, "ten") == {"validate": MESSAGE, "start": MESSAGE}
    assert paths(deployment, dict(RUN, instance_count=8), "eight") == {"validate": None, "start": None}
    assert len(deployment.jobs.created) == 1  # the run on 8 instances
