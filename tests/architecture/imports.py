"""The project's static import graph: every `import` and `from ... import` of a project module,
function-local ones included (a local import is still a dependency; it only hides a circle)."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_CONTEXT = os.path.join(ROOT, "training_image")
# Where each top-level package lives (the training image's build context holds `lm`).
PACKAGE_ROOTS = {"lm": IMAGE_CONTEXT, "controlplane": ROOT, "stacks": ROOT, "lmstack": ROOT}


def module_files():
    """{dotted module name: file} of every project module."""
    found = {}
    for package, base in PACKAGE_ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(os.path.join(base, package)):
            dirnames[:] = [name for name in dirnames if name != "__pycache__"]
            for filename in filenames:
                if filename.endswith(".py"):
                    path = os.path.join(dirpath, filename)
                    parts = os.path.relpath(path, base)[:-3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    found[".".join(parts)] = path
    return found


def _imported(node, modules):
    """The project modules one import statement names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif node.level == 0 and node.module:
        # `from lm.spec import job` imports the module lm.spec.job; `from lm.spec.job import X` the module.
        names = [node.module + "." + alias.name for alias in node.names] + [node.module]
    else:
        return set()
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def imports_of(path, modules):
    tree = ast.parse(open(path).read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= _imported(node, modules)
    return found


def graph():
    """{module: set of project modules it imports} (a package's own __init__ excluded)."""
    modules = module_files()
    edges = {}
    for name, path in modules.items():
        parents = {name.rsplit(".", depth)[0] for depth in range(1, name.count(".") + 1)}
        edges[name] = {target for target in imports_of(path, modules) if target != name and target not in parents}
    return edges


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def named_modules(path, modules):
    """Project modules a file names in a string ("lm.models.gpt:build_model", "lm.distributed.smp"):
    the registries import them by name."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.split(":")[0]
            if name in modules:
                found.add(name)
    return found


# A package whose __init__ imports every module of itself (the families registry, lm.spec.families)
SCANS_ITS_MODULES = "pkgutil.iter_modules(__path__)"


def scanned_modules(name, modules):
    """The modules of package `name` when its __init__ imports them all by scanning, else none."""
    path = modules[name]
    if not path.endswith("__init__.py") or SCANS_ITS_MODULES not in open(path).read():
        return set()
    return {other for other in modules if other.rpartition(".")[0] == name}


def reachable(entry_files, modules):
    """Every project module the entry files import, directly, through other modules, by name, or as a
    module of a package that scans its own."""
    seen, todo = set(), [name for name, path in modules.items() if path in entry_files]
    for path in entry_files:
        todo.extend(imports_of(path, modules) | named_modules(path, modules))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:depth]) for depth in range(1, len(parts)))  # importing a module runs its packages
        todo.extend(imports_of(modules[name], modules) | named_modules(modules[name], modules)
                    | scanned_modules(name, modules))
    return seen
