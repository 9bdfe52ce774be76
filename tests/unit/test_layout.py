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
from tests.helpers.harness import BARE_PY, REPO

STDLIB = set(sys.stdlib_module_names) | {"__future__"}
LIGHT = {
    "rc/proto": {"rc.proto"},
    "rc/worker": {"rc.proto", "rc.worker"},
    "rc/cli": {"rc.proto", "rc.cli", "rc.api"},  # rc.api: rc mcp's tools
    "rc/__init__.py": set(),
    "rc/__main__.py": {"rc.cli", "rc.worker"},
    "rc/api.py": {"rc.proto", "rc.cli"},  # the Python API (README "A Python API"), in the zipapp
}
OPTIONAL = {"argcomplete", "mcp"}
"""Imported only where present: argcomplete for completion, the MCP SDK
inside `rc mcp` (the extra rc[mcp]; rc.cli.mcp.require_sdk says so)."""


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
    assert "rc/api.py" in names  # `import rc.api` works from the zipapp


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
        assert p.description and summaries.get(name), name  # tests/unit/test_cli_output.py: args
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
ROW_NAMES = {"Row", "loads", "dumps"}
"""What the store has of rows themselves: the PostgreSQL engine's row type
and the codec of the JSON columns (rc.controller.store.db)."""
STORE = REPO / "rc/controller/store"
STORE_PACKAGE = "rc.controller.store"


