"""The layout and layering rules (docs/design.md#layering), and comments that
cite only what the repository has."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import rc
from tests.harness import BARE_PY, REPO

STDLIB = set(sys.stdlib_module_names) | {"__future__"}
LIGHT = {
    "rc/proto": {"rc.proto"},
    "rc/worker": {"rc.proto", "rc.worker"},
    "rc/cli": {"rc.proto", "rc.cli"},
    "rc/__init__.py": set(),
    "rc/__main__.py": {"rc.cli", "rc.worker"},
}
OPTIONAL = {"argcomplete"}


def _python_files(root: str) -> list[Path]:
    p = REPO / root
    return [p] if p.is_file() else sorted(p.rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.append((node.lineno, "<relative>"))
    return out


@pytest.mark.parametrize("root", sorted(LIGHT))
def test_zipapp_code_imports_only_stdlib_and_allowed_rc_packages(root):
    allowed = LIGHT[root]
    bad = []
    for path in _python_files(root):
        for line, name in _imports(path):
            top = name.split(".")[0]
            if top in STDLIB or top in OPTIONAL:
                continue
            if top == "rc" and (
                name == "rc" or any(name == a or name.startswith(a + ".") for a in allowed)
            ):
                continue
            bad.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert bad == [], "layering violations (docs/design.md#layering):\n" + "\n".join(bad)


def test_nothing_imports_the_controller_but_itself():
    bad = []
    for path in sorted((REPO / "rc").rglob("*.py")):
        if "controller" in path.parts:
            continue
        for line, name in _imports(path):
            if name.startswith("rc.controller"):
                bad.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert bad == []


def test_only_the_serve_entry_loads_the_controller_by_name():
    users = [
        p.relative_to(REPO).as_posix()
        for p in (REPO / "rc").rglob("*.py")
        if "controller" not in p.parts and '"rc.controller' in p.read_text()
    ]
    assert users == ["rc/cli/serve.py"]


def test_version_is_one_value():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["version"] == rc.__version__


def test_init_imports_nothing():
    assert _imports(REPO / "rc/__init__.py") == []


def test_zipapp_holds_proto_worker_cli_only(pyz):
    names = zipfile.ZipFile(pyz).namelist()
    assert "__main__.py" in names
    assert any(n.startswith("rc/worker/") for n in names)
    assert any(n.startswith("rc/cli/") for n in names)
    assert any(n.startswith("rc/proto/") for n in names)
    assert not [n for n in names if n.startswith("rc/controller")]
    assert "rc/worker/health_rules.json" in names  # the worker reads it at start


def test_the_zipapp_reads_its_health_rules(pyz, tmp_path):
    code = (
        f"import sys; sys.path.insert(0, {str(pyz)!r}); from rc.worker import health; "
        "print(len(health.load_rules().xids))"
    )
    res = subprocess.run(
        [BARE_PY, "-I", "-c", code], capture_output=True, timeout=30, cwd=tmp_path, check=False
    )
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) > 0


def test_zipapp_runs_under_isolated_python(pyz, tmp_path):
    res = subprocess.run(
        [BARE_PY, "-I", str(pyz), "worker", "--help"],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert b"--controller" in res.stdout
    res = subprocess.run(
        [BARE_PY, "-I", str(pyz), "--version"],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        check=False,
    )
    assert res.stdout.strip() == f"rc {rc.__version__}".encode()
    res = subprocess.run(
        [BARE_PY, "-I", str(pyz), "serve", "--data", str(tmp_path)],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        check=False,
    )
    assert res.returncode == 1 and b"install rc with pip" in res.stderr
    # found by a new user: the zipapp's rc up said "the controller did not start:
    # No module named rc", after starting nothing
    res = subprocess.run(
        [BARE_PY, "-I", str(pyz), "up", "-d", "--data", str(tmp_path / "box")],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        check=False,
    )
    assert res.returncode == 1 and b"rc up needs rc installed with pip" in res.stderr, res
    assert not (tmp_path / "box").exists()


def test_rc_py_launcher_runs_the_same_entry_point(tmp_path):
    res = subprocess.run(
        [sys.executable, str(REPO / "rc.py"), "--version"],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        check=False,
    )
    assert res.stdout.strip() == f"rc {rc.__version__}".encode()


def test_every_cli_command_has_help():
    from rc.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb")
    summaries = {a.dest: a.help for a in sub._choices_actions}
    for name, p in sub.choices.items():
        assert p.description and summaries.get(name), name  # tests/test_cli_output.py: args
    assert {
        "run",
        "hold",
        "release",
        "kill",
        "logs",
        "ps",
        "jobs",
        "devices",
        "describe",
        "explain",
        "clear",
        "retire",
        "drain",
        "undrain",
        "events",
        "token",
        "up",
        "down",
        "serve",
        "worker",
    } <= set(sub.choices)


def test_verb_table_names_the_group_that_defines_each_verb():
    import importlib

    from rc.cli import GROUPS, VERBS

    found = {}
    for group in GROUPS:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"rc.cli.{group}").add_parsers(sub)
        found.update(dict.fromkeys(sub.choices, group))
    assert found == VERBS


def test_a_verb_builds_only_its_own_group():
    code = (
        "import sys; from rc.cli import build_parser; build_parser('devices'); "
        "print(sorted(m for m in sys.modules if m.startswith('rc.cli.')))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        check=False,
    )
    loaded = set(ast.literal_eval(res.stdout))
    assert "rc.cli.devices" in loaded
    assert not loaded & {
        "rc.cli.run",
        "rc.cli.follow",
        "rc.cli.relay",
        "rc.cli.copy",
        "rc.cli.serve",
        "rc.cli.up",
        "rc.cli.upsettings",
        "rc.cli.pool",
        "rc.cli.children",
        "rc.cli.credentials",
    }


# -- the import graph ---------------------------------------------------------------

ACYCLIC = ("rc.cli", "rc.controller", "rc.proto", "rc.worker")
"""Packages whose modules may take part in no import cycle. The graph covers
the whole rc package; a package joins this list once its cycles are gone."""
NO_PRIVATE_IMPORTS = ("rc.cli", "rc.worker")
"""Packages whose modules import no `_name` from another module: a helper
that two modules use is public in its home module."""


def _module_paths() -> dict[str, Path]:
    """Every module of the rc package by dotted name (a package by its own)."""
    out = {}
    for path in sorted((REPO / "rc").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _import_statements(name: str, path: Path):
    """(line, module, imported names) of every import statement in the
    module, at module level or inside a function; relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base, [a.name for a in node.names]


