"""The layout and layering rules of DESIGN.md §2."""

from __future__ import annotations

import argparse
import ast
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
    assert bad == [], "layering violations (DESIGN.md §2):\n" + "\n".join(bad)


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
    assert users == ["rc/cli/local.py"]


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
    assert not loaded & {"rc.cli.run", "rc.cli.relay", "rc.cli.copy", "rc.cli.local"}


def _import_graph(package: str, base: Path = REPO) -> dict[str, set[str]]:
    """Module → the modules of `package` (a directory under `base`) it
    imports, at any level: a function-level import counts (it only hides a
    cycle). `from pkg import sub` depends on the submodule, `from pkg import
    name` on the package's __init__."""
    paths = {}
    for path in sorted((base / package).rglob("*.py")):
        parts = path.relative_to(base).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for mod, path in paths.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                subs = {f"{node.module}.{a.name}" for a in node.names}
                deps |= subs & paths.keys()
                if subs - paths.keys():  # a name defined in the module itself
                    deps.add(node.module)
        graph[mod] = {d for d in deps if d in paths and d != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one
    module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_check_sees_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import g\n\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from pkg import a\n\n    return a\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    assert _cycles(_import_graph("pkg", tmp_path)) == [["pkg.a", "pkg.b"]]


@pytest.mark.parametrize("package", ["rc/proto", "rc/worker"])
def test_no_import_cycles(package):
    """No module of the package imports itself back, even from inside a
    function (rc/cli and rc/controller join once their cycles are broken)."""
    assert _cycles(_import_graph(package)) == []
