"""The architecture, enforced: what ships in the training image, and which way imports run.

Layers, bottom to top (a module imports only its own layer or lower ones, and no circles):
  0 lm.spec.fields   an input field and its messages (imports no project module)
  1 lm.spec          the TF-free specification the image and the control plane share
  2 lm               the training image's runtime (models, data, training, distributed, serving, hf)
  3 controlplane     synth time and laptop: request builder, planner, prices, serving containers, rules
  4 stacks           the CDK app
  5 lmstack          commands (start, plan, demo)
Within a layer, imports run one way between packages too (lm.training uses lm.distributed, lm.spec
uses lm.spec.families, never the reverse), imports inside functions included.
"""
import ast
import os
import sys

import pytest

import imports

# The (sub)packages whose imports must run one way, at least: the check derives them from the tree
# (every directory with an __init__.py) and refuses to lose one of these.
SUBPACKAGES = ("lm", "lm.data", "lm.distributed", "lm.eval", "lm.hf", "lm.models", "lm.serving", "lm.spec", "lm.spec.families",
               "lm.training", "controlplane", "stacks", "lmstack")
LAYERS = (("lm.spec.fields", 0), ("lm.spec", 1), ("lm", 2), ("controlplane", 3), ("stacks", 4), ("lmstack", 5))
# What the image runs: the training toolkit's programs, hosting's `serve`, `python -m lm.hf`
# (converts an export to the Hugging Face layout and back, in the image or next to it) and
# `python -m lm.eval` and `python -m lm.eval.harness` (lm-eval tasks and bits per byte on the current-TF image).
IMAGE_ENTRY_POINTS = ("train.py", "prepare.py", os.path.join("bin", "serve"), os.path.join("lm", "hf", "__main__.py"),
                      os.path.join("lm", "eval", "__main__.py"), os.path.join("lm", "eval", "harness.py"))


def layer(module):
    return next(rank for prefix, rank in LAYERS if module == prefix or module.startswith(prefix + "."))


@pytest.fixture(scope="module")
def edges():
    return imports.graph()


def test_every_import_runs_down_the_layers(edges):
    upward = ["%s (layer %d) imports %s (layer %d)" % (source, layer(source), target, layer(target))
              for source, targets in sorted(edges.items()) for target in sorted(targets) if layer(target) > layer(source)]
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def circles(sites):
    """Each circle of the graph `sites` as the import statements that close it, one step a line."""
    graph = {node: set(targets) for node, targets in sites.items()}
    return ["\n".join(imports.cycle_path(sites, component)) for component in imports.cycles(graph)]


def test_no_import_circles(edges):
    found = circles(imports.graph_sites())
    assert found == [], "modules that import each other, function-local imports included:\n" + "\n\n".join(found)


def test_no_import_circles_between_packages():
    """Imports run one way between (sub)packages too: lm.training may use lm.distributed, or the
    reverse, not both; an import inside a function counts (it hides a circle, it does not remove it)."""
    sites = imports.package_graph_sites()
    assert set(SUBPACKAGES) <= set(sites), "packages the check no longer sees: %s" % sorted(set(SUBPACKAGES) - set(sites))
    found = circles(sites)
    assert found == [], "packages that import each other (innermost package of each module):\n" + "\n\n".join(found)


def test_the_package_circle_check_sees_a_local_import(tmp_path):
    """The check above can fail: a function of lm.spec importing lm.training (which imports lm.spec)
    closes a circle, reported as a path back to its start with the file and line of each import."""
    planted = tmp_path / "planted.py"
    planted.write_text("import json\n\n\ndef run():\n    from lm.training import train\n    return train\n")
    modules = dict(imports.module_files(), **{"lm.spec.planted": str(planted)})
    found = circles(imports.package_graph_sites(modules))
    closing = [circle for circle in found if "lm.spec -> lm.training (%s:5)" % os.path.relpath(str(planted), imports.ROOT)
               in circle.splitlines()]
    assert len(closing) == 1, found
    steps = [line.split(" (")[0].split(" -> ") for line in closing[0].splitlines()]
    assert all(step[1] == after[0] for step, after in zip(steps, steps[1:] + steps[:1])), closing[0]


def test_the_field_type_is_a_leaf(edges):
    assert edges["lm.spec.fields"] == set()


def test_policy_rules_are_at_the_top_of_the_control_plane(edges):
    """controlplane.rules reads the planner and the containers; below the CDK app only the gate reads it
    (controlplane.gate, which decides about an execution input with it), and nothing reads the gate there."""
    readers = sorted(source for source, targets in edges.items()
                     if "controlplane.rules" in targets and layer(source) <= layer("controlplane.rules"))
    assert readers == ["controlplane.gate"]
    assert sorted(source for source, targets in edges.items()
                  if "controlplane.gate" in targets and layer(source) <= layer("controlplane.gate")) == []


def test_the_specification_needs_only_the_standard_library(edges):
    """lm.spec is what the control plane shares with the image: no TensorFlow, NumPy or tokenizers."""
    modules = imports.module_files()
    foreign = []
    for name, path in modules.items():
        if not name.startswith("lm.spec"):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            foreign += ["%s imports %s" % (name, imported) for imported in names
                        if imported.split(".")[0] not in sys.stdlib_module_names and not imported.startswith("lm.spec")]
    assert foreign == []


def test_the_image_build_context_holds_only_what_the_image_runs():
    """Every module in training_image/ (the Docker build context of every image) is reached from the
    image's entry points: a control-plane module moved into it (the planner, the request builder)
    would change every image's asset hash and rebuild three GPU images for a synth-time edit."""
    modules = imports.module_files()
    entry_files = [os.path.join(imports.IMAGE_CONTEXT, path) for path in IMAGE_ENTRY_POINTS]
    in_context = {name for name, path in modules.items() if path.startswith(imports.IMAGE_CONTEXT + os.sep)}
    unused = sorted(in_context - imports.reachable(entry_files, modules))
    assert unused == [], "in the image's build context but never run by the image: %s" % unused
    stray = [os.path.relpath(os.path.join(dirpath, name), imports.IMAGE_CONTEXT)
             for dirpath, _, names in os.walk(imports.IMAGE_CONTEXT) for name in names
             if name.endswith(".py") and os.path.relpath(dirpath, imports.IMAGE_CONTEXT).split(os.sep)[0] not in ("lm",)
             and os.path.join(dirpath, name) not in entry_files]
    assert stray == [], "Python files in the build context outside lm/ and the entry points: %s" % stray


def test_the_layer_test_sees_an_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: a runtime module importing the planner is an upward edge, and a
    module only the control plane uses is unreachable from the image's entry points."""
    edges = imports.graph()
    edges["lm.training.train"] = edges["lm.training.train"] | {"controlplane.planner"}
    assert any(layer(target) > layer(source) for source, targets in edges.items() for target in targets)
    modules = dict(imports.module_files())
    planted = tmp_path / "planner_copy.py"
    planted.write_text("import json\n")
    modules["lm.planner_copy"] = str(planted)
    entry_files = [os.path.join(imports.IMAGE_CONTEXT, path) for path in IMAGE_ENTRY_POINTS]
    assert "lm.planner_copy" not in imports.reachable(entry_files, modules)