def _import_graph() -> dict[str, set[str]]:
    """Module -> the rc modules it imports. `from pkg import mod` is an edge
    to pkg.mod when that is a module, else to pkg; `import a.b` is an edge to
    the longest rc module it names. A package's __init__, run implicitly
    before its submodules, is not an edge of theirs."""
    modules = _module_paths()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _line, module, names in _import_statements(name, path):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
            if len(targets) < len(names) or not names:
                parts = module.split(".")
                while parts and ".".join(parts) not in modules:
                    parts.pop()
                targets.append(".".join(parts))
            graph[name] |= {t for t in targets if t and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_import_graph_sees_function_level_and_relative_imports():
    graph = _import_graph()
    assert "rc.proto.errors" in graph["rc.proto.client"]
    assert "rc.cli.config" in graph["rc.cli.context"]  # from rc.cli import config
    assert "rc.cli.output" in graph["rc.cli"]  # imported inside main()
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_cycles(package):
    cycles = [c for c in _cycles(_import_graph()) if any(_in(m, package) for m in c)]
    assert cycles == [], "import cycles (counting imports inside functions):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


@pytest.mark.parametrize("package", NO_PRIVATE_IMPORTS)
def test_no_private_names_imported_across_modules(package):
    modules = _module_paths()
    bad = [
        f"{path.relative_to(REPO)}:{line}: {n} from {module}"
        for name, path in modules.items()
        if _in(name, package)
        for line, module, names in _import_statements(name, path)
        if _in(module, "rc")
        for n in names
        if n.startswith("_") and not n.startswith("__")
    ]
    assert bad == []


TX_QUERY_METHODS = {"one", "all", "scalar", "iter", "exec", "many", "change"}
"""rc.controller.store.db.Tx's methods that run a named query."""
STORE = REPO / "rc/controller/store"


def _store_boundary_violations(source: str, queries: set[str]) -> list[tuple[int, str]]:
    """(line, what) wherever code runs a query or reaches the database itself:
    a Tx query method called on `tx` or with a query's name, QUERIES named or
    imported, sqlite3 or aiosqlite imported."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in TX_QUERY_METHODS
        ):
            on_tx = isinstance(node.func.value, ast.Name) and node.func.value.id == "tx"
            first = node.args[0] if node.args else None
            named = isinstance(first, ast.Constant) and first.value in queries
            if on_tx or named:
                out.append((node.lineno, f"runs a query (.{node.func.attr})"))
        elif (isinstance(node, ast.Name) and node.id == "QUERIES") or (
            isinstance(node, ast.Attribute) and node.attr == "QUERIES"
        ):
            out.append((node.lineno, "uses QUERIES"))
        elif isinstance(node, ast.ImportFrom) and any(a.name == "QUERIES" for a in node.names):
            out.append((node.lineno, "imports QUERIES"))
        if isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for mod in mods:
                if mod and mod.split(".")[0] in ("sqlite3", "aiosqlite"):
                    out.append((node.lineno, f"imports {mod}"))
    return sorted(out)


def test_only_the_store_runs_queries():
    """The store boundary (rc/controller/store/__init__.py): no module of rc
    outside rc/controller/store/ runs a named query, touches QUERIES or talks
    to SQLite; it calls the store's functions."""
    from rc.controller.store.db import QUERIES

    bad = []
    for path in sorted((REPO / "rc").rglob("*.py")):
        if STORE not in path.parents:
            found = _store_boundary_violations(path.read_text(encoding="utf-8"), set(QUERIES))
            bad += [f"{path.relative_to(REPO)}:{line}: {what}" for line, what in found]
    assert bad == [], "store boundary crossed:\n" + "\n".join(bad)


def test_the_store_boundary_check_sees_each_way_across():
    source = (
        "import sqlite3\n"
        "from rc.controller.store.db import QUERIES\n"
        "async def handler(c):\n"
        "    row = await c.db.read(lambda tx: tx.one('job_brief', (1,)))\n"
        "    await c.db.write(lambda t: t.change('job_finish', ()))\n"
        "    return QUERIES['job_get'], [].all()\n"
    )
    assert _store_boundary_violations(source, {"job_brief", "job_finish", "job_get"}) == [
        (1, "imports sqlite3"),
        (2, "imports QUERIES"),
        (4, "runs a query (.one)"),
        (5, "runs a query (.change)"),
        (6, "uses QUERIES"),
    ]


# -- the client vocabulary (rc/proto/calls.py) ------------------------------------------

NO_CLIENT_CALLS = {
    ("GET", "/"),  # the dashboard page, for a browser
    ("GET", "/openapi.json"),  # the API's document, for people and tools
    ("GET", "/metrics"),  # Prometheus scrapes it
    ("POST", "/v1/dashboard/session"),  # the dashboard page spends its one-time code
    ("GET", "/v1/events/stream"),  # the dashboard page's live feed (EventSource)
    ("GET", "/v1/usage/chart.svg"),  # the dashboard page's usage picture
}
"""The routes of the table no client of rc (rc/cli, rc/worker) calls: served
to a browser, a scraper or a reader. Every other route is a Call in rc.proto.calls."""


def _routes() -> dict[tuple[str, str], object]:
    from rc.controller.api.routes import ROUTES

    return {(e.method, e.path): e for e in ROUTES}


def test_every_call_is_a_route_of_the_table_as_it_declares_it():
    """rc.proto.calls says what the route table says: each call names a
    route of ROUTES by method and path template, takes and answers the
    records it declares, and reads its query parameters."""
    from rc.proto import calls

    routes = _routes()
    bad = []
    for call in calls.CALLS:
        e = routes.get((call.method, call.path))
        if e is None:
            bad.append(f"{call}: no such route in ROUTES")
            continue
        if call.request is not e.request or call.response is not e.response:
            bad.append(
                f"{call}: takes {call.request!r} and answers {call.response!r}; "
                f"the route takes {e.request!r} and answers {e.response!r}"
            )
        if set(call.query) != {p.name for p in e.params} or len(set(call.query)) != len(call.query):
            bad.append(f"{call}: reads {call.query}; the route {[p.name for p in e.params]}")
    assert bad == [], "rc.proto.calls disagrees with ROUTES:\n" + "\n".join(bad)
    assert len({(c.method, c.path) for c in calls.CALLS}) == len(calls.CALLS), "a route twice"


def test_every_route_a_client_may_call_is_a_call():
    """The other way round: a route of the table is a Call, unless it is one
    of NO_CLIENT_CALLS (which all exist)."""
    from rc.proto import calls

    routes = set(_routes())
    named = {(c.method, c.path) for c in calls.CALLS}
    assert routes - named - NO_CLIENT_CALLS == set(), "routes no Call names"
    assert NO_CLIENT_CALLS - routes == set(), "NO_CLIENT_CALLS names routes that are gone"
    assert NO_CLIENT_CALLS & named == set(), "a Call for a route said to have no client"


def test_every_call_of_the_module_is_in_calls():
    from rc.proto import calls

    found = [v for v in vars(calls).values() if isinstance(v, calls.Call)]
    found += [h for v in vars(calls).values() if isinstance(v, calls.Relay) for h in v.halves]
    assert set(found) == set(calls.CALLS)
    assert set(calls.__all__) >= {n for n, v in vars(calls).items() if isinstance(v, calls.Call)}


def _path_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal that is an API path, or starts
    one ("/v1...", an f-string's head included), and of every import of
    rc.proto.API (the prefix under another name). Prose that mentions a
    route ("POST /v1/jobs, retrying...") is not a path."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("/v1"):
                out.append((node.lineno, node.value))
        elif isinstance(node, ast.ImportFrom) and node.module == "rc.proto":
            out += [(node.lineno, "imports API") for a in node.names if a.name == "API"]
    return sorted(out)


def test_the_client_code_writes_no_path():
    """rc/cli and rc/worker name their calls (rc.proto.calls); no path of
    the API is written there by hand."""
    bad = [
        f"{path.relative_to(REPO)}:{line}: {text!r}"
        for root in ("rc/cli", "rc/worker")
        for path in _python_files(root)
        for line, text in _path_literals(path.read_text(encoding="utf-8"))
    ]
    assert bad == [], "paths written by hand (name the call in rc.proto.calls):\n" + "\n".join(bad)


def test_the_path_literal_check_sees_each_form():
    source = (
        '"""Sends POST /v1/jobs and GET /v1/jobs/{id}: prose."""\n'
        "from rc.proto import API\n"
        'a = c.get("/v1/state")\n'
        'b = c.post(f"/v1/jobs/{job_id}/kill", {})\n'
        'p = "/v1" + "/jobs"\n'
        'help = "json (the report as GET /v1/usage gives it)"\n'
        "c.call(calls.JOB_GET, 7)\n"
    )
    assert _path_literals(source) == [
        (2, "imports API"),
        (3, "/v1/state"),
        (4, "/v1/jobs/"),
        (5, "/v1"),
    ]


# -- the worker's clock --------------------------------------------------------------

CLOCK_READINGS = {
    "time.time",
    "time.time_ns",
    "time.monotonic",
    "time.monotonic_ns",
    "time.perf_counter",
    "time.perf_counter_ns",
    "time.sleep",
    "asyncio.sleep",
}
"""The standard library's clock: what rc/worker reads through rc.worker.clock."""
REAL_CLOCK_ALLOWED = {
    "rc/worker/clock.py": {"time.time", "time.monotonic", "time.sleep"},  # the clock itself
    "rc/worker/supervise.py": {"time.monotonic", "time.sleep"},
    "rc/worker/cgroups.py": {"time.monotonic", "time.sleep"},
    "rc/worker/survivors.py": {"time.monotonic", "time.sleep"},
    "rc/worker/leftovers.py": {"time.monotonic", "time.sleep"},
    "rc/worker/terminal.py": {"time.monotonic"},
    "rc/worker/attached.py": {"time.monotonic"},
    "rc/worker/script.py": {"time.monotonic", "time.sleep"},
}
"""The modules of rc/worker that may read the standard library's clock
themselves, and what of it: those that wait for the kernel, as the rule in
rc/worker/clock.py lists them. Everything else goes through a Clock (the one
passed in, or SYSTEM for what is meant to be real)."""


def _clock_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of every use of CLOCK_READINGS: `time.sleep` through any
    name `time` or `asyncio` is imported as, called or not, and
    `from time import sleep` (at its import)."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # the name a module is bound to -> the module
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in ("time", "asyncio"):
                    modules[a.asname or a.name] = a.name
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and node.module in ("time", "asyncio")
        ):
            for a in node.names:
                name = f"{node.module}.{a.name}"
                if name in CLOCK_READINGS or a.name == "*":
                    out.append((node.lineno, name))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and f"{modules[node.value.id]}.{node.attr}" in CLOCK_READINGS
        ):
            out.append((node.lineno, f"{modules[node.value.id]}.{node.attr}"))
    return sorted(out)


