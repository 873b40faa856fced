"""The rules of the house (docs/design.md, "The house"), read from the code's own imports.

Each test fails when a change breaks one rule: a package imported against the direction
of the floors, psycopg outside the store, an import circle, a module over 600 lines, or
a reference to a file outside the repository.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "cyclone_server"
PACKAGES = ("store", "api", "stream", "console", "serve", "cli")
# What each package may import of the others (the ground floor, "", is open to all).
MAY_IMPORT = {
    "": set(),
    "store": set(),
    "api": {"store"},
    "stream": {"store"},
    "console": {"store"},
    "serve": {"store", "api", "stream", "console"},
    "cli": {"store", "api", "stream", "console", "serve"},
}
MAX_LINES = 600


def _modules(top: str) -> dict[str, Path]:
    """Dotted module name -> file, for every source module of the import package `top`."""
    out = {}
    for path in sorted((ROOT / top).rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, except what stands under `if TYPE_CHECKING:` (imports for type hints only)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _imports(name: str, path: Path) -> set[str]:
    """The absolute names of what module `name` imports at run time (deferred imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)  # `from pkg import module`
    return found


def _floor(module: str) -> str:
    """'store' for cyclone_server.store.engine; '' for the ground floor (cyclone_server.errors)."""
    parts = module.split(".")
    if parts[-1] == "__main__":  # `python -m cyclone_server`: the command line's entry
        return "cli"
    return parts[1] if len(parts) >= 2 and parts[1] in PACKAGES else ""


SERVER_MODULES = _modules("cyclone_server")
IMPORTS = {name: _imports(name, path) for name, path in SERVER_MODULES.items()}


def test_the_house_has_its_packages() -> None:
    for package in PACKAGES:
        assert (SERVER / package / "__init__.py").is_file(), package


@pytest.mark.parametrize("module", sorted(SERVER_MODULES))
def test_imports_run_down_the_floors(module: str) -> None:
    floor = _floor(module)
    wrong = sorted(
        target for target in IMPORTS[module]
        if target.startswith("cyclone_server.") and target in SERVER_MODULES
        and _floor(target) not in ({floor, ""} | MAY_IMPORT[floor])
    )
    assert wrong == [], f"{module} (floor {floor or 'ground'}) imports {wrong}"


@pytest.mark.parametrize("module", sorted(SERVER_MODULES))
def test_only_the_store_imports_psycopg(module: str) -> None:
    if _floor(module) == "store":
        return
    drivers = sorted(t for t in IMPORTS[module] if t.split(".")[0] in ("psycopg", "psycopg_pool"))
    assert drivers == [], f"{module} imports {drivers}: Postgres is reached through cyclone_server.store only"


def test_no_import_circle() -> None:
    modules = {**SERVER_MODULES, **_modules("cyclone_worker")}
    graph = {
        name: {t for t in (IMPORTS.get(name) or _imports(name, path)) if t in modules and t != name}
        for name, path in modules.items()
    }
    # A package's __init__ that hands on names of its own modules is not a circle.
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    seen: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> None:
        if node in path:
            pytest.fail("import circle: " + " -> ".join(path[path.index(node):] + [node]))
        if node in seen:
            return
        path.append(node)
        for target in sorted(graph[node]):
            visit(target)
        path.pop()
        seen.add(node)

    for name in sorted(graph):
        visit(name)


def test_no_module_passes_600_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for top in ("cyclone_server", "cyclone_worker")
        for path in _modules(top).values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"over {MAX_LINES} lines (one concern per module; split by concern): {long}"


def test_the_repository_cites_no_file_outside_it() -> None:
    # The names of the outside files, spelled in parts so that this line does not cite them itself.
    outside = "|".join(["DECI" + "SIONS", r"\.\./" + "shared", "shared/" + "spec"])
    listed = subprocess.run(["git", "grep", "-lE", outside, "--", ".",
                             ":!tests/integration/fixtures"],
                            cwd=ROOT, capture_output=True, text=True)
    assert listed.returncode in (0, 1), listed.stderr  # 1: no match
    assert listed.stdout.split() == [], "cite docs/lifecycle.md instead"


def test_the_benchmarks_page_is_a_short_report() -> None:
    lines = len((ROOT / "docs" / "benchmarks.md").read_text().splitlines())
    assert lines <= 400, f"docs/benchmarks.md has {lines} lines: a report of the current figures, not a history"