def _store_boundary_violations(source: str, queries: set[str]) -> list[tuple[int, str]]:
    """(line, what) wherever code runs a query or reaches the database itself:
    a Tx query method called on `tx` or with a query's name, QUERIES named or
    imported, sqlite3 or aiosqlite imported, a row type or the column codec
    of the store imported (ROW_NAMES)."""
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
        elif isinstance(node, ast.ImportFrom) and _in(node.module or "", STORE_PACKAGE):
            for a in node.names:
                if a.name in ROW_NAMES:
                    out.append((node.lineno, f"imports {a.name} (rows are the store's)"))
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
    from rc.controller.store.sql import QUERIES

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
        "from rc.controller.store.pg import PgDatabase, Row\n"
        "from rc.controller.store.db import Database, loads\n"
    )
    assert _store_boundary_violations(source, {"job_brief", "job_finish", "job_get"}) == [
        (1, "imports sqlite3"),
        (2, "imports QUERIES"),
        (4, "runs a query (.one)"),
        (5, "runs a query (.change)"),
        (6, "uses QUERIES"),
        (7, "imports Row (rows are the store's)"),
        (8, "imports loads (rows are the store's)"),
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
        for root in ("rc/cli", "rc/worker", "rc/api.py")
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


# -- rows stay in the store -------------------------------------------------------

ENGINES = {"rc.controller.store.db", "rc.controller.store.sqlite", "rc.controller.store.pg"}
"""The engines: the layer that makes rows (their Tx methods answer them)."""
DB_METHODS = {"read", "write", "write_soft"}
"""Database's methods that run a transaction function and answer what it returned."""
ROW_QUERIES = {"one", "all", "iter"}
"""Tx's methods that answer rows."""
CARRYING_METHODS = {"items", "values", "get", "pop", "copy", "setdefault"}
"""Methods of a container of rows that answer rows again."""
CARRYING_CALLS = {"list", "tuple", "sorted", "reversed", "next", "iter", "filter", "enumerate"}
"""Builtins that answer the rows they are given (`dict(row)` is a conversion:
what comes of it is checked where it is read)."""
FILLING_METHODS = {"append", "extend", "add", "update", "insert", "setdefault"}
"""Methods that put what they are given into their container."""


def _scopes(tree: ast.AST):
    """Every function of a module (the module itself first, as None), each
    with the statements that are its own (not those of functions inside it),
    and the class it is a method of (None for none)."""
    out = [(None, None, tree)]

    def visit(node, cls):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((child, cls, child))
                visit(child, None)
            elif isinstance(child, ast.ClassDef):
                visit(child, child)
            else:
                visit(child, cls)

    visit(tree, None)
    return out


def _own_nodes(root: ast.AST):
    """The nodes of a scope, not descending into the functions defined in it."""
    todo = list(ast.iter_child_nodes(root))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            todo.extend(ast.iter_child_nodes(node))


def _called(call: ast.Call) -> str:
    """The name a call calls: `f(...)` f, `x.f(...)` f."""
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _str_key(node: ast.Subscript) -> str | None:
    s = node.slice
    return s.value if isinstance(s, ast.Constant) and isinstance(s.value, str) else None


class _Module:
    """One module of rc for the row check: its tree, whether it is the
    store's, and what each name it imports stands for."""

    def __init__(self, name: str, source: str, modules: set[str]) -> None:
        self.name = name
        self.tree = ast.parse(source)
        self.in_store = _in(name, STORE_PACKAGE)
        self.aliases: dict[str, str] = {}  # local name -> the module it names
        self.imported: dict[str, str] = {}  # local name -> the module it comes from
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = (
                        a.name if a.asname else a.name.split(".")[0]
                    )
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    local = a.asname or a.name
                    if f"{node.module}.{a.name}" in modules:
                        self.aliases[local] = f"{node.module}.{a.name}"
                    else:
                        self.imported[local] = node.module

    def of_store(self, call: ast.Call) -> bool:
        """Whether a call (outside the store) answers what the store read:
        a Database's read or write (`c.db.read(fn, ...)`), or a function of
        a store module called directly (`jobs.brief(tx, 1)`)."""
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr in DB_METHODS:
            on = f.value
            if (isinstance(on, ast.Attribute) and on.attr == "db") or (
                isinstance(on, ast.Name) and on.id == "db"
            ):
                return True
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            return _in(self.aliases.get(f.value.id, ""), STORE_PACKAGE)
        if isinstance(f, ast.Name):
            return _in(self.imported.get(f.id, ""), STORE_PACKAGE)
        return False

    def outside_callee(self, call: ast.Call) -> str:
        """The rc function outside the store a call (in the store) calls,
        dotted ("" for any other call)."""
        f = call.func
        if isinstance(f, ast.Name) and f.id in self.imported:
            module = self.imported[f.id]
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            module = self.aliases.get(f.value.id, "")
        else:
            return ""
        if _in(module, "rc") and not _in(module, STORE_PACKAGE):
            return f"{module}.{_called(call)}"
        return ""


class _RowFlow:
    """Where rows go, over a set of modules: a fixed point of which names
    of which functions hold rows (or containers of rows), which functions
    return them and which parameters are given them, by function name (a
    method is known by its name alone: coarse, and on the safe side).

    A row is what a Tx query answers (inside the store); outside it, what
    the store answered (DB_METHODS, a store function) is treated as one, so
    that a row that leaked out is caught where a column of it is read."""

    def __init__(self, modules: list[_Module]) -> None:
        self.modules = modules
        # by side (in the store or not): the functions that return rows, and
        # the (function, position or keyword) of parameters given rows
        self.returns: dict[bool, set[str]] = {True: set(), False: set()}
        self.params: dict[bool, set[tuple[str, int | str]]] = {True: set(), False: set()}
        self.found: list[tuple[str, int, str]] = []
        size = -1
        while size != self._size():  # each turn only adds: it ends
            size = self._size()
            self.found = []
            for m in self.modules:
                if m.name not in ENGINES:
                    self._module(m)

    def _size(self) -> int:
        return sum(len(s) for s in (*self.returns.values(), *self.params.values()))

    def _module(self, m: _Module) -> None:
        inherited: dict[ast.AST, set[str]] = {}
        for fn, cls, root in _scopes(m.tree):
            rows = set(inherited.get(root, set()))
            if fn is not None:
                args = [*fn.args.posonlyargs, *fn.args.args]
                if cls is not None and args and args[0].arg in ("self", "cls"):
                    args = args[1:]
                for i, a in enumerate(args):
                    if (fn.name, i) in self.params[m.in_store]:
                        rows.add(a.arg)
                for a in [*args, *fn.args.kwonlyargs]:
                    if (fn.name, a.arg) in self.params[m.in_store]:
                        rows.add(a.arg)
            nodes = list(_own_nodes(root))
            for _ in range(5):
                n = len(rows)
                for node in nodes:
                    self._bind(m, node, rows)
                if len(rows) == n:
                    break
            for node in nodes:
                self._check(m, fn, cls, node, rows)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    inherited[node] = rows  # a closure sees its function's names

    def _holds(self, m: _Module, e: ast.AST | None, rows: set[str]) -> bool:
        """Whether expression `e` is a row or holds rows."""
        if e is None:
            return False
        if isinstance(e, ast.Name):
            return e.id in rows
        if isinstance(e, ast.Await | ast.Starred):
            return self._holds(m, e.value, rows)
        if isinstance(e, ast.Subscript):
            return _str_key(e) is None and self._holds(m, e.value, rows)
        if isinstance(e, ast.IfExp):
            return self._holds(m, e.body, rows) or self._holds(m, e.orelse, rows)
        if isinstance(e, ast.BoolOp):
            return any(self._holds(m, v, rows) for v in e.values)
        if isinstance(e, ast.List | ast.Tuple | ast.Set):
            return any(self._holds(m, v, rows) for v in e.elts)
        if isinstance(e, ast.Dict):
            return any(self._holds(m, v, rows) for v in e.values)
        if isinstance(e, ast.ListComp | ast.SetComp | ast.GeneratorExp):
            return self._holds(m, e.elt, rows)
        if isinstance(e, ast.DictComp):
            return self._holds(m, e.value, rows)
        if isinstance(e, ast.NamedExpr):
            return self._holds(m, e.value, rows)
        if isinstance(e, ast.Call):
            f = e.func
            if m.in_store and isinstance(f, ast.Attribute) and f.attr in ROW_QUERIES:
                return True
            if not m.in_store and m.of_store(e):
                return True
            if _called(e) in self.returns[m.in_store]:
                return True
            if isinstance(f, ast.Attribute) and f.attr in CARRYING_METHODS:
                return self._holds(m, f.value, rows)
            if isinstance(f, ast.Name) and f.id in CARRYING_CALLS:
                return any(self._holds(m, a, rows) for a in e.args)
        return False

    def _bind(self, m: _Module, node: ast.AST, rows: set[str]) -> None:
        """Names `node` binds to rows, and containers it fills with them."""

        def names(target) -> list[str]:
            if isinstance(target, ast.Name):
                return [target.id]
            if isinstance(target, ast.Starred):
                return names(target.value)
            if isinstance(target, ast.Tuple | ast.List):
                return [n for t in target.elts for n in names(t)]
            if isinstance(target, ast.Subscript | ast.Attribute):
                return names(target.value)  # filling a container, or an attribute of it
            return []

        if isinstance(node, ast.Assign):
            for t in node.targets:
                pairs = [(t, node.value)]
                if (
                    isinstance(t, ast.Tuple)
                    and isinstance(node.value, ast.Tuple)
                    and len(t.elts) == len(node.value.elts)
                ):  # a, b = x, y: one by one
                    pairs = list(zip(t.elts, node.value.elts, strict=True))
                for target, value in pairs:
                    if self._holds(m, value, rows):
                        rows.update(names(target))
        elif (
            isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr)
            and self._holds(m, node.value, rows)
            or isinstance(node, ast.For | ast.AsyncFor | ast.comprehension)
            and self._holds(m, node.iter, rows)
        ):
            rows.update(names(node.target))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in FILLING_METHODS
            and any(self._holds(m, a, rows) for a in node.args)
        ):
            rows.update(names(node.func.value))

    def _check(self, m: _Module, fn, cls, node: ast.AST, rows: set[str]) -> None:
        """Note where a row crosses (a column read outside the store, a row
        returned by a public store function or handed out of the store)
        and what flows on (returns, arguments)."""
        where = m.name.replace(".", "/") + ".py"
        if isinstance(node, ast.Return) and fn is not None and self._holds(m, node.value, rows):
            self.returns[m.in_store].add(fn.name)
            public = not fn.name.startswith("_") and (cls is None or not cls.name.startswith("_"))
            if m.in_store and public:
                self.found.append((where, node.lineno, f"{fn.name} returns a row"))
        elif isinstance(node, ast.Call):
            for i, a in enumerate(node.args):
                if self._holds(m, a, rows):
                    self.params[m.in_store].add((_called(node), i))
                    if m.in_store and (callee := m.outside_callee(node)):
                        self.found.append((where, node.lineno, f"hands a row to {callee}"))
            for k in node.keywords:
                if k.arg and self._holds(m, k.value, rows):
                    self.params[m.in_store].add((_called(node), k.arg))
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and not m.in_store
            and (key := _str_key(node)) is not None
            and self._holds(m, node.value, rows)
        ):
            self.found.append((where, node.lineno, f"reads column {key!r} of a store row"))