def test_the_worker_reads_time_through_its_clock():
    """The clock rule (rc/worker/clock.py): outside the modules it names, no
    module of rc/worker reads or sleeps on the standard library's clock."""
    bad, used = [], set()
    for path in _python_files("rc/worker"):
        rel = str(path.relative_to(REPO))
        for line, name in _clock_uses(path.read_text(encoding="utf-8")):
            if name in REAL_CLOCK_ALLOWED.get(rel, set()):
                used.add((rel, name))
            else:
                bad.append(f"{rel}:{line}: {name} (read it through rc.worker.clock)")
    assert bad == [], "the worker's clock bypassed:\n" + "\n".join(bad)
    allowed = {(rel, name) for rel, names in REAL_CLOCK_ALLOWED.items() for name in names}
    assert allowed - used == set(), "allowed but no longer used: drop them"


def test_the_clock_allow_list_is_the_rule_clock_py_states():
    from rc.worker import clock

    rule = " ".join(clock.__doc__.split())
    for rel in REAL_CLOCK_ALLOWED:
        module = rel.removesuffix(".py").replace("/", ".")
        assert rel == "rc/worker/clock.py" or f"- {module}:" in rule, module
    named = set(re.findall(r"- (rc\.worker\.\w+):", rule))
    assert named == {r.removesuffix(".py").replace("/", ".") for r in REAL_CLOCK_ALLOWED} - {
        "rc.worker.clock"
    }


