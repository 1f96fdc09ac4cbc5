"""The shape of the code, read from the source with `ast`, without importing it.

- the package's layers, named once below from the top down: no module imports from a layer above its own;
- the front ends (one layer) import no other front end, and each goes through the call layer, agent_mail.calls;
- no import is hidden: no `__import__` or `importlib.import_module` names a module in a string;
- no import circle among agent_mail's modules;
- no runaway file (a generous guard; a file is as long as its one job needs);
- a name starting with `_` is used only in its own module (tests included);
- no harness is named below its registry (operations, parts and spec ask agent_mail.harnesses);
- the suite's layout: test modules in a folder per kind, helpers in tests/lib, and no module imports conftest
  (fixtures and hooks only) or another test module.

There are no allow-lists: a violation fails at once.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

TESTS = Path(__file__).resolve().parent.parent
SRC = TESTS.parent / "src"
PACKAGE = "agent_mail"

RUNAWAY_FILE_LINES = 1500

# The suite's folders, one per kind of test (docs/testing.md); helpers live in tests/lib.
TEST_KINDS = ("unit", "contract", "functional", "harnesses")

# The layers, from the top down. A module belongs to the entry naming the longest prefix of its dotted name (a
# package is everything under it); a module may import its own layer and those below it, never one above.
LAYERS = (
    ("entry", ("agent_mail.__main__", "agent_mail.cli")),  # the command line: parses, and starts the front end a
    # command belongs to (or carries the call itself)
    ("front ends", ("agent_mail.client", "agent_mail.dashboard", "agent_mail.harness", "agent_mail.server")),
    ("protocols", ("agent_mail.protocols",)),  # what crosses a wire: HTTP API names, the client's exchange, MCP tools
    ("call layer", ("agent_mail.calls",)),
    ("operations", ("agent_mail.operations",)),
    ("parts", ("agent_mail.parts",)),  # what the operations are built from
    ("store", ("agent_mail.store",)),
    ("ground", ("agent_mail", "agent_mail.spec", "agent_mail.model", "agent_mail.errors", "agent_mail.jsonout",
                "agent_mail.files", "agent_mail.urls",
                "agent_mail.harnesses")),  # what each harness is (one record a harness), which every layer asks
)
FRONT_END_LAYER = "front ends"
CALL_LAYER = "agent_mail.calls"


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


# ---- Reading the rules. ----

def layer_of(module: str, layers=LAYERS, package: str = PACKAGE) -> tuple[int, str, str] | None:
    """(the layer's place from the top, its name, the entry that placed the module), or None for a module no
    entry names. The package itself is placed only by its own name (its __init__); everything else by the
    longest entry that is it or a package above it."""
    best = None
    for place, (layer, entries) in enumerate(layers):
        for entry in entries:
            if module == entry or (entry != package and module.startswith(entry + ".")):
                if best is None or len(entry) > len(best[2]):
                    best = (place, layer, entry)
    return best


def unplaced(graph: dict[str, set[str]], layers=LAYERS, package: str = PACKAGE) -> set[str]:
    return {module for module in graph if layer_of(module, layers, package) is None}


def upward_imports(graph: dict[str, set[str]], layers=LAYERS, package: str = PACKAGE) -> set[tuple[str, str]]:
    """(module, what it imports) where the import climbs to a layer above the module's own."""
    found = set()
    for module, imported in graph.items():
        mine = layer_of(module, layers, package)
        for target in imported:
            theirs = layer_of(target, layers, package)
            if mine is not None and theirs is not None and theirs[0] < mine[0]:
                found.add((module, target))
    return found


def front_end_imports(graph: dict[str, set[str]], layers=LAYERS, package: str = PACKAGE,
                      front_ends: str = FRONT_END_LAYER) -> set[tuple[str, str]]:
    """(module, what it imports) where one front end imports another."""
    found = set()
    for module, imported in graph.items():
        mine = layer_of(module, layers, package)
        for target in imported:
            theirs = layer_of(target, layers, package)
            if mine and theirs and mine[1] == theirs[1] == front_ends and mine[2] != theirs[2]:
                found.add((module, target))
    return found


def not_on_call_layer(graph: dict[str, set[str]], layers=LAYERS, package: str = PACKAGE,
                      front_ends: str = FRONT_END_LAYER, call_layer: str = CALL_LAYER) -> set[str]:
    """The front ends (present in the graph) none of whose modules imports the call layer."""
    entry_of = {module: layer_of(module, layers, package) for module in graph}
    present = {placed[2] for placed in entry_of.values() if placed and placed[1] == front_ends}
    using = {entry_of[module][2] for module, imported in graph.items()
             if entry_of[module] and entry_of[module][1] == front_ends
             and any(t == call_layer or t.startswith(call_layer + ".") for t in imported)}
    return present - using


_LOADERS = ("__import__", "import_module")


def hidden_imports(src: Path = SRC, package: str = PACKAGE) -> list[str]:
    """Every `__import__(...)` and `import_module(...)` call that names one of the package's modules in a string, or
    a module the reader cannot see at all (a name computed at run time): an import no reader of imports finds.
    A literal naming a module outside the package (a driver looked for) is not hidden."""
    found = []
    for path in sorted((src / package).rglob("*.py")) if (src / package).is_dir() else sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called not in _LOADERS or not node.args:
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and \
                    first.value != package and not first.value.startswith(package + "."):
                continue
            found.append(f"{path.relative_to(src).as_posix()}:{node.lineno}: {ast.unparse(node)}")
    return found


def runaway_files(src: Path = SRC, package: str = PACKAGE, limit: int = RUNAWAY_FILE_LINES) -> dict[str, int]:
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found[path.relative_to(src).as_posix()] = lines
    return found


def private_reaches(roots: tuple[Path, ...], package: str = PACKAGE) -> list[str]:
    """Where a module uses another module's `_name`: `from M import _name`, `m._name` on a module `m` of the
    package it imported by name, or the same spelled as strings: `setattr(m, "_name", ...)` (getattr, delattr,
    monkeypatch.setattr alike) and `monkeypatch.setattr("pkg.m._name", ...)`. (Dunder names are public by
    convention.)"""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if any(part.startswith(".") for part in path.relative_to(root).parts):
                continue  # not ours: bench/.cache holds the benches' virtual environments
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            module_names = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == package
                                                         or root != SRC):
                    for alias in node.names:
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            found.append(f"{path}:{node.lineno}: from {'.' * node.level}{node.module or ''} import "
                                         f"{alias.name}")
                        elif node.module and (node.module.split(".")[0] == package or node.level
                                              or _a_helper_module(root, f"{node.module}.{alias.name}")):
                            module_names.add(alias.asname or alias.name)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] == package or _a_helper_module(root, alias.name):
                            module_names.add(alias.asname or alias.name.split(".")[0])
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                    base = node.value
                    while isinstance(base, ast.Attribute):
                        base = base.value
                    if isinstance(base, ast.Name) and base.id in module_names:
                        found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
                elif isinstance(node, ast.Call) and _reaches_by_string(node, module_names, package):
                    found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def _a_helper_module(root: Path, dotted: str) -> bool:
    """Whether `dotted` names a helper module of the tests or benchmarks (beside them, or tests.lib.x from the
    repository's root)."""
    if root == SRC:
        return False
    parts = dotted.split(".")
    return any(base.joinpath(*parts[:-1], f"{parts[-1]}.py").exists() for base in (root, root.parent))


