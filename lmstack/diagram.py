"""The README's diagram, generated from the shipped state machine definition.

`python -m lmstack.diagram` prints a Mermaid flowchart of the main state machine, one node
per stage (the part of a state's name before the first dot), one edge wherever a state of
one stage can go to a state of another. tests/test_readme.py checks the README holds
exactly this text, so the picture cannot drift from the definition.
"""
import argparse
import collections

from stacks.settings import Settings
from stacks.state_machine import build_training_definition

FENCE = "```mermaid"


def _targets(state):
    for key in ("Next", "Default"):
        if key in state:
            yield state[key]
    for choice in state.get("Choices", []):
        yield choice["Next"]
    for catcher in state.get("Catch", []):
        yield catcher["Next"]


def stage(name):
    return name.split(".", 1)[0]


def stage_edges(definition):
    """[(from_stage, to_stage)] in first-seen order, plus the stage the machine starts in."""
    edges = collections.OrderedDict()
    for name, state in definition["States"].items():
        for target in _targets(state):
            if stage(name) != stage(target):
                edges[(stage(name), stage(target))] = None
        if state["Type"] in ("Fail", "Succeed") or state.get("End"):
            edges[(stage(name), "Failed" if state["Type"] == "Fail" else "Done")] = None
    return stage(definition["StartAt"]), list(edges)


def mermaid(definition):
    start, edges = stage_edges(definition)
    lines = [FENCE, "flowchart LR", "    start((input)) --> %s" % start]
    lines += ["    %s --> %s" % edge for edge in edges]
    lines.append("```")
    return "\n".join(lines)


def main(argv=None):
    argparse.ArgumentParser(prog="python -m lmstack.diagram", description=__doc__.split("\n\n")[1]).parse_args(argv)
    print(mermaid(build_training_definition(Settings())))


if __name__ == "__main__":
    main()
