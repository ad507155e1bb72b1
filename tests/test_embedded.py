"""Embedded servers: they die with the process that started them, leave its Spark connection alone, and never
take another process's server for their own."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import weakref

import pytest
from helpers import process_alive, wait_for

from spark_jetstream.errors import JetStreamError
from spark_jetstream.testing import EmbeddedServer, free_port

pytestmark = pytest.mark.slow


def test_a_server_dies_with_the_process_that_started_it():
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from spark_jetstream.testing import EmbeddedServer\n"
            "server = EmbeddedServer(name='orphan').start()\n"
            "print(server.pid, flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = starter.stdout.readline()
        assert line, starter.stderr.read().decode()[-3000:]
        pid = int(line)
        assert process_alive(pid)
        assert os.readlink(f"/proc/{pid}/exe").endswith("nats-server"), "the server runs as itself, not under Python"
        os.kill(starter.pid, signal.SIGKILL)
        wait_for(lambda: not process_alive(pid), 10, "the server to die with the process that started it")
    finally:
        starter.kill()
        starter.wait(10)


def test_starting_a_server_leaves_this_threads_spark_connection_open(spark):
    """A server started from a helper thread must not close the py4j connection of this thread: a ``preexec_fn``
    did (the forked child's Python after-fork clean-up shut the shared socket), and a Spark call waiting on that
    connection then failed with ``ConnectionResetError``."""
    client = spark.sparkContext._gateway._gateway_client
    spark.sparkContext._jvm.java.lang.System.nanoTime()
    before = weakref.ref(client.get_thread_connection())  # a strong reference here would keep it open in the child
    for name in ("first", "second"):
        with EmbeddedServer(name=name):
            spark.sparkContext._jvm.java.lang.System.nanoTime()
    connection = before()
    assert connection is not None, "the thread's py4j connection was closed"
    assert client.get_thread_connection() is connection


def test_a_port_another_process_took_fails_the_start_even_where_its_holder_answers_the_health_check():
    """Ports are chosen before the server binds them, so another test process's server may take one first (seen
    once in a full run: a test connected to the other process's server). Here a stand-in answers 200 to everything
    on the monitoring port: the start must still fail, with the server's own log, not return."""

    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"status":"ok"}')

        def log_message(self, *args: object) -> None:
            pass

    holder = http.server.HTTPServer(("127.0.0.1", free_port()), Healthy)
    threading.Thread(target=holder.serve_forever, daemon=True).start()
    server = EmbeddedServer(name="late")
    server.monitor_port = holder.server_address[1]
    try:
        with pytest.raises(JetStreamError) as caught:
            server.start(10)
        assert str(caught.value).startswith("nats-server late exited at start-up:")
        assert "address already in use" in str(caught.value)
    finally:
        server.close()
        holder.shutdown()


def test_free_port_never_hands_out_a_port_twice_in_one_process():
    """A cluster's ports are all chosen before any server binds one: a port chosen twice (once for a server's clients,
    once for another's routes) made a server exit at start-up in CI. 2,000 choices, none bound: all different."""
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
