"""The code base stays ruff-clean (lint and format), and its layers import in one direction."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "spark_jetstream"

CLIENT_LAYER = ("connection", "protocol", "jsapi", "errors", "publish")
"""The client layer: NATS and JetStream I/O, usable (and tested) without Spark or the option table."""

NOT_IN_CLIENT_LAYER = ("pyspark", "spark_compat", "options", "config")
"""What the client layer never imports, directly or through another module of the package (``options`` stands
for its parts too: ``option_definitions``, ``option_checks``, ...)."""


def _forbidden(name: str) -> bool:
    return name in NOT_IN_CLIENT_LAYER or name.startswith("option_")


KNOWN_VIOLATIONS: set[tuple[str, str]] = set()
"""Imports that break the rule and are still to be moved: none left (issue 18 moved the last one)."""


@pytest.mark.slow  # runs ruff over the tree: a check of the code, not of a rule
def test_ruff_lint_and_format():
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def _imports(module: str) -> set[str]:
    """What ``spark_jetstream.<module>`` imports anywhere in its body (lazy imports too): the package's own
    modules by their short name, anything else by its top-level name."""
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names = [node.module or ""]
            elif node.module:  # from .x import y
                names = [f"spark_jetstream.{node.module}"]
            else:  # from . import x
                names = [f"spark_jetstream.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found.add(parts[1] if parts[0] == "spark_jetstream" and len(parts) > 1 else parts[0])
    return found


def _reachable(module: str) -> dict[str, str]:
    """Every module ``module`` imports directly or through the package's modules -> the first one that does
    (not looking past a forbidden one: the violation is importing it)."""
    seen: dict[str, str] = {}
    todo = [module]
    while todo:
        current = todo.pop()
        for name in _imports(current):
            if name not in seen:
                seen[name] = current
                if (PACKAGE / f"{name}.py").exists() and not _forbidden(name):
                    todo.append(name)
    return seen


def test_the_client_layer_never_imports_spark_or_the_options():
    violations = set()
    for module in CLIENT_LAYER:
        reached = _reachable(module)
        violations |= {(importer, name) for name, importer in reached.items() if _forbidden(name)}
    assert violations == KNOWN_VIOLATIONS, (
        f"client-layer imports (importer, imported): {sorted(violations)}, known: {sorted(KNOWN_VIOLATIONS)}"
    )


@pytest.mark.slow  # starts a Python process
def test_importing_the_connection_loads_no_spark():
    probe = "import sys, spark_jetstream.connection; print(sorted(m for m in sys.modules if m.startswith('pyspark')))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout
