"""Faults on an ``EmbeddedCluster`` while a query runs: kill or freeze the server that leads a stream, a consumer or
the JetStream meta group (``inject_fault``) and restart or thaw it on its store, a publisher that records what was
stored (``Publisher``), the leaders found and moved, and the commit times of a streaming checkpoint (``commits``).
The leader-change tests and benchmarks use it; so can a test of your own pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jetstream.client.connection_options import ConnectionOptions
from spark_jetstream.client.nats_client import open_client
from spark_jetstream.errors import JetStreamError
from spark_jetstream.testing.cluster import EmbeddedCluster, meta_leader
from spark_jetstream.testing.server import EmbeddedServer

if TYPE_CHECKING:
    from spark_jetstream.client.jsapi import JetStreamApi


class Publisher:
    """Publishes ``rate`` msg/s to ``<prefix>.k<n>`` from a thread of its own, each message retried until its
    PubAck comes (a ``Nats-Msg-Id`` makes a retry of a stored message a duplicate), and tracks the last acked
    seq and when each PubAck came (``acks``: (time.time(), seq)); with ``record``, also every acked message
    (``messages``: seq -> (subject, payload)). ``rate`` may be changed while it runs (a burst). ``stop()`` ends the
    publishing and waits up to ``drain`` seconds for the messages still unacknowledged."""

    def __init__(self, servers: list[str], rate: int, prefix: str = "lead", record: bool = False) -> None:
        self.servers = servers
        self.rate = rate
        self.prefix = prefix
        self.last_seq = 0
        self.published = 0
        self.retries = 0
        self.acks: list[tuple[float, int]] = []
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
            self.acks.append((time.time(), ack.seq))
            self.last_seq = max(self.last_seq, ack.seq)
            self.published += 1
            if self.messages is not None:
                self.messages[ack.seq] = (subject, payload)
            return

    async def _run(self) -> None:
        # The connector's client: it leaves a frozen or cut-off server within 3 s and aborts that socket (nats-py's
        # own closes it gracefully, which waits for a partitioned server to take what is buffered: measured, the
        # publisher then stalled until the partition healed, so "writable again" measured the publisher).
        options = ConnectionOptions(servers=tuple(self.servers))
        client = await open_client(options, None, "leader-fault publisher")
        js = client.jetstream()
        tick, index = 0.02, 0
        pending: set[asyncio.Task[None]] = set()
        next_tick = time.monotonic()
        while not self._stop.is_set():
            for _ in range(max(1, round(self.rate * tick))):  # the rate as it is now: it may change meanwhile
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


FAULT_SIGNALS = {
    "stream leader": signal.SIGKILL,
    "consumer leader": signal.SIGKILL,
    "meta leader": signal.SIGTERM,
    "query connection": signal.SIGSTOP,
    "task connections": signal.SIGSTOP,
}
"""The signal each fault of ``inject_fault`` sends by default. ``SIGSTOP`` freezes the server (sockets open, nothing
answered, no reset: a paused VM, a silent partition); ``down`` s later ``SIGCONT`` thaws it."""

CONNECTION_NAMES = {"query connection": "spark-jetstream query", "task connections": "spark-jetstream task"}
"""Faults aimed at the server a kind of the connector's connections is on: the streaming reader's (the query), the
tasks' (``connection.process_role``)."""


def connected_server(cluster: EmbeddedCluster, name: str) -> EmbeddedServer | None:
    """The server holding the most client connections named ``name`` (its ``/connz``), None: none anywhere."""
    counts = {}
    for server in cluster.servers:
        try:
            url = f"{server.monitor}/connz?limit=1024"
            with urllib.request.urlopen(url, timeout=2) as response:
                connections = json.load(response).get("connections") or []
        except OSError:
            continue
        counts[server.name] = sum(1 for c in connections if c.get("name") == name)
    busiest = max(counts, key=lambda n: counts[n], default=None)
    return next(s for s in cluster.servers if s.name == busiest) if busiest and counts[busiest] else None


