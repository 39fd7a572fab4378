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


def import_sites(path, modules):
    """(project module, line) for every import statement anywhere in the file: module level, inside
    functions and methods, under `if` and `try`."""
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _imported(node, modules):
                yield target, node.lineno


def imports_of(path, modules):
    return {target for target, _ in import_sites(path, modules)}


def where(path, line):
    """"training_image/lm/spec/job.py:18": a file of the project and a line, for a failure message."""
    return "%s:%d" % (os.path.relpath(path, ROOT), line)


def graph(modules=None):
    """{module: set of project modules it imports} (a package's own __init__ excluded)."""
    return {name: set(targets) for name, targets in graph_sites(modules).items()}


def graph_sites(modules=None):
    """{module: {project module it imports: ["file:line", ...]}} (a package's own __init__ excluded:
    importing a module runs its packages' __init__ first, which is no dependency of the module)."""
    modules = modules or module_files()
    edges = {}
    for name, path in modules.items():
        parents = {name.rsplit(".", depth)[0] for depth in range(1, name.count(".") + 1)}
        edges[name] = {}
        for target, line in import_sites(path, modules):
            if target != name and target not in parents:
                _add_site(edges[name], target, where(path, line))
    return edges


def packages(modules):
    """Every project package and subpackage (a directory with an __init__.py): lm, lm.spec,
    lm.spec.families, lm.training ..., controlplane, stacks, stacks.state_machine, lmstack."""
    return sorted(name for name, path in modules.items() if os.path.basename(path) == "__init__.py")


def package_of(module, package_names):
    """The innermost package holding `module` (lm.spec.job: lm.spec; lm.spec.families.gpt: lm.spec.families)."""
    return max((package for package in package_names if module == package or module.startswith(package + ".")), key=len)


def package_graph_sites(modules=None):
    """{package: {package it imports: ["file:line", ...]}}: every import of every module, function-local
    ones included, counted for the innermost packages of the importer and the imported."""
    modules = modules or module_files()
    names = packages(modules)
    edges = {package: {} for package in names}
    for name, path in modules.items():
        source = package_of(name, names)
        for target, line in import_sites(path, modules):
            imported = package_of(target, names)
            if imported != source:
                _add_site(edges[source], imported, where(path, line))
    return edges


def _add_site(targets, target, site):
    """One import statement can name two modules of a package (`from lm.spec import job`): listed once."""
    sites = targets.setdefault(target, [])
    if site not in sites:
        sites.append(site)
        sites.sort(key=lambda text: (text.rpartition(":")[0], int(text.rpartition(":")[2])))


def cycle_path(sites, component):
    """One shortest circle through the strongly connected `component` of the graph `sites`, each step
    with the import statements that make it: "a -> b (x.py:3, y.py:9)" lines, back to the start."""
    start, members = component[0], set(component)
    previous, todo = {start: None}, [start]
    while todo:
        node = todo.pop(0)
        for target in sorted(sites[node]):
            if target == start:
                steps, at = [(node, start)], node
                while previous[at] is not None:
                    steps.insert(0, (previous[at], at))
                    at = previous[at]
                return ["%s -> %s (%s)" % (source, target, ", ".join(sites[source][target]))
                        for source, target in steps]
            if target in members and target not in previous:
                previous[target] = node
                todo.append(target)
    raise ValueError("%s is not a circle" % component)


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
