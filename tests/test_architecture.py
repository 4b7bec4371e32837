"""The layout rules of shared/STYLE.md (items 9 and 12) as checks over the source, read with `ast`.

No module of checkpoint/, compiler/ or stepper/ is imported here: every file is parsed, its imports
(absolute and relative, at module level and inside functions; only `if TYPE_CHECKING:` blocks are
skipped, since they never run) become edges of a module graph, and that graph must have no cycle.
A cycle is reported as the chain of modules that closes it, so the message says which import to move.
"""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("checkpoint", "compiler", "stepper")
MAX_LINES = 600


def _modules(package):
    """{dotted module name: path} for every .py file under `package` (a package's own name stands
    for its __init__.py)."""
    out = {}
    for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree):
    """Every Import/ImportFrom in `tree`, at any depth, except the bodies of `if TYPE_CHECKING:`
    (their `else:` branches do run, so they are kept)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module, is_package, node, known):
    """The known modules that `node` (found in `module`) imports. `from a import b` names module
    a.b when that is a module, else a itself (b is then an attribute of a)."""
    if isinstance(node, ast.Import):
        bases, names = [alias.name for alias in node.names], []
    else:
        if node.level:
            parts = module.split(".")
            if not is_package:
                parts = parts[:-1]
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module
        bases, names = [base], [alias.name for alias in node.names]
    found = set()
    for alias in names:
        sub = f"{bases[0]}.{alias}"
        if sub in known:
            found.add(sub)
    if names and len(found) == len(names):
        # `from pkg import mod_a, mod_b` needs only the submodules (pkg is already being imported
        # by then, as Python runs a package's __init__ before its submodules).
        bases = []
    for base in bases:
        # `import a.b.c` also runs a and a.b: the deepest known prefix is the edge that matters
        # for the cycle; the packages above it are imported by Python on the way.
        parts = base.split(".")
        for i in range(len(parts), 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in known:
                found.add(prefix)
                break
    found.discard(module)
    return found


def import_graph():
    """{module: set of modules it imports} over the three packages."""
    paths = {}
    for package in PACKAGES:
        paths.update(_modules(package))
    graph = {}
    for module, path in paths.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        is_package = path.endswith("__init__.py")
        graph[module] = set()
        for node in _import_nodes(tree):
            graph[module] |= _resolve(module, is_package, node, paths)
    return graph


def _reachable(graph, start):
    seen, todo = set(), [start]
    while todo:
        for child in graph[todo.pop()]:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def find_cycles(graph):
    """One cycle per knot (a strongly connected set of more than one module: each reaches every
    other), as the list of modules along it with the first repeated at the end. The packages hold a
    few hundred modules, so reachability from every module is cheap and plainer than Tarjan's."""
    reach = {module: _reachable(graph, module) for module in graph}
    knots, placed = [], set()
    for module in sorted(graph):
        if module in placed or module not in reach[module]:
            continue
        knot = {other for other in reach[module] if module in reach[other]}
        placed |= knot
        if len(knot) > 1:                 # (a module importing itself is harmless)
            knots.append(knot)
    return [_cycle_in(graph, knot) for knot in knots]


def _cycle_in(graph, component):
    """A shortest cycle through the first module of a knot (breadth-first search inside it), so the
    report names few modules."""
    start = min(component)
    parent, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if child not in parent:
                    parent[child] = node
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"component {sorted(component)} has no cycle")


def _format(cycles):
    return "\n".join("  " + " -> ".join(cycle) for cycle in cycles)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package):
    """No chain of imports leads from a module of `package` back to itself: each layer only uses
    layers below it (STYLE.md 12). Break a reported cycle by moving the shared code to a lower
    module both use, passing a callable down, or moving a function to its one caller."""
    cycles = [c for c in find_cycles(import_graph()) if any(m.split(".")[0] == package for m in c)]
    assert not cycles, f"import cycles through {package}/:\n{_format(cycles)}"


def test_packages_depend_one_way():
    """compiler/ and checkpoint/ do not import each other or stepper/ (DESIGN.md, Layers)."""
    bad = []
    for module, imports in import_graph().items():
        top = module.split(".")[0]
        if top == "stepper":
            continue
        for target in sorted(imports):
            if target.split(".")[0] != top:
                bad.append(f"  {module} imports {target}")
    assert not bad, "compiler/ and checkpoint/ must stand alone:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", PACKAGES)
def test_modules_under_600_lines(package):
    """A module over 600 lines does two things (STYLE.md 9): split it by role."""
    long = []
    for module, path in sorted(_modules(package).items()):
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            long.append(f"  {os.path.relpath(path, ROOT)}: {n} lines")
    assert not long, f"modules over {MAX_LINES} lines in {package}/:\n" + "\n".join(long)


def test_the_graph_sees_every_kind_of_import():
    """The checker itself: a relative import, an import inside a function, `from pkg import mod`,
    `from pkg import name` (an edge to pkg's __init__) and `import a.b` are edges; an import under
    `if TYPE_CHECKING:` is not. A knot of several cycles is reported once, by a shortest cycle."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import compiler.runtime.array\n"
        "from . import tape\n"
        "from ..kernel import Kernel\n"
        "from .. import tid\n"
        "if TYPE_CHECKING:\n"
        "    from compiler.frontend import x\n"
        "def f():\n"
        "    from compiler.runtime.graph import g\n")
    known = {"compiler", "compiler.runtime", "compiler.runtime.array", "compiler.runtime.tape",
             "compiler.kernel", "compiler.frontend", "compiler.runtime.graph",
             "compiler.runtime.launch"}
    edges = set()
    for node in _import_nodes(ast.parse(source)):
        edges |= _resolve("compiler.runtime.launch", False, node, known)
    assert edges == {"compiler.runtime.array", "compiler.runtime.tape", "compiler.kernel", "compiler",
                     "compiler.runtime.graph"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"b", "d"}, "d": {"d"}}) == [["a", "b", "a"]]