def test_the_clock_check_sees_each_form():
    source = (
        "import time\n"
        "import time as _t\n"
        "import asyncio\n"
        "from time import monotonic, perf_counter as pc, strftime\n"
        "now = time.time()\n"
        "tick = _t.sleep\n"
        "async def f():\n"
        "    await asyncio.sleep(1)\n"
        "    return time.strftime('%Y'), SYSTEM.monotonic(), clock.sleep(1)\n"
    )
    assert _clock_uses(source) == [
        (4, "time.monotonic"),
        (4, "time.perf_counter"),
        (5, "time.time"),
        (6, "time.sleep"),
        (8, "asyncio.sleep"),
    ]


# -- citations -------------------------------------------------------------------

CITING = (
    "rc",
    "tests",
    "bench",
    "examples",
    "docs",
    "README.md",
    "pyproject.toml",
    "zipapp",
    "rc.py",
)
"""Every place a comment, docstring or document of the repository lives."""

OUTSIDE = re.compile(
    r"inventory\s§"  # the original implementation's inventory, by section
    r"|§\s?\d"  # a numbered section of any document
    r"|\b(DESIGN|STYLE)\.md"  # the team's notes, which live outside the repository
    r"|original-inventor[y]"
    r"|\.\./shared/"
    r"|\b[Ii]ssue\s\d"  # an issue by number
    r"|\b[Ii]ssue\s\""  # an issue by title
    r"|\"What\sa\snewcomer\shit\"\s\d"  # an item of that issue
)
"""Citations a reader of the repository cannot follow. A comment states its
rule, or points at a file here (docs/design.md, a README section)."""


