"""The spark-submit example (``examples/exactly_once``) run as its README says: the streams created by its setup
script, orders published, the job submitted with ``spark-submit --master local[2]``; then more orders and the job
submitted again on the same checkpoint. The target stream holds every invoice once, and the group's ack floors
stand at the last order read."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from helpers import stored

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.testing import EmbeddedServer

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "exactly_once"
SPARK_SUBMIT = Path(importlib.util.find_spec("pyspark").origin).parent / "bin" / "spark-submit"
COUNTRIES = ("DE", "FR", "NL", "PL", "US")


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    """A server of the test's own: the example's stream names are fixed."""
    server = EmbeddedServer(name="example").start()
    yield server
    disconnect(ConnectionOptions(servers=(server.url,)))
    server.close()


def run(command: list[str], timeout: float) -> str:
    """``command`` in a process group of its own (killed whole on a timeout); its output, which must end well."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        output, _ = child.communicate()
        pytest.fail(f"{command[:2]} timed out:\n{output.decode(errors='replace')[-5000:]}")
    text = output.decode(errors="replace")
    assert child.returncode == 0, text[-5000:]
    return text


def setup(url: str, *args: str) -> str:
    return run([sys.executable, str(EXAMPLE / "setup_streams.py"), *args, "--servers", url], timeout=60)


def submit(url: str, checkpoint: Path) -> None:
    """The README's local command line (with the Spark UI off, as the other tests run Spark)."""
    command = [str(SPARK_SUBMIT), "--master", "local[2]", "--conf", "spark.ui.enabled=false"]
    run([*command, str(EXAMPLE / "job.py"), "--servers", url, "--checkpoint", str(checkpoint), "--available-now"], 180)


def expected(last: int) -> list[tuple[str, int, str, Decimal]]:
    """The invoices of orders 1 to ``last``: (subject, order id, customer, amount), as the setup script's orders
    make them (computed here again, not imported)."""
    rows = []
    for order_id in range(1, last + 1):
        quantity, price = 1 + order_id % 4, Decimal(str(round(1 + (order_id * 37) % 9900 / 100, 2)))
        subject = f"invoices.{COUNTRIES[order_id % 5]}"
        rows.append((subject, order_id, f"c{order_id % 17:02d}", price * quantity))
    return rows


def invoices(api: JetStreamApi) -> tuple[list[tuple[str, int, str, Decimal]], set[str]]:
    """The invoices INVOICES holds, every copy, sorted by order id; and the subjects of its other messages."""
    rows, others = [], set()
    for _, subject, data, _ in stored(api, "INVOICES"):
        if not subject.startswith("invoices."):
            others.add(subject)
            continue
        invoice = json.loads(data, parse_float=Decimal)
        rows.append((subject, invoice["order_id"], invoice["customer"], Decimal(invoice["amount"])))
    return sorted(rows, key=lambda row: row[1]), others


@pytest.mark.timeout(420)
def test_the_exactly_once_example_writes_every_invoice_once_across_a_restart(server, tmp_path):
    url, checkpoint = server.url, tmp_path / "checkpoint"
    api = JetStreamApi(connect(ConnectionOptions(servers=(url,))))
    created = setup(url, "create")
    assert "stream ORDERS: subjects orders.*" in created and "invoices_progress.>" in created, created
    target = api.stream_info("INVOICES")["config"]
    assert target["allow_atomic"] and target["allow_rollup_hdrs"]
    setup(url, "publish", "--first", "1", "--count", "300")

    submit(url, checkpoint)
    rows, others = invoices(api)
    assert rows == expected(300)
    assert others and all(subject.startswith("invoices_progress.sjp-") for subject in others), others

    setup(url, "publish", "--first", "251", "--count", "150")  # 251-300 again: stored once (msg ids)
    assert api.stream_info("ORDERS")["state"]["messages"] == 400
    submit(url, checkpoint)  # a restart on the same checkpoint
    rows, _ = invoices(api)
    assert rows == expected(400), "an invoice is missing or was written twice"
    floors = {
        name: api.consumer_info("ORDERS", name)["ack_floor"]["stream_seq"] for name in api.consumer_names("ORDERS")
    }
    assert floors and all(name.startswith("invoicing-") for name in floors), floors
    assert set(floors.values()) == {400}, floors