@dataclass
class InjectedFault:
    """A fault sent at ``at`` (``time.time()``) when the publisher's last seq was ``last_seq``; ``watcher``
    sets ``elected`` (seconds from the fault until the successor became leader: its ``leader_since``, or for the
    meta leader when it answered) and ``restarted`` (seconds until the victim, once its old process ended, was
    started again on its store), and ends once both happened, the restart failed (``failed``) or ``watch`` s
    passed."""

    fault: str
    at: float
    last_seq: int
    victim: EmbeddedServer | None = None
    led: str = "-"
    watcher: threading.Thread | None = None
    elected: float | None = None
    restarted: float | None = None
    failed: str | None = None  # why the watcher could not restart the victim

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
    partition: bool = False,
) -> InjectedFault:
    """Inject ``fault`` (``none``, ``stream leader``, ``consumer leader``: of ``consumers[0]``, moved off the
    stream and meta leaders first, so the fault is the consumer's alone, ``meta leader``, or the server of a kind of
    connection, ``CONNECTION_NAMES``) by sending ``sig`` (default ``FAULT_SIGNALS[fault]``) to the server holding
    that leadership or connection; a watcher thread records when a successor answered (the stream or consumer info
    names another leader, or a surviving server's ``/jsz`` names a new meta leader; the time is the successor's
    ``leader_since``; a connection's server has none) and restarts the victim on its store ``down`` s after the
    fault, or thaws it (``SIGCONT``) after a ``SIGSTOP``. With ``partition`` (a cluster made ``isolated``) the
    victim is cut off from the cluster and every client instead of signalled, and healed ``down`` s later."""
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
    elif fault in CONNECTION_NAMES:
        found = connected_server(cluster, CONNECTION_NAMES[fault])
        if found is None:
            raise JetStreamError(f"no connection named {CONNECTION_NAMES[fault]!r} on any server")
        victim = found
    else:
        victim = by_name[meta]
    led = leads(api, cluster, stream, consumers, victim.name)
    injected = InjectedFault(fault, time.time(), publisher.last_seq, victim, led)
    assert victim.process is not None
    heal: Callable[[], None] | None = None  # ends a fault that leaves the process as it is (a freeze, a partition)
    if partition:
        cluster.partition(victim)
        heal = partial(cluster.partition, victim, cut=False)
    else:
        sig = sig or FAULT_SIGNALS[fault]
        if sig == signal.SIGSTOP:
            victim.freeze()
            heal = victim.thaw
        else:
            victim.process.send_signal(sig)

    def successor() -> tuple[str | None, float]:
        """The leader now, and since when (its ``leader_since``, else now)."""
        survivors = [s for s in cluster.servers if s is not victim]
        if fault == "meta leader":
            return meta_leader(survivors), time.time()
        info = api.stream_info(stream) if fault == "stream leader" else api.consumer_info(stream, consumers[0])
        since = info["cluster"].get("leader_since")
        return info["cluster"].get("leader"), datetime.fromisoformat(since).timestamp() if since else time.time()

    def follow() -> None:
        at = injected.at
        while time.time() < at + watch:
            if heal is not None and injected.restarted is None and time.time() >= at + down:
                heal()
                injected.restarted = time.time() - at
            if fault in CONNECTION_NAMES:  # no leadership to hand over
                if injected.restarted is not None:
                    return
            elif injected.elected is None:
                try:
                    leader, since = successor()
                except Exception:
                    leader = None
                if leader and leader != victim.name:
                    injected.elected = since - at
            if victim.process is not None and victim.process.poll() is not None:
                victim.process = None
            if heal is None and victim.process is None and time.time() >= at + down:
                try:
                    victim.start(wait=watch)  # a store recovered under load can take long
                except JetStreamError as exc:  # this thread's exception would reach no one
                    injected.failed = f"the victim's restart failed: {exc}"
                    return
                injected.restarted = time.time() - at
            if injected.elected is not None and injected.restarted is not None:  # not the old process: after a
                return  # SIGTERM it may still be shutting down when the successor is elected
            time.sleep(0.1)

    injected.watcher = threading.Thread(target=follow, name="fault-watch", daemon=True)
    injected.watcher.start()
    return injected


STALL = 0.5
"""Seconds without a PubAck that count as the stream not taking writes (the publisher sends every 20 ms)."""


def writable_again(publisher: Publisher, injected: InjectedFault, window: float = 60.0) -> tuple[float, int] | None:
    """When the stream took writes again after the fault, and the seq stored then: the first PubAck after the
    longest silence of more than ``STALL`` s between PubAcks from the fault on, or without such a stall the first
    PubAck after the fault. None: no PubAck since the fault."""
    times = sorted((t, seq) for t, seq in list(publisher.acks) if injected.at < t <= injected.at + window)
    if not times:
        return None
    starts = [injected.at, *(t for t, _ in times[:-1])]
    gaps = [(later[0] - earlier, later) for earlier, later in zip(starts, times, strict=True)]
    longest, after = max(gaps, key=lambda gap: gap[0])
    return after if longest > STALL else times[0]


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
