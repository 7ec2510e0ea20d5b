"""The layout holds: a short top level, a pure core that reaches only itself, tools apart.

import-linter (make lint) keeps the layers and forbids I/O in the pure modules; these checks
keep what it cannot say: that a pure module imports only other pure ones, and that the
benchmarks and the harness never lean on the test suite.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
MAX_TOP_LEVEL_MODULES = 10


def pure_modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["name"] == "Pure modules do no I/O"]
    return list(contract["source_modules"])


def is_pure(module: str, pure: list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in pure)


def test_pure_modules_import_only_pure_modules_of_the_gateway() -> None:
    graph = grimp.build_graph("gateway", "simulator")
    pure = pure_modules()
    reached = {
        module: sorted(
            imported
            for imported in graph.find_modules_directly_imported_by(module)
            if imported.startswith("gateway.") and not is_pure(imported, pure)
        )
        for module in graph.modules
        if is_pure(module, pure)
    }
    assert {m: found for m, found in reached.items() if found} == {}


def test_the_gateway_keeps_at_most_ten_modules_at_its_top_level() -> None:
    modules = sorted(p.name for p in (ROOT / "gateway").glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def imported_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_benchmarks_and_the_harness_import_nothing_from_the_tests() -> None:
    suite = {"tests", "conftest"} | {p.stem for p in (ROOT / "tests").glob("*.py")}
    leaning = {
        str(path.relative_to(ROOT)): sorted(imported_names(path) & suite)
        for folder in ("bench", "harness", "gateway", "simulator", "lab")
        for path in (ROOT / folder).rglob("*.py")
    }
    assert {path: found for path, found in leaning.items() if found} == {}
