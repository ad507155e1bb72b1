"""The quick-start notebooks: the Jupyter one runs end to end, and the Databricks one cannot drift from it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from helpers import process_alive

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
JUPYTER = NOTEBOOKS / "quickstart.ipynb"
DATABRICKS = NOTEBOOKS / "quickstart_databricks.py"
DATABRICKS_HEADER = "# Databricks notebook source"
DATABRICKS_SEPARATOR = "\n# COMMAND ----------\n"
MAGIC = "# MAGIC"


def jupyter_cells() -> list[tuple[str, str]]:
    """(kind, source) of every cell of the Jupyter notebook, kind being ``code`` or ``markdown``."""
    nb = nbformat.read(JUPYTER, as_version=4)
    return [(cell.cell_type, cell.source.strip()) for cell in nb.cells]


def databricks_cells() -> list[tuple[str, str]]:
    """(kind, source) of every cell of the Databricks notebook: ``code``, ``markdown`` (``%md``) or ``magic``
    (another magic command such as ``%pip``); magic cells lose their ``# MAGIC`` prefixes."""
    text = DATABRICKS.read_text()
    assert text.startswith(DATABRICKS_HEADER + "\n"), f"{DATABRICKS.name} must start with {DATABRICKS_HEADER!r}"
    cells = []
    for chunk in text[len(DATABRICKS_HEADER) :].split(DATABRICKS_SEPARATOR):
        lines = chunk.strip().splitlines()
        if lines and all(line.startswith(MAGIC) for line in lines):
            body = [line[len(MAGIC) + 1 :] for line in lines]
            if body[0].strip() == "%md":
                cells.append(("markdown", "\n".join(body[1:]).strip()))
            else:
                cells.append(("magic", "\n".join(body).strip()))
        else:
            assert not any(line.startswith(MAGIC) for line in lines), f"a code cell mixes in magic lines:\n{chunk}"
            cells.append(("code", "\n".join(lines)))
    return cells


def after_config(cells: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The cells after the configuration cell (the first code cell), which both notebooks share."""
    first_code = next(index for index, (kind, _) in enumerate(cells) if kind == "code")
    return cells[first_code + 1 :]


def test_jupyter_notebook_is_valid_nbformat_4_without_outputs():
    nb = nbformat.read(JUPYTER, as_version=4)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, "commit the notebook without outputs"
            compile(cell.source, f"{JUPYTER.name} cell {cell.get('id')}", "exec")


def test_databricks_notebook_has_the_same_cells_as_the_jupyter_one():
    compile(DATABRICKS.read_text(), str(DATABRICKS), "exec")
    jupyter, databricks = jupyter_cells(), databricks_cells()

    jupyter_config = next(source for kind, source in jupyter if kind == "code")
    databricks_config = next(source for kind, source in databricks if kind == "code")
    assert 'os.environ.get("NATS_URL"' in jupyter_config and "EmbeddedServer" in jupyter_config
    assert "dbutils.widgets.text" in databricks_config and "EmbeddedServer" not in databricks_config

    shared_jupyter, shared_databricks = after_config(jupyter), after_config(databricks)
    assert [source for kind, source in shared_databricks if kind == "code"] == [
        source for kind, source in shared_jupyter if kind == "code"
    ], "the code cells after the configuration cell differ: change both notebooks"
    assert shared_databricks == shared_jupyter, "the cells after the configuration cell differ: change both notebooks"

    def headings(cells: list[tuple[str, str]]) -> list[str]:
        return [line for kind, source in cells if kind == "markdown" for line in source.splitlines() if line[:1] == "#"]

    assert headings(databricks) == headings(jupyter)


def test_the_notebooks_use_only_public_names():
    """What a notebook imports from the package is public (``spark_jetstream.__all__``, docs/reference/api.md), or
    the test harness ``spark_jetstream.testing`` (the Jupyter notebook's throwaway server)."""
    import spark_jetstream

    public = set(spark_jetstream.__all__)
    for cells in (jupyter_cells(), databricks_cells()):
        code = "\n".join(source for kind, source in cells if kind == "code")
        imports = re.findall(r"^from (spark_jetstream\S*) import (.+)$", code, re.M)
        assert imports, "no import of the package found"
        for module, names in imports:
            assert module in ("spark_jetstream", "spark_jetstream.testing"), module
            if module == "spark_jetstream":
                assert {name.strip() for name in names.split(",")} <= public, names
        assert set(re.findall(r"\bspark_jetstream\.(\w+)", code)) <= public | {"testing"}


def test_the_api_page_lists_every_public_name():
    """docs/reference/api.md has a row for each name in ``spark_jetstream.__all__``, and names no other of the
    package's top level."""
    import spark_jetstream

    page = (NOTEBOOKS.parent / "docs" / "reference" / "api.md").read_text()
    rows = {re.split(r"[(.]", name)[0] for name in re.findall(r"^\| `([\w.]+)(?:\(.*?\))?` \|", page, re.M)}
    assert rows == set(spark_jetstream.__all__)


def write_kernel_spec(directory: Path) -> str:
    """A kernel spec that runs ipykernel in this interpreter, found through ``JUPYTER_PATH``.

    ``kernel_name="python3"`` would also work after ``pip install '.[test]'`` (ipykernel ships that
    spec, and jupyter_client runs its ``python`` as ``sys.executable``), but a user-level
    ``python3`` spec pointing at another interpreter would win over it; this one cannot be shadowed.
    """
    name = "spark-jetstream-tests"
    spec = directory / "kernels" / name
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name, "language": "python"}))
    return name


