"""The shape of the code (issue 19), read from the source with `ast`, without importing it.

- no import circle among agent_mail's modules;
- no front end imports another front end, and every front end goes through the call layer, agent_mail.calls;
- no source file over 700 lines, no class over 400.

Each rule has an allow-list of today's violations, which shrinks as the refactor lands. A violation that is
not on it fails, and so does an entry that no longer violates: the lists cannot go stale, and emptying them
is how the refactor is finished.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "agent_mail"

MAX_FILE_LINES = 700
MAX_CLASS_LINES = 400

# The front ends: each is a module, or a package with everything under it. __main__ is not one (it may import
# cli); server and client are listed before they exist so that they are held to the rules when they appear.
FRONT_ENDS = ("agent_mail.cli", "agent_mail.mcp_server", "agent_mail.hooks", "agent_mail.dashboard",
              "agent_mail.server", "agent_mail.client", "agent_mail.guards")
CALL_LAYER = "agent_mail.calls"

# ---- Allowed exceptions: none. A new one must be argued for here, and the test keeps the list honest. ----

# Each circle is the set of modules that import one another round (a strongly connected component).
KNOWN_CIRCLES: set[frozenset[str]] = set()
# (front end, the other front end it imports)
KNOWN_FRONT_END_IMPORTS: set[tuple[str, str]] = set()
# Front ends that do not yet import agent_mail.calls.
KNOWN_NOT_ON_CALL_LAYER: set[str] = set()
# Files ("agent_mail/service.py") and classes ("agent_mail/service.py::Mailbox") over the limits.
KNOWN_OVERSIZE: set[str] = set()


# ---- Reading the source. ----

def modules(src: Path, package: str) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is its __init__.py)."""
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_package(name: str, known: dict[str, Path]) -> bool:
    return name in known and known[name].name == "__init__.py"


