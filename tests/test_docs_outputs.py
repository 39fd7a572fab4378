"""What the documentation shows a command print is what it prints (`docs_outputs`: marked blocks, rewritten by
`python tests/docs_outputs.py --write`), and `lmstack.plan` gives every execution input of the documentation the
hours and dollars the gate gives it (issue 40 item 10)."""
import contextlib
import io
import json
import re

import pytest

import docs_outputs
from controlplane import gate
from lmstack import cdk_settings, plan

MARKED = [pytest.param(command, output, id="%s:%d" % (page.name, index))
          for page in docs_outputs.PAGES for index, (command, output) in enumerate(docs_outputs.blocks(page))]


def test_the_docs_show_outputs_of_the_planner_and_of_start():
    commands = " ".join(command for command, _ in (param.values for param in MARKED))
    assert "-m lmstack.plan" in commands and "-m lmstack.start" in commands


@pytest.mark.parametrize("command, written", MARKED)
def test_each_output_the_docs_show_is_what_its_command_prints(command, written):
    assert docs_outputs.run(command) == written, "stale output in the docs: run .venv/bin/python tests/docs_outputs.py --write"


def execution_inputs():
    found = []
    for page in docs_outputs.PAGES:
        texts = [found.group(1) for found in re.finditer(r"^```json\n(.*?)^```", page.read_text(), re.S | re.M)]
        found += [pytest.param(json.loads(text), id="%s:%d" % (page.name, index)) for index, text in enumerate(texts)]
    return found


@pytest.mark.parametrize("example", execution_inputs())
def test_the_plan_of_each_example_input_has_the_gates_hours_and_dollars(example):
    settings, _ = cdk_settings.load(cdk_settings.DEFAULT_CDK_JSON)
    decision = gate.decide(example, gate.Context(gate.Deployment.of(settings)))
    if gate.deploy_only(decision.config):
        return  # serving only: nothing to plan
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert plan.main(["--input", json.dumps(example), "--json"]) == 0
    result = json.loads(printed.getvalue())
    timing = result["chosen"]["time"]
    cost = timing["cost_spot_usd" if decision.config["spot"] else "cost_on_demand_usd"]
    assert (timing["hours"], cost) == (decision.plan["hours"], decision.plan["cost_usd"])
    assert result["deployment"]["inter_container_traffic_encryption"]["value"] is \
        settings.inter_container_traffic_encryption