def _row_crossings(sources: dict[str, str]) -> list[tuple[str, int, str]]:
    """(path, line, what) wherever a row of the store crosses its boundary
    in these modules (dotted name → source): a column read outside
    rc/controller/store (`row["state"]`) of anything the store answered, a
    public function of the store that returns a row (or a container of
    them), a row handed from the store to a function of rc outside it."""
    modules = [_Module(name, text, set(sources)) for name, text in sorted(sources.items())]
    return sorted(set(_RowFlow(modules).found))


def test_rows_stay_in_the_store():
    """Nothing outside rc/controller/store gets a row: the store answers
    records (rc.proto's, the planner's, rc.controller.store.rows'), built by
    the mappers of rc/controller/store/rows.py, so a column's name and its
    stored form are known in the store alone."""
    sources = {
        name: path.read_text(encoding="utf-8")
        for name, path in _module_paths().items()
        if _in(name, "rc.controller")  # nothing else can import the store
    }
    found = _row_crossings(sources)
    assert found == [], "rows outside the store:\n" + "\n".join(
        f"{path}:{line}: {what}" for path, line, what in found
    )


def test_the_row_check_sees_each_way_a_row_crosses():
    sources = {
        "rc.controller.store.jobs": (
            "from rc.controller.planning import slot_of\n"
            "def brief(tx, i):\n"
            "    return tx.one('job_brief', (i,))\n"
            "def briefs(tx, ids):\n"
            "    out = {}\n"
            "    for i in ids:\n"
            "        out[i] = tx.one('job_brief', (i,))\n"
            "    return out\n"
            "def _own(tx, i):\n"
            "    return tx.one('job_brief', (i,))\n"
            "def state(tx, i):\n"
            "    return _own(tx, i)['state'], dict(_own(tx, i))\n"
            "def slots(tx):\n"
            "    return [slot_of(r) for r in tx.all('device_slots')]\n"
        ),
        "rc.controller.planning": "def slot_of(r):\n    return r['id']\n",
        "rc.controller.api.jobs": (
            "from rc.controller.store import jobs\n"
            "async def kill(c, i, request):\n"
            "    row = await c.db.read(jobs.brief, i)\n"
            "    if row['state'] == 'lost' and request.path_params['x']:\n"
            "        return _words(row)\n"
            "def _words(r):\n"
            "    return r['submitter']\n"
            "def listed(tx):\n"
            "    return [r['id'] for r in jobs.listing(tx)]\n"
            "async def remember(c, cache):\n"
            "    cache.put(await c.db.write(jobs.create))\n"
        ),
        "rc.controller.auth": (
            "class Cache:\n    def put(self, row):\n        self.k = row['secret_hash']\n"
        ),
        "rc.controller.core": (
            "class Controller:\n"
            "    async def handout(self, w):\n"
            "        found, due = await self.db.read(pending, w)\n"
            "        return found\n"
            "async def poll(c):\n"
            "    return [a['id'] for a in await c.handout('w')]\n"
        ),
    }
    assert _row_crossings(sources) == [
        ("rc/controller/api/jobs.py", 4, "reads column 'state' of a store row"),
        ("rc/controller/api/jobs.py", 7, "reads column 'submitter' of a store row"),
        ("rc/controller/api/jobs.py", 9, "reads column 'id' of a store row"),
        ("rc/controller/auth.py", 3, "reads column 'secret_hash' of a store row"),
        ("rc/controller/core.py", 6, "reads column 'id' of a store row"),
        ("rc/controller/store/jobs.py", 3, "brief returns a row"),
        ("rc/controller/store/jobs.py", 8, "briefs returns a row"),
        ("rc/controller/store/jobs.py", 14, "hands a row to rc.controller.planning.slot_of"),
    ]