def _texts():
    """(path relative to the repo, text) of every text file under CITING."""
    for name in CITING:
        top = REPO / name
        for path in sorted(top.rglob("*")) if top.is_dir() else [top]:
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            try:
                yield path.relative_to(REPO), path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # not text


def test_nothing_cites_a_document_or_an_issue_the_repository_does_not_have():
    bad = [
        f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for path, text in _texts()
        for m in OUTSIDE.finditer(text)
    ]
    assert bad == [], "citations of what is not in the repository:\n" + "\n".join(bad)


def test_the_citation_check_sees_each_form():
    # written in pieces, so that this file does not cite them itself
    for cited in (
        "(inventory \u00a77.5)",
        "(\u00a76.9)",
        "DESIGN" + ".md",
        "(STYLE" + ".md)",
        "(issue" + " 6)",
        "Issue" + " 12 item 5",
        "issue" + ' "Recovery"',
        '("What a newcomer hit"' + " 16)",
        ".." + "/shared/reference",
    ):
        assert OUTSIDE.search(cited), cited
    for fine in ("issued by", "docs/design.md#layering", 'README "Security model"', "the issue"):
        assert not OUTSIDE.search(fine), fine


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation
    dropped, spaces as hyphens ("Teardown: empty or out" → teardown-empty-or-out)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _readme_sections() -> set[str]:
    """README headings and bold paragraph leads ("**Recovery proof.**"), without
    backticks or a final period."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.findall(r"^#+ (.+)$", text, re.MULTILINE) + re.findall(
        r"^\*\*(.+?)\*\*", text, re.MULTILINE
    )
    return {f.replace("`", "").strip().rstrip(".") for f in found}


def test_pointers_into_the_repository_lead_somewhere():
    """A docs/design.md anchor names a heading there; README and a quoted name,
    a heading (or bold paragraph lead) of the README."""
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", design, re.MULTILINE)}
    sections = _readme_sections()
    bad = []
    for path, text in _texts():
        for m in re.finditer(r"docs/design\.md#([A-Za-z0-9_-]+)", text):
            if m.group(1) not in anchors:
                bad.append(f"{path}: docs/design.md#{m.group(1)}")
        for m in re.finditer(r"README\s+\"([^\"]+)\"", text):
            # a pointer may run over a line break, into the next comment line
            name = re.sub(r"\s*\n\s*(#|--)?\s*", " ", m.group(1)).strip()
            if name not in sections:
                bad.append(f"{path}: README {name!r}")
    assert bad == [], "pointers to no heading:\n" + "\n".join(bad)
    assert "teardown-empty-or-out" in anchors and "Reliability: quarantine and recovery" in sections
