"""The code base stays ruff-clean (lint and format), its layers import in one direction, and no modules import
each other in a cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "spark_jetstream"

LAYERS = (
    "logs",
    "errors",
    "client",
    "options",
    "groups",
    "spark_compat",
    "worker_heap",
    "read",
    "streaming",
    "sink",
    "source",
    "testing",
    "tools",
)
"""The package's parts from the bottom up: each imports only its own layer and the ones before it. ``client`` is
the NATS and JetStream I/O, usable (and tested) without Spark or the option table; ``logs`` only says where
warnings go; ``testing`` (embedded servers and clusters, their faults, a Spark standalone cluster) sits above the
connector, so nothing a pipeline runs imports it; ``tools`` (CLI, demo, lag listener) sit on top, and nothing
imports them."""

HARNESS_NEEDS = ("logs", "errors", "client", "testing")
"""What the test harness (``testing``) imports of the package: the NATS client and the errors, never the Spark side
nor the connector it tests, so a test of the client alone can start servers."""

WITHOUT_SPARK = ("logs", "errors", "client", "options", "groups")
"""Layers that never import PySpark (nor ``spark_compat``): through the layering, nothing they import does either."""


@pytest.mark.slow  # runs ruff over the tree: a check of the code, not of a rule
def test_ruff_lint_and_format():
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def _layer(module: str) -> str:
    """``spark_jetstream.read.direct`` -> ``read``; the package's ``__init__`` counts as ``source``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "source"


def _imports(path: Path) -> set[str]:
    """What a module imports anywhere in its body (lazy and type-checking imports too): the package's own modules
    by their dotted name, anything else by its top-level name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: the package imports itself by absolute names"
            found.add(node.module or "")
    return {name if name.startswith("spark_jetstream") else name.split(".")[0] for name in found}


def _modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in PACKAGE.rglob("*.py")
    }


def test_every_module_belongs_to_a_layer():
    assert {_layer(module) for module in _modules()} <= set(LAYERS)


def test_layers_import_downward_only():
    upward = set()
    for module, path in _modules().items():
        rank = LAYERS.index(_layer(module))
        for name in _imports(path):
            if name.startswith("spark_jetstream.") and LAYERS.index(_layer(name)) > rank:
                upward.add((module, name))
    assert not upward, f"imports of a later layer (importer, imported): {sorted(upward)}"


def test_no_modules_import_each_other_in_a_cycle():
    """Type-checking and lazy imports count too: a cycle means two modules are one concept split in two."""
    modules = _modules()
    graph = {module: {n for n in _imports(path) if n in modules and n != module} for module, path in modules.items()}
    cycles, state, path = [], dict.fromkeys(graph, 0), []  # state: 0 unseen, 1 on the path, 2 done

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph[module]):
            if state[imported] == 1:
                cycles.append(" -> ".join([*path[path.index(imported) :], imported]))
            elif state[imported] == 0:
                visit(imported)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if state[module] == 0:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def test_the_lower_layers_never_import_spark():
    spark = {
        (module, name)
        for module, path in _modules().items()
        if _layer(module) in WITHOUT_SPARK
        for name in _imports(path)
        if name == "pyspark" or name == "spark_jetstream.spark_compat"
    }
    assert not spark, f"Spark imports below the read layer: {sorted(spark)}"


def test_the_harness_needs_only_the_client():
    beyond = {
        (module, name)
        for module, path in _modules().items()
        if _layer(module) == "testing"
        for name in _imports(path)
        if name == "pyspark" or (name.startswith("spark_jetstream.") and _layer(name) not in HARNESS_NEEDS)
    }
    assert not beyond, f"the harness imports more than the client: {sorted(beyond)}"


@pytest.mark.slow  # starts a Python process
def test_importing_the_connection_loads_no_spark():
    probe = (
        "import sys, spark_jetstream.client.connection, spark_jetstream.groups.admin\n"
        "print(sorted(m for m in sys.modules if m.startswith('pyspark')))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.slow  # starts a Python process
def test_looking_the_source_up_and_planning_import_no_client():
    """Spark imports the source module in every Python process it starts for a query (the look-up and
    schema at load(), the driver-side reader, the planner, each task), most of them fresh, before the
    first batch: they import the NATS client, the coordinator and pyarrow only when they use them."""
    probe = (
        "import pickle, sys\n"
        "import pyspark_jetstream\n"
        "source = pyspark_jetstream.DefaultSource({'servers': 'nats://localhost:4222', 'stream': 'S', 'group': 'g'})\n"
        "source.schema()\n"
        "reader = pickle.loads(pickle.dumps(source.streamReader(None)))\n"
        "heavy = ('nats', 'pyarrow', 'spark_jetstream.client.connection', 'spark_jetstream.streaming.coordinator')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