MODULE_LINES_MAX = 600
"""No module of rc is longer: past it, a module is split by concept."""


def test_no_module_is_over_600_lines():
    lines = {
        path.relative_to(REPO).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted((REPO / "rc").rglob("*.py"))
    }
    long = {name: n for name, n in lines.items() if n > MODULE_LINES_MAX}
    assert long == {}, f"modules over {MODULE_LINES_MAX} lines (split them by concept): {long}"


# -- the test suite's own layout ---------------------------------------------------

TESTS = REPO / "tests"


def _test_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import of a `tests.` module in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [(node.lineno, n) for n in names[:1] if n.startswith("tests.")]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("tests.")]
    return found


def _shared(module: str) -> bool:
    return (
        module == "tests.helpers"
        or module.startswith("tests.helpers.")
        or module.endswith("conftest")
    )


def test_no_test_module_imports_another():
    """What tests share lives in tests/helpers (or a conftest.py): a test
    module importing another ran that module's fixtures twice and tied two
    kinds of test together."""
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(REPO)
        for line, module in _test_imports(ast.parse(path.read_text(), str(path))):
            if not _shared(module):
                bad.append(f"{rel}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_the_test_import_check_sees_each_form():
    tree = ast.parse(
        "from tests.e2e.test_cp import x\n"
        "import tests.unit.test_proto\n"
        "from tests.helpers.harness import Cli\n"
        "def f():\n"
        "    from tests.store.test_schema import CHECKED\n"
    )
    assert [(n, m) for n, m in _test_imports(tree) if not _shared(m)] == [
        (1, "tests.e2e.test_cp"),
        (2, "tests.unit.test_proto"),
        (5, "tests.store.test_schema"),
    ]


def test_each_test_module_lives_in_the_folder_of_its_kind():
    """tests/ holds conftest.py and folders only: unit, store, worker, e2e
    (tests/conftest.py marks tests/e2e's tests e2e by folder) and helpers."""
    loose = sorted(
        p.name for p in TESTS.glob("*.py") if p.name not in ("__init__.py", "conftest.py")
    )
    assert not loose, f"test modules outside a folder of their kind: {loose}"
    kinds = {p.name for p in TESTS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert kinds == {"unit", "store", "worker", "e2e", "helpers"}
    assert not list((TESTS / "helpers").glob("test_*.py")), "tests/helpers holds no tests"
