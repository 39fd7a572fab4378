"""Perform a checklist of docs/fork.md in this process, as an edit of the source files would.

A recipe edits source files; the next process that imports them sees the edit everywhere. Here
the edit is made to a copy of a module's source (`edited`, `replaced`: each at an anchor that must
occur exactly once, so a checklist whose file moved fails loudly) and run in the place of the
module, in one of two ways:

- `run_in_place(monkeypatch, module, source)`: the edited source runs in the module's own
  namespace (as tests/state_machine/test_rules.py does), so every module that reads
  `module.NAME` at call time sees the edit; the namespace is restored afterwards. The gate's
  Lambda code, which the moto harness stages from the tree, gets the edited file too
  (`harness.EDITED_SOURCES`): it runs in a process of its own;
- `reimport(monkeypatch, *names)`: modules that bind a name of an edited module when they are
  imported (`from lm.spec.job import STRATEGIES`, a class generated from a table) are imported
  afresh, as the next process would import them; sys.modules and the parent packages are restored
  afterwards. `add_module` registers a new module file's code the same way.

Neither touches a consumer's code: what a consumer does not pick up from the edited tables is a
finding of the test, not something these helpers make up for.
"""
import importlib
import inspect
import sys
import types

from state_machine import harness


def edited(module, *insertions):
    """The source of `module` with each (anchor, text, before) insertion made: `text` goes right
    before (or after) the one occurrence of `anchor`."""
    source = inspect.getsource(module)
    for anchor, text, before in insertions:
        assert source.count(anchor) == 1, "%r occurs %d times in %s" % (anchor, source.count(anchor), module.__file__)
        at = source.index(anchor) + (0 if before else len(anchor))
        source = source[:at] + text + source[at:]
    return source


def replaced(module, *replacements):
    """The source of `module` with each (old, new) replacement made; `old` must occur exactly once."""
    source = inspect.getsource(module)
    for old, new in replacements:
        assert source.count(old) == 1, "%r occurs %d times in %s" % (old, source.count(old), module.__file__)
        source = source.replace(old, new)
    return source


class _OnUndo:
    """An object whose attribute monkeypatch sets when the test's change is made and removes when it
    is undone, which calls `callback` (monkeypatch undoes in reverse order, so after everything
    patched later is back)."""

    def __init__(self, callback):
        self.callback = callback

    def __delattr__(self, name):
        object.__delattr__(self, name)
        self.callback()


def run_in_place(monkeypatch, module, source):
    """Run `source` in `module`'s namespace; the namespace comes back when the test ends. The gate's
    Lambda code staged by the moto harness gets the edited source too, as `cdk synth` would."""
    monkeypatch.setitem(harness.EDITED_SOURCES, module.__file__, source)
    saved = dict(vars(module))

    def restore():
        vars(module).clear()
        vars(module).update(saved)

    monkeypatch.setattr(_OnUndo(restore), "active", True, raising=False)
    exec(compile(source, module.__file__, "exec"), vars(module))


def _parent_binding(monkeypatch, name):
    """Keep the parent package's attribute for `name` as it is now, for after the test."""
    parent, _, child = name.rpartition(".")
    if parent:
        package = importlib.import_module(parent)
        monkeypatch.setattr(package, child, getattr(package, child, None), raising=False)


def reimport(monkeypatch, *names):
    """Import `names` afresh, in order (the old modules are back in sys.modules after the test)."""
    for name in names:
        _parent_binding(monkeypatch, name)
        # present or not before, `name` is back as it was after the test
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name))
        monkeypatch.delitem(sys.modules, name)
    return [importlib.import_module(name) for name in names]


def add_module(monkeypatch, name, source, path):
    """A new module `name` made of `source` (as if the file `path` were added to the tree)."""
    _parent_binding(monkeypatch, name)
    module = types.ModuleType(name)
    module.__file__ = path
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(harness.EDITED_SOURCES, path, source)
    exec(compile(source, path, "exec"), vars(module))
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)
    return module


def rejection(call, error=Exception):
    """The message `call()` fails with (`error`), or None when it succeeds."""
    try:
        call()
    except error as found:
        return str(found)
    return None