def imports_of(name: str, path: Path, known: dict[str, Path], package: str) -> set[str]:
    """The package's modules this module imports, at module level or inside functions (and under
    `if TYPE_CHECKING:`, which is a dependency too). `from P import x` is an import of P.x when that is a
    module, and of P itself when x is a name P defines or re-exports; an import of a module that does not
    exist (yet) is kept under the name it was asked for."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = name if _is_package(name, known) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = []
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.append(submodule if submodule in known else base)
        else:
            continue
        found.update(t for t in targets if t == package or t.startswith(package + "."))
    found.discard(name)
    return found


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    known = modules(src, package)
    return {name: imports_of(name, path, known, package) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.add(frozenset(component))
    return found


def front_end_of(module: str) -> str | None:
    for front in FRONT_ENDS:
        if module == front or module.startswith(front + "."):
            return front
    return None


def front_end_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    found = set()
    for module, imported in graph.items():
        mine = front_end_of(module)
        if mine is None:
            continue
        for target in imported:
            theirs = front_end_of(target)
            if theirs is not None and theirs != mine:
                found.add((mine, theirs))
    return found


def not_on_call_layer(graph: dict[str, set[str]]) -> set[str]:
    present = {front_end_of(module) for module in graph} - {None}
    using = {front_end_of(module) for module, imported in graph.items()
             if any(t == CALL_LAYER or t.startswith(CALL_LAYER + ".") for t in imported)}
    return present - using


def _oversize_classes(node: ast.AST, key: str, prefix: str, found: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            name = prefix + child.name
            length = child.end_lineno - min([child.lineno] + [d.lineno for d in child.decorator_list]) + 1
            if length > MAX_CLASS_LINES:
                found[f"{key}::{name}"] = length
            _oversize_classes(child, key, name + ".", found)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _oversize_classes(child, key, f"{prefix}{child.name}.<locals>.", found)
        else:
            _oversize_classes(child, key, prefix, found)


def oversize(src: Path = SRC, package: str = PACKAGE) -> dict[str, int]:
    """Files over MAX_FILE_LINES and classes (nested ones too) over MAX_CLASS_LINES -> their length."""
    found: dict[str, int] = {}
    for path in sorted((src / package).rglob("*.py")):
        key = path.relative_to(src).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES:
            found[key] = lines
        _oversize_classes(ast.parse(text, filename=str(path)), key, "", found)
    return found


def check_allow_list(found, allowed, what: str, describe=repr) -> None:
    new = set(found) - set(allowed)
    gone = set(allowed) - set(found)
    problems = []
    if new:
        problems.append(f"new {what}:\n" + "\n".join(f"  {describe(item)}" for item in sorted(new, key=repr)))
    if gone:
        problems.append(f"allow-listed {what} no longer found; take them off the list in {__name__}:\n"
                        + "\n".join(f"  {item!r}" for item in sorted(gone, key=repr)))
    assert not problems, "\n".join(problems)


# ---- The rules. ----

@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_no_import_circles(graph):
    def describe(component):
        members = sorted(component)
        edges = [f"{a} -> {b}" for a in members for b in sorted(graph[a]) if b in component]
        return "{" + ", ".join(members) + "}: " + "; ".join(edges)

    check_allow_list(circles(graph), KNOWN_CIRCLES, "import circles", describe)


def test_no_front_end_imports_another(graph):
    def describe(pair):
        mine, theirs = pair
        via = sorted(f"{m} -> {t}" for m, imported in graph.items() if front_end_of(m) == mine
                     for t in imported if front_end_of(t) == theirs)
        return f"{pair!r} ({'; '.join(via)})"

    check_allow_list(front_end_imports(graph), KNOWN_FRONT_END_IMPORTS, "front-end-to-front-end imports", describe)


def test_every_front_end_imports_the_call_layer(graph):
    check_allow_list(not_on_call_layer(graph), KNOWN_NOT_ON_CALL_LAYER, f"front ends not importing {CALL_LAYER}")


def test_no_oversize_files_or_classes():
    found = oversize()
    check_allow_list(found, KNOWN_OVERSIZE,
                     f"files over {MAX_FILE_LINES} lines or classes over {MAX_CLASS_LINES} lines",
                     lambda key: f"{key} ({found[key]} lines)")


def test_the_allow_lists_name_only_what_exists():
    """An entry for a module or file that is gone would otherwise be reported as merely 'no longer found'."""
    known = set(modules(SRC, PACKAGE))
    for component in KNOWN_CIRCLES:
        assert component <= known, component
    for pair in KNOWN_FRONT_END_IMPORTS:
        assert set(pair) <= set(FRONT_ENDS), pair
    assert KNOWN_NOT_ON_CALL_LAYER <= set(FRONT_ENDS)
    for key in KNOWN_OVERSIZE:
        assert (SRC / key.split("::")[0]).is_file(), key


# ---- The reading itself, on packages made up for the purpose (so the rules above cannot pass vacuously). ----

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_reading_finds_circles_through_function_level_and_from_imports(tmp_path):
    src = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "def f():\n    import pkg.c\n",
        "c.py": "def g():\n    from pkg import a\n",
        "d.py": "from pkg import a\n",
    })
    graph = import_graph(src, "pkg")
    assert graph["pkg.b"] == {"pkg.c"}
    assert circles(graph) == {frozenset({"pkg.a", "pkg.b", "pkg.c"})}


def test_reading_counts_a_re_export_as_the_package_and_resolves_relative_imports(tmp_path):
    src = _package(tmp_path, {
        "__init__.py": "__version__ = '1'\n",
        "store/__init__.py": "def open_store():\n    from pkg.store import sqlite\n",
        "store/sqlite.py": "from . import base\nfrom .. import __version__\nfrom pkg.store import open_store\n",
        "store/base.py": "from ..model import thing\n",
        "model.py": "thing = 1\n",
    })
    graph = import_graph(src, "pkg")
    assert graph["pkg.store.sqlite"] == {"pkg.store.base", "pkg", "pkg.store"}
    assert graph["pkg.store.base"] == {"pkg.model"}
    assert circles(graph) == {frozenset({"pkg.store", "pkg.store.sqlite"})}


def test_reading_finds_front_ends_importing_each_other_and_missing_the_call_layer(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "FRONT_ENDS", ("pkg.cli", "pkg.dash"))
    monkeypatch.setattr(sys.modules[__name__], "CALL_LAYER", "pkg.calls")
    src = _package(tmp_path, {
        "__init__.py": "",
        "__main__.py": "from pkg.cli import run\n",
        "calls/__init__.py": "",
        "calls/send.py": "",
        "cli.py": "def run():\n    from pkg import dash\n    from pkg.calls import send\n",
        "dash/__init__.py": "",
        "dash/app.py": "from pkg import calls\n",
        "dash/data.py": "import pkg.dash.app\n",
    })
    graph = import_graph(src, "pkg")
    assert front_end_imports(graph) == {("pkg.cli", "pkg.dash")}
    assert not_on_call_layer(graph) == set()
    graph["pkg.dash.app"] = set()
    assert not_on_call_layer(graph) == {"pkg.dash"}


def test_reading_measures_files_and_nested_classes(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "MAX_FILE_LINES", 10)
    monkeypatch.setattr(sys.modules[__name__], "MAX_CLASS_LINES", 4)
    body = "\n".join(f"    x{i} = {i}" for i in range(4))
    src = _package(tmp_path, {
        "__init__.py": "",
        "small.py": "class Small:\n    pass\n",
        "big.py": f"@decorated\nclass Big:\n{body}\n\n    class Inner:\n{body.replace('    ', '        ')}\n",
    })
    assert oversize(src, "pkg") == {"pkg/big.py": 12, "pkg/big.py::Big": 12, "pkg/big.py::Big.Inner": 5}


def test_an_allow_list_fails_on_new_and_on_stale_entries():
    check_allow_list({"a"}, {"a"}, "things")
    with pytest.raises(AssertionError, match="new things"):
        check_allow_list({"a", "b"}, {"a"}, "things")
    with pytest.raises(AssertionError, match="no longer found"):
        check_allow_list(set(), {"a"}, "things")
