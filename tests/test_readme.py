"""The README's generated parts stay equal to what the code generates."""
import pathlib

from lmstack import diagram
from stacks.config import Settings
from stacks.state_machine import build_training_definition

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_diagram_is_the_generated_one():
    text = README.read_text()
    generated = diagram.mermaid(build_training_definition(Settings()))
    assert generated in text, "README's state machine diagram is stale: paste `python -m lmstack.diagram`"


def test_diagram_has_every_stage_of_the_definition():
    definition = build_training_definition(Settings())
    start, edges = diagram.stage_edges(definition)
    drawn = {start} | {stage for edge in edges for stage in edge}
    assert {diagram.stage(name) for name in definition["States"]} <= drawn