# Where a harness may be named: its own module under the registry (and the front ends that run it); the layers
# below ask the registry, and the ground only for its list of names.
HARNESS_REGISTRY = "agent_mail/harnesses"
HARNESS_FREE = ("agent_mail/operations", "agent_mail/parts", "agent_mail/spec")


def harness_words(src: Path = SRC, registry: str = HARNESS_REGISTRY) -> tuple[set[str], set[str]]:
    """(the words that name a harness or one of its tools: the registry's names and each record's tool names that
    are no plain word, like apply_patch or MultiEdit; the parts of an identifier that name one, like claude in
    claude_code), read from the registry's NAMES and each harness module's EDIT_TOOLS."""
    import re

    names: set[str] = set()
    for node in ast.walk(ast.parse((src / registry / "__init__.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "NAMES" for t in node.targets):
            names |= set(ast.literal_eval(node.value))
    words, parts = set(names), {name.split("-")[0] for name in names}
    for name in names:
        module = src / registry / f"{name.replace('-', '_')}.py"
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EDIT_TOOLS"
                                                    for t in node.targets):
                words |= {tool for tool in ast.literal_eval(node.value) if re.search(r"_|[a-z][A-Z]", tool)}
    return words, parts


def harness_specific(src: Path = SRC, places: tuple[str, ...] = HARNESS_FREE, words: set[str] = frozenset(),
                     parts: set[str] = frozenset()) -> list[str]:
    """Where a module of `places` names a harness: a text that is a harness's name or tool (a key of a table by
    harness, a branch on one, a matcher "a|b"), or an identifier one of whose parts names one (_claude_servers).
    Prose in longer texts (help, docstrings) is not a name."""
    found = []
    for place in places:
        for path in sorted((src / place).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            where = path.relative_to(src).as_posix()
            for node in ast.walk(tree):
                named = None
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if set(node.value.strip().split("|")) & words:
                        named = repr(node.value)
                elif isinstance(node, (ast.Name, ast.Attribute, ast.FunctionDef, ast.ClassDef, ast.arg)):
                    identifier = getattr(node, "id", None) or getattr(node, "attr", None) or \
                        getattr(node, "name", None) or getattr(node, "arg", None)
                    if set(identifier.lower().split("_")) & parts:
                        named = identifier
                if named is not None:
                    found.append(f"{where}:{node.lineno}: {named}")
    return found


def suite_layout_problems(tests: Path) -> list[str]:
    """Where the suite leaves its layout: a test module outside the kinds' folders, a helper outside tests/lib,
    an import of conftest (which holds fixtures and hooks, never helpers) or of a test module."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        place = path.relative_to(tests)
        if path.name.startswith("test_") and (len(place.parts) != 2 or place.parts[0] not in TEST_KINDS):
            found.append(f"{place}: a test module outside tests/{{{','.join(TEST_KINDS)}}}/")
        elif not path.name.startswith("test_") and path.name not in ("__init__.py", "conftest.py") \
                and place.parts[0] != "lib":
            found.append(f"{place}: a helper outside tests/lib/")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                named = [module, *(f"{module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in named:
                if any(part == "conftest" or part.startswith("test_") for part in name.split(".")):
                    found.append(f"{place}:{node.lineno}: imports {name} (helpers live in tests/lib)")
                    break
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _reaches_by_string(call: ast.Call, module_names: set[str], package: str) -> bool:
    """A setattr/getattr/delattr (or monkeypatch's) naming a private name of the package by a string."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if name not in ("setattr", "getattr", "delattr", "hasattr") or not call.args:
        return False
    first = call.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):  # monkeypatch.setattr("pkg.m._name", v)
        parts = first.value.split(".")
        return parts[0] == package and any(_private(part) for part in parts[1:])
    second = call.args[1] if len(call.args) > 1 else None
    if not (isinstance(second, ast.Constant) and isinstance(second.value, str) and _private(second.value)):
        return False
    base = first
    while isinstance(base, ast.Attribute):
        base = base.value
    return isinstance(base, ast.Name) and base.id in module_names


def token_reads(src: Path = SRC, package: str = PACKAGE, front_end: str = "server") -> tuple[list[str], list[str]]:
    """Where the server front end reads a request's token: (each place it names the Authorization header as a value,
    a header's key in any case, str or bytes, not a sentence mentioning it; each call of tokens.authenticate, the
    token's look-up)."""
    header, looked_up = [], []
    for path in sorted((src / package / front_end).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(src).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
                value = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
                if value.strip().lower() == "authorization":
                    header.append(f"{where}:{node.lineno}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "authenticate" and isinstance(node.func.value, ast.Name) and \
                    node.func.value.id == "tokens":
                looked_up.append(f"{where}:{node.lineno}")
    return header, looked_up


# ---- The rules, on the package itself. ----

@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_every_module_stands_in_one_layer(graph):
    assert not unplaced(graph), f"modules no layer names (add them to LAYERS): {sorted(unplaced(graph))}"


def test_no_import_climbs_to_a_layer_above(graph):
    found = upward_imports(graph)
    assert not found, "imports from a layer above:\n" + "\n".join(
        f"  {m} ({layer_of(m)[1]}) -> {t} ({layer_of(t)[1]})" for m, t in sorted(found))


def test_no_front_end_imports_another(graph):
    found = front_end_imports(graph)
    assert not found, "front end to front end:\n" + "\n".join(f"  {m} -> {t}" for m, t in sorted(found))


def test_every_front_end_imports_the_call_layer(graph):
    assert not not_on_call_layer(graph), f"front ends not importing {CALL_LAYER}: {not_on_call_layer(graph)}"


def test_no_import_is_hidden_in_a_string():
    found = hidden_imports()
    assert not found, "imports no reader of imports sees (import the module by name, inside a function if it " \
                      "must load late):\n" + "\n".join(f"  {f}" for f in found)


def test_no_import_circles(graph):
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(
        "  " + "; ".join(f"{a} -> {b}" for a in sorted(c) for b in sorted(graph[a]) if b in c) for c in found)


def test_no_runaway_files():
    found = runaway_files()
    assert not found, f"files over {RUNAWAY_FILE_LINES} lines: {found}"


def test_no_module_reaches_another_modules_private_names():
    found = private_reaches((SRC, TESTS, TESTS.parent / "bench"))
    assert not found, "a `_name` used outside its module (make it public, or reach it through public API):\n" + \
        "\n".join(f"  {f}" for f in found)

def test_no_harness_is_named_below_its_registry():
    """operations/, parts/ and spec/ ask a harness's record (agent_mail.harnesses) for what is particular to
    it, and never name one: no table keyed by harness, no branch on one (issue 33, finding 11)."""
    words, parts = harness_words()
    assert {"claude-code", "opencode", "apply_patch", "MultiEdit"} <= words and "claude" in parts, (words, parts)
    found = harness_specific(words=words, parts=parts)
    assert not found, "a harness named outside its module (put it in its record, agent_mail.harnesses):\n" + \
        "\n".join(f"  {f}" for f in found)


def test_the_suite_keeps_its_layout():
    found = suite_layout_problems(TESTS)
    assert not found, "the suite's layout (docs/testing.md):\n" + "\n".join(f"  {f}" for f in found)


# ---- The reading itself, on packages made up for the purpose (so the rules above cannot pass vacuously). ----

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_requests_token_is_read_once_at_the_edge():
    """The server reads the Authorization header in one place (edge.Gate, before any body) and looks the token up
    through one call; every route takes the grant the Gate left in the request's scope (issue 32, finding 11: it
    was parsed in three modules, with a second login path in the MCP endpoint)."""
    header, looked_up = token_reads()
    assert header and {place.rsplit(":", 1)[0] for place in header} == {"agent_mail/server/edge.py"}, header
    assert len(looked_up) == 1, looked_up


def test_reading_finds_a_token_read_outside_the_edge(tmp_path):
    _package(tmp_path, {"__init__.py": "", "server/__init__.py": "", "server/edge.py": 'H = b"authorization"\n',
                        "server/app.py": "def f(request, tokens, store):\n"
                                         "    request.headers.get('Authorization')\n"
                                         "    return tokens.authenticate(store, 'x')\n",
                        "server/mcp.py": "def g(tokens, s):\n    return tokens.authenticate(s, 'Bearer')\n"})
    header, looked_up = token_reads(tmp_path, "pkg")
    assert header == ["pkg/server/app.py:2", "pkg/server/edge.py:1"], header
    assert looked_up == ["pkg/server/app.py:3", "pkg/server/mcp.py:2"], looked_up


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


_LAYERS = (("entry", ("pkg.cli",)), ("front ends", ("pkg.web", "pkg.tui")), ("calls", ("pkg.calls",)),
           ("operations", ("pkg.ops",)), ("ground", ("pkg", "pkg.model")))


def _made_up(tmp_path: Path, **extra: str) -> dict[str, set[str]]:
    files = {"__init__.py": "", "cli.py": "from pkg import web, calls\n", "calls.py": "from pkg.ops import mail\n",
             "web/__init__.py": "", "web/app.py": "from pkg import calls\nfrom pkg.web import views\n",
             "web/views.py": "from pkg.model import thing\n", "tui.py": "def run():\n    from pkg import calls\n",
             "ops/__init__.py": "", "ops/mail.py": "from pkg import model\n", "model.py": "thing = 1\n"}
    files.update({name.replace("__", "/") + ".py": text for name, text in extra.items()})
    return import_graph(_package(tmp_path, files), "pkg")


def test_the_layer_rule_holds_on_a_made_up_package_that_keeps_it(tmp_path):
    graph = _made_up(tmp_path)
    assert layer_of("pkg.web.views", _LAYERS, "pkg")[1] == "front ends"
    assert layer_of("pkg", _LAYERS, "pkg")[1] == "ground" and layer_of("pkg.stray", _LAYERS, "pkg") is None
    assert not unplaced(graph, _LAYERS, "pkg")
    assert not upward_imports(graph, _LAYERS, "pkg")
    assert not front_end_imports(graph, _LAYERS, "pkg")
    assert not not_on_call_layer(graph, _LAYERS, "pkg", call_layer="pkg.calls")
    assert not hidden_imports(tmp_path, "pkg")


def test_a_planted_upward_import_fails(tmp_path):
    graph = _made_up(tmp_path, model="thing = 1\n\n\ndef f():\n    from pkg.ops import mail\n")
    assert upward_imports(graph, _LAYERS, "pkg") == {("pkg.model", "pkg.ops.mail")}


def test_a_planted_front_end_to_front_end_import_fails(tmp_path):
    graph = _made_up(tmp_path, tui="from pkg.web import views\n\n\ndef run():\n    from pkg import calls\n")
    assert front_end_imports(graph, _LAYERS, "pkg") == {("pkg.tui", "pkg.web.views")}
    assert not upward_imports(graph, _LAYERS, "pkg")  # the same layer: only the front-end rule catches it


def test_a_front_end_that_skips_the_call_layer_fails(tmp_path):
    graph = _made_up(tmp_path, tui="from pkg.ops import mail\n")
    assert not_on_call_layer(graph, _LAYERS, "pkg", call_layer="pkg.calls") == {"pkg.tui"}


def test_a_planted_dunder_import_of_the_package_fails(tmp_path):
    _made_up(tmp_path, ops__mail='def f():\n    __import__("pkg.web.app")\n',
             model='import importlib\n\n\ndef g(name):\n    return importlib.import_module(name)\n',
             calls='import importlib\n\n\ndef h():\n    importlib.import_module("json")\n')
    found = hidden_imports(tmp_path, "pkg")
    assert len(found) == 2 and "__import__('pkg.web.app')" in found[1] and "import_module(name)" in found[0], found


def test_a_module_outside_every_layer_fails(tmp_path):
    graph = _made_up(tmp_path, stray="")
    assert unplaced(graph, _LAYERS, "pkg") == {"pkg.stray"}


def test_reading_finds_runaway_files(tmp_path):
    _made_up(tmp_path, model="x = 1\n" * 12)
    assert runaway_files(tmp_path, "pkg", limit=10) == {"pkg/model.py": 12}


def test_reading_finds_private_names_used_outside_their_module(tmp_path):
    _made_up(tmp_path, ops__mail="from pkg.model import _secret, __version__\nfrom pkg import model\n"
                                 "x = model._other + model.public\n\n\nclass A:\n    def f(self):\n"
                                 "        return self._mine\n")
    found = private_reaches((tmp_path,), "pkg")
    assert len(found) == 2 and "import _secret" in found[0] and "model._other" in found[1], found


def test_reading_finds_private_names_reached_by_a_string(tmp_path):
    _made_up(tmp_path, ops__mail="from pkg import model\nfrom pkg.model import Thing\n\n\ndef f(monkeypatch, obj):\n"
                                 "    monkeypatch.setattr(model, '_clock', None)\n"
                                 "    setattr(Thing, '_WINDOW', 2)\n"
                                 "    monkeypatch.setattr('pkg.model._now', None)\n"
                                 "    getattr(model, 'public')\n    setattr(obj, '_own', 1)\n"
                                 "    monkeypatch.setattr(model, '__doc__', '')\n")
    (tmp_path / "helper.py").write_text("def _median():\n    return 1\n")
    (tmp_path / "bench.py").write_text("import helper\n\nhelper._median()\n")
    found = private_reaches((tmp_path,), "pkg")
    assert found[0].endswith("bench.py:3: helper._median"), found
    found = found[1:]
    assert [f.split(": ", 1)[1] for f in found] == ["monkeypatch.setattr(model, '_clock', None)",
                                                    "setattr(Thing, '_WINDOW', 2)",
                                                    "monkeypatch.setattr('pkg.model._now', None)"], found


def test_reading_finds_private_names_of_a_tests_lib_helper(tmp_path):
    (tmp_path / "tests" / "lib").mkdir(parents=True)
    (tmp_path / "tests" / "lib" / "waits.py").write_text("def _poll():\n    return 1\n")
    (tmp_path / "tests" / "test_x.py").write_text("from tests.lib import waits\n\nwaits._poll()\n")
    found = private_reaches((tmp_path / "tests",), "pkg")
    assert len(found) == 1 and found[0].endswith("test_x.py:3: waits._poll"), found


def test_reading_finds_a_harness_named_below_its_registry(tmp_path):
    _made_up(tmp_path, ops__mail='"""Claude Code, codex and apply_patch in prose."""\nTOLD = {"codex": 1}\n\n\n'
                                 'def f(harness, tool, claude_pid):\n'
                                 '    if harness == "gemini" or tool == "apply_patch":\n'
                                 '        return "Edit|MultiEdit"\n    return "say gemini in prose"\n')
    found = harness_specific(tmp_path, ("pkg/ops",), {"codex", "gemini", "apply_patch", "MultiEdit"}, {"claude"})
    assert sorted(f.split(": ", 1)[1] for f in found) == ["'Edit|MultiEdit'", "'apply_patch'", "'codex'", "'gemini'",
                                                          "claude_pid"], found


def test_reading_finds_a_suite_out_of_its_layout(tmp_path):
    files = {"conftest.py": "", "unit/test_a.py": "from tests.lib.cli import am\n", "lib/cli.py": "",
             "test_flat.py": "", "helper.py": "", "unit/test_b.py": "from conftest import until\n",
             "contract/test_c.py": "from tests.unit.test_a import thing\n",
             "functional/test_d.py": "def f():\n    from tests.unit import test_a\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = suite_layout_problems(tmp_path)
    assert found == ["contract/test_c.py:1: imports tests.unit.test_a (helpers live in tests/lib)",
                     "functional/test_d.py:2: imports tests.unit.test_a (helpers live in tests/lib)",
                     "helper.py: a helper outside tests/lib/",
                     "test_flat.py: a test module outside tests/{unit,contract,functional,harnesses}/",
                     "unit/test_b.py:1: imports conftest (helpers live in tests/lib)"], found
