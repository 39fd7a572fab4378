"""Who uses each top-level name of the image's modules, read from the source with `ast`.

A definition is a module-level `def`, `class` or assignment of a module under training_image/lm. A use is
a reference to it from a file of the image (its modules and entry points); the control plane's
(controlplane/, stacks/, lmstack/) and the tests' are recorded to say where a name the image does not
use is used instead. A reference is, in the file that makes it:
`from lm.spec.job import X`, `job.X` after `from lm.spec import job` (or `import lm.spec.job as job`),
`lm.spec.job.X` after `import lm.spec.job`, the bare name `X` inside its own module, and a registry's
string "lm.models.gpt:build_model", and `getattr(module, "NAME")` in a package that imports all its
own modules by scanning (`lm.spec.families`: each family module's FAMILY and PRESETS). A name a module imports from another (a re-export, as
`lm.spec.families` does with `GPTConfig`) is followed to the module that defines it.

Which definition makes a reference: the module-level definition around it, or None for a module's
own top-level statements and the image's entry points, which run whenever the image imports them.
"""
import ast
import os

import imports

CONTROL_PLANE = ("controlplane", "stacks", "lmstack")
TESTS = os.path.join(imports.ROOT, "tests")
# The image's programs that are no modules of `lm` (tests/architecture/test_layers.py's entry points).
IMAGE_PROGRAMS = ("train.py", "prepare.py", "evaluate.py", os.path.join("bin", "serve"))


def definitions(tree):
    """{name: node} of a module's top-level definitions (dunder names such as __all__ are Python's)."""
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            targets = [node.name]
        elif isinstance(node, ast.Assign):
            targets = [name.id for target in node.targets for name in ast.walk(target) if isinstance(name, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        else:
            continue
        for name in targets:
            if not name.startswith("__"):
                found[name] = node
    return found


class Index:
    """The definitions of the image's modules and every reference to them (see the module doc)."""

    def __init__(self, modules=None):
        self.modules = modules or imports.module_files()
        self.trees = {name: ast.parse(open(path).read(), path) for name, path in self.modules.items()}
        self.image = sorted(name for name in self.modules if name == "lm" or name.startswith("lm."))
        self.defined = {(module, name) for module in self.image for name in definitions(self.trees[module])}
        # (module, name) -> the (module, name) it re-exports from, for names a module imports at top level.
        self.reexports = {}
        for module in self.image:
            for node in self.trees[module].body:
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in self.modules:
                    for alias in node.names:
                        self.reexports[(module, alias.asname or alias.name)] = (node.module, alias.name)
        # (module, name) -> {referencing (module, name) or None}: references from the image.
        self.image_users = {}
        # (module, name) -> ["file:line", ...]: references from the control plane, and from the tests.
        self.control_plane_users, self.test_users = {}, {}
        for module in self.image:
            self._scan(self.trees[module], self.modules[module], module, self.image_users)
        for path in [os.path.join(imports.IMAGE_CONTEXT, program) for program in IMAGE_PROGRAMS]:
            self._scan(ast.parse(open(path).read(), path), path, None, self.image_users)
        for module, path in sorted(self.modules.items()):
            if module.split(".")[0] in CONTROL_PLANE:
                self._scan(self.trees[module], path, None, self.control_plane_users)
        for dirpath, dirnames, filenames in os.walk(TESTS):
            dirnames[:] = [name for name in dirnames if name != "__pycache__"]
            for path in sorted(os.path.join(dirpath, name) for name in filenames if name.endswith(".py")):
                self._scan(ast.parse(open(path).read(), path), path, None, self.test_users)

    def resolve(self, module, name):
        """The defined (module, name) a reference to `module`.`name` means, or None (not a definition)."""
        seen = set()
        key = (module, name)
        while key in self.reexports and key not in self.defined and key not in seen:
            seen.add(key)
            key = self.reexports[key]
        return key if key in self.defined else None

    def _scan(self, tree, path, own_module, users):
        """Record every reference `tree` makes. In the image (`users` is image_users) each is keyed by the
        definition it sits in; in the control plane and the tests by where it is ("file:line")."""
        local = definitions(tree) if own_module else {}
        owner_of = {id(inner): name for name, node in local.items() for inner in ast.walk(node)}
        for target, node in self._references(tree, own_module, local):
            if users is not self.image_users:
                users.setdefault(target, []).append(imports.where(path, node.lineno))
                continue
            owner = owner_of.get(id(node))
            if (own_module, owner) != target:  # a definition naming itself (recursion, a class's own methods)
                users.setdefault(target, set()).add(None if owner is None else (own_module, owner))

    def _aliases(self, tree):
        """{local name: the project module it names} for `import a.b as c` and `from a import b` (a module)."""
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases.update((alias.asname, alias.name) for alias in node.names
                               if alias.asname and alias.name in self.modules)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                aliases.update((alias.asname or alias.name, "%s.%s" % (node.module, alias.name)) for alias in node.names
                               if "%s.%s" % (node.module, alias.name) in self.modules)
        return aliases

    def _references(self, tree, own_module, local):
        """(defined (module, name), node) for every reference in `tree` (see the module doc)."""
        aliases = self._aliases(tree)
        for node in ast.walk(tree):
            named = []  # (module, name) pairs the node names
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in self.modules:
                named = [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Attribute):
                dotted = _dotted(node.value)
                head, _, rest = (dotted or "").partition(".")
                if head in aliases or dotted in self.modules:
                    named = [(aliases.get(head, head) + ("." + rest if rest else ""), node.attr)]
            elif isinstance(node, ast.Name) and node.id in local:
                named = [(own_module, node.id)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count(":") == 1:
                named = [tuple(node.value.split(":"))]  # a registry's "lm.models.gpt:build_model"
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                  and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and own_module is not None):
                # A package that scans its own modules reads each one's declarations by name
                # (lm.spec.families: getattr(module, "FAMILY")): a reference to that name in every one.
                named = [(module, node.args[1].value) for module in imports.scanned_modules(own_module, self.modules)]
            elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and all(
                    isinstance(item, ast.Constant) and isinstance(item.value, str) for item in node.elts):
                named = [tuple(item.value for item in node.elts)]  # ("lm.distributed.smp", "SMPStrategy")
            for module, name in named:
                target = self.resolve(module, name) if module in self.modules else None
                if target is not None:
                    yield target, node

    def not_used_by_the_image(self):
        """{(module, name): where it is used instead}: the definitions the image does not use. The image uses
        what its modules' top-level statements and its entry points refer to, and what a definition it uses
        refers to; a reference from a definition the image does not use is none (`base_image_uri` reading
        `DLC_ACCOUNT`: both are the control plane's). Where instead: the control plane's and the tests'
        "file:line"s, else "nothing"."""
        used, changed = set(), True
        while changed:
            changed = False
            for key in sorted(self.defined - used):
                if any(user is None or user in used for user in self.image_users.get(key, ())):
                    used.add(key)
                    changed = True
        return {key: self.control_plane_users.get(key, []) + self.test_users.get(key, []) or [
                    "only %s" % ", ".join("%s.%s" % user for user in sorted(self.image_users[key]))
                    if self.image_users.get(key) else "nothing"]
                for key in sorted(self.defined - used)}

def _dotted(node):
    """"lm.spec.job" for the expression lm.spec.job, None for anything but names and attributes."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else inner + "." + node.attr
    return None