def stdout_of(cell: nbformat.NotebookNode) -> str:
    outputs = cell.get("outputs", [])  # markdown cells have none
    return "".join(output.text for output in outputs if output.output_type == "stream" and output.name == "stdout")


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_jupyter_quickstart_runs_end_to_end(tmp_path, monkeypatch):
    """Runs every cell in a fresh ipykernel and checks what the cells print.

    ``NATS_URL`` is unset, so the notebook starts its own embedded nats-server, as it does for a
    first-time user on a laptop: that path (and the cleanup cell stopping the server) is what most
    readers run, while the Databricks path (an external server) is the same code after the
    configuration cell. It also keeps the notebook's streams, groups and KV buckets off the session
    server other tests use. The kernel runs in ``tmp_path``.
    """
    from nbclient import NotebookClient

    monkeypatch.delenv("NATS_URL", raising=False)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    kernel = write_kernel_spec(tmp_path / "jupyter")
    nb = nbformat.read(JUPYTER, as_version=4)
    client = NotebookClient(
        nb, kernel_name=kernel, timeout=300, allow_errors=False, resources={"metadata": {"path": str(tmp_path)}}
    )
    server_pid = None
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)  # raises CellExecutionError, with the cell and traceback, on an error
            started = re.search(r"started an embedded nats-server at \S+ \(pid (\d+)\)", stdout_of(cell))
            if started:
                server_pid = int(started.group(1))
        assert server_pid is not None, "the configuration cell did not start an embedded server"
        assert not process_alive(server_pid), "the cleanup cell left the embedded nats-server running"

    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    out = "\n".join(stdout_of(cell) for cell in nb.cells)

    published = re.search(r"published (\d+) orders, revenue ([\d.]+)", out)
    streamed = re.search(r"streamed (\d+) orders, revenue ([\d.]+)", out)
    assert published and streamed, out
    assert published.group(1) == "2000"
    assert streamed.groups() == published.groups(), "the streaming aggregate does not match what was published"
    assert "stream quickstart-orders holds 2000 messages" in out

    assert re.search(r"\|-- data: binary", out) and re.search(r"\|-- seq: long", out), "no row schema printed"
    per_partition = {int(p): int(n) for p, n in re.findall(r"^\|\s+(\d)\|\s+(\d+)\|$", out, re.M)}
    assert sorted(per_partition) == [0, 1, 2, 3] and sum(per_partition.values()) == 2000, out

    batches = [int(n) for n in re.findall(r"^batch \d+: (\d+) rows$", out, re.M)]
    assert sum(batches) == 2000 and max(batches) <= 1000, out
    assert re.search(r"^last batch: \d+ rows, up to seq 2000, 0 messages behind$", out, re.M), out

    floors = re.findall(r"^([ab])\s+spark-orders-[ab]\s+[\d,]+\s+(\d+)\s+(\d+)$", out, re.M)
    assert floors == [("a", "2000", "0"), ("b", "2000", "0")], out
    assert "checkpoint seq 2000; every ack floor equals it: True" in out

    large = re.search(r"quickstart-large-orders holds (\d+) large orders \(expected (\d+)\)", out)
    assert large and large.group(1) == large.group(2) and int(large.group(1)) > 0, out
    assert f"after publishing them again, quickstart-large-orders holds {large.group(1)} messages" in out
    # the bucket synced twice into a parquet table: the second run's changes merged into the first run's version
    assert re.search(r"^prices table v\d+: \{'apple': '1.25', 'kiwi': '0.50', 'plum': '2.10'\}$", out, re.M), out
    assert "embedded nats-server stopped" in out
