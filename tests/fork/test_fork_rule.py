"""docs/fork.md, "Add a rule": one rule in each table, refused with its message on each path that
reads that table, and by no other.

1. `lm.spec.job.job_rules` (every job obeys it): strategy horovod without activation
   recomputation. Refused by the Validate stage, `lmstack.start`, `controlplane.planner.cannot_run`
   and the runtime (`lm.spec.job.validate_hyperparameters`, so `lm.training.train`). The settings
   hold no hyperparameters, so they never see a rule over one: the settings' path of `job_rules`
   is tests/state_machine/test_rules.py's (a rule over strategy and instance_count, which the
   runtime in turn cannot see: `validate_hyperparameters` has no instance type nor count).
2. `controlplane.rules.cross_field_rules` (this deployment only): test_rules.py's rule, mwms on
   at most 4 instances, in that table instead. Refused by the Validate stage, `lmstack.start` and
   the settings; the planner does not see it.

Each edit is made to a copy of the module's source run in its place (`recipe`); the state machine
is generated after them. Without them, every path accepts both inputs.
"""
import pytest
from state_machine import test_rules

from controlplane import planner, rules
from controlplane import presets
from lm.spec import job
from lmstack import start
from stacks.settings import Settings, SettingsError

from . import recipe

JOB_RULE = '''
    found.append(rule("strategy.horovod.recompute", All((Is(STRATEGY_FIELD, "horovod"),
                                                         Is("hyperparameters.recompute", True))),
                      "hyperparameters.recompute must be false with strategy horovod in this fork"))
'''
JOB_MESSAGE = "hyperparameters.recompute must be false with strategy horovod in this fork"
HOROVOD = {"strategy": "horovod", "instance_type": "ml.p3.16xlarge", "instance_count": 2, "preset": "tiny",
           "hyperparameters": {"recompute": True}}
# test_rules.py's rule and input (mwms on 5 x ml.p4d.24xlarge), as a rule of the deployment.
DEPLOYMENT_RULE = '''
    found.append(rule("deployment.mwms.instance_count", All((Is(STRATEGY_FIELD, "mwms"), Above("instance_count", 4))),
                      "strategy mwms runs on at most 4 instances here, got instance_count={value}",
                      subject="instance_count"))
'''
RETURN = "\n    return found\n"


def _before_return(module, function, text):
    """`module`'s source with `text` added before the `return found` of `function`."""
    source = recipe.edited(module)
    at = source.index(RETURN, source.index("\ndef %s(" % function))
    return source[:at] + "\n" + text + source[at + 1:]


@pytest.fixture
def with_rules(monkeypatch):
    recipe.run_in_place(monkeypatch, job, _before_return(job, "job_rules", JOB_RULE))
    recipe.run_in_place(monkeypatch, rules, _before_return(rules, "cross_field_rules", DEPLOYMENT_RULE))


def job_rule_paths(deployment, execution_input, name):
    run = deployment.run(execution_input, name=name)
    hyperparameters = dict(execution_input["hyperparameters"], strategy=execution_input["strategy"],
                           preset=execution_input["preset"])
    return {
        "validate": run.description.get("cause") if run.status == "FAILED" else None,
        "start": recipe.rejection(lambda: start.validate_input(execution_input, Settings()), start.StartError),
        "plan": planner.cannot_run(execution_input["strategy"], execution_input["instance_type"],
                                   execution_input["instance_count"], execution_input["hyperparameters"]["recompute"]),
        "runtime": recipe.rejection(lambda: job.validate_hyperparameters(hyperparameters), ValueError),
    }


def test_without_the_rules_every_path_accepts_both_inputs(deployment):
    assert job_rule_paths(deployment, HOROVOD, "horovod") == dict.fromkeys(("validate", "start", "plan", "runtime"))
    assert test_rules._rejections(test_rules.RUN, deployment, "mwms") == dict.fromkeys(
        ("asl", "start", "plan", "settings"))
    assert job.validate_hyperparameters({"strategy": "mwms"})["strategy"] == "mwms"


def test_each_table_is_enforced_on_its_paths(with_rules, make_deployment):
    deployment = make_deployment()  # generated after both edits

    assert job_rule_paths(deployment, HOROVOD, "horovod") == dict.fromkeys(
        ("validate", "start", "plan", "runtime"), JOB_MESSAGE)
    without_recompute = dict(HOROVOD, hyperparameters={"recompute": False})
    assert job_rule_paths(deployment, without_recompute, "horovod-plain") == dict.fromkeys(
        ("validate", "start", "plan", "runtime"))
    Settings(default_strategy="horovod", default_instance_type="ml.p3.16xlarge", default_instance_count=2)

    found = test_rules._rejections(test_rules.RUN, deployment, "mwms")
    assert found["asl"] == found["start"] == test_rules.MESSAGE
    assert "lmstack.default_instance_count: " + test_rules.MESSAGE in found["settings"]
    assert found["plan"] is None  # the planner reads job_rules only
    assert job.validate_hyperparameters({"strategy": "mwms"})["strategy"] == "mwms"  # nor does the runtime
    assert test_rules._rejections(dict(test_rules.RUN, instance_count=4), deployment, "mwms-4")["asl"] is None
    assert len(deployment.jobs.created) == 2  # horovod-plain and mwms-4


def test_the_settings_refuse_a_rule_over_the_strategy_alone(monkeypatch):
    withdrawn = '''
    found.append(rule("strategy.smddp.withdrawn", Is(STRATEGY_FIELD, "smddp"), "strategy smddp is withdrawn here"))
'''
    recipe.run_in_place(monkeypatch, job, _before_return(job, "job_rules", withdrawn))
    assert planner.cannot_run("smddp", "ml.p4d.24xlarge", 2) == "strategy smddp is withdrawn here"
    with pytest.raises(SettingsError, match="strategy smddp is withdrawn here"):
        Settings(default_strategy="smddp", default_instance_type="ml.p4d.24xlarge", default_instance_count=2)


def test_the_runtime_refuses_a_job_rule_over_the_instance_type(capsys):
    from lm.training import train

    refused = "strategy smddp runs only on instance_type"
    assert refused in " ".join(found.message for found in job.job_rules())
    assert train.main(["--dry-run", "--strategy", "smddp", "--instance-type", "ml.g5.2xlarge",
                       "--instance-count", "2"] + presets.train_arguments("tiny")) == 2
    assert refused in capsys.readouterr().err
