"""The connector from Spark Connect clients (Databricks serverless and standard access mode work so):
a real local Connect server started from the pip-installed PySpark, a client in its own process.

The server's Python workers run the connector; the client only sends plans (and, with
``spark.dataSource.register``, the data source class by reference).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from chispa import assert_df_equality
from helpers import ack_floors, expected_rows, stored, venv, wait_for

from spark_jetstream.testing import free_port

pytestmark = pytest.mark.slow

CLIENT = Path(__file__).parent / "jobs" / "connect_client.py"
SPARK_HOME = Path(os.environ["SPARK_HOME"])  # the suite's (conftest.spark_home)


class ConnectServer:
    """``start-connect-server.sh --wait`` on a free loopback port, its workers running ``python``."""

    def __init__(self, python: str, folder: Path) -> None:
        self.port = free_port()
        self.log = folder / "connect-server.log"
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "PYSPARK_PYTHON": python,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(folder),
            "SPARK_PID_DIR": str(folder),
        }
        command = [
            str(SPARK_HOME / "sbin" / "start-connect-server.sh"), "--wait", "--master", "local[2]",
            "--conf", f"spark.connect.grpc.binding.port={self.port}",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", "spark.ui.enabled=false",
        ]  # fmt: skip
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                env=env,
                cwd=folder,  # workers import the installed connector, not a checkout
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def remote(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120.0) -> None:
        def listening() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", self.port)) == 0

        def alive() -> None:
            assert self.process.poll() is None, self.log.read_text()[-3000:]

        wait_for(
            listening,
            timeout,
            lambda: f"a Spark Connect server on {self.port}: {self.log.read_text()[-3000:]}",
            poll=0.5,
            check=alive,
        )

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A Connect server whose workers have the connector (this environment's Python)."""
    server = ConnectServer(sys.executable, tmp_path_factory.mktemp("connect"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def run_client(server: ConnectServer, nats_url: str, stream, group: str, out: Path, target: str, *extra: str):
    return subprocess.run(
        [sys.executable, str(CLIENT), "--remote", server.remote, "--servers", nats_url, "--stream", stream.name,
         "--group", group, "--out", str(out), "--target", target, *extra],
        capture_output=True, text=True, timeout=400, cwd="/",
    )  # fmt: skip


@pytest.mark.parametrize("register", [False, True], ids=["auto-registered", "registered-by-the-client"])
def test_stream_batch_and_write_from_a_connect_client(
    register, connect_server, spark, nats_server, api, make_stream, tmp_path
):
    stream = make_stream(1500, partitions=3)
    group, target = f"{stream.group}-connect", f"copy{stream.name}"
    api.create_stream({"name": f"COPY_{stream.name}", "subjects": [target]})
    done = run_client(connect_server, nats_server.url, stream, group, tmp_path, target, *(["--register"] * register))
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["connect"].startswith("pyspark.sql.connect")

    assert sum(seen["batches"]) == 1500 and max(seen["batches"]) <= 400, seen["batches"]
    output = spark.read.parquet(str(tmp_path / "stream" / "out")).select("subject", "data", "seq", "partition")
    assert_df_equality(output, expected_rows(spark, stream), ignore_row_order=True, ignore_nullable=True)
    stream.group = group
    assert set(ack_floors(api, stream).values()) == {stream.last_seq}

    assert seen["batch_seqs"] == list(range(1, 51))
    copied = stored(api, f"COPY_{stream.name}")
    assert sorted(data for _, _, data, _ in copied) == sorted(stream.messages[seq][1] for seq in range(1, 51))


def test_a_connect_server_without_the_connector_says_data_source_not_found(nats_server, make_stream, tmp_path):
    """The server's workers run a Python with PySpark but without spark-jetstream."""
    bare = venv(f"pyspark-{pyspark.__version__}", f"pyspark=={pyspark.__version__}")
    server = ConnectServer(str(bare), tmp_path)
    try:
        server.wait_ready()
        stream = make_stream(10, partitions=2)
        started = time.monotonic()
        done = run_client(server, nats_server.url, stream, stream.group, tmp_path, "unused")
        assert done.returncode != 0
        assert "[DATA_SOURCE_NOT_FOUND] Failed to find the data source: jetstream." in done.stderr
        assert time.monotonic() - started < 60
    finally:
        server.stop()
