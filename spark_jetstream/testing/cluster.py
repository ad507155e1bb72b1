"""A JetStream cluster of embedded servers routed together on loopback, or each server in a network namespace of its
own (``IsolatedNetwork``) so that a test can cut one off from the others and from every client, silently, and heal
it."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from spark_jetstream.client import retry
from spark_jetstream.client.connection import Connection, ConnectionOptions, open_connection
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import ApiError, JetStreamError
from spark_jetstream.testing.server import IP_BINARY, EmbeddedServer, free_port


class EmbeddedCluster:
    """A JetStream cluster of ``size`` servers routed together on loopback."""

    def __init__(self, size: int = 3, name: str = "sjc", isolated: bool = False) -> None:
        """``isolated``: each server in a network namespace of its own (``IsolatedNetwork``; root only), so that
        ``partition`` can cut one off."""
        self.network = IsolatedNetwork(size) if isolated else None
        hosts = self.network.hosts if self.network else ["127.0.0.1"] * size
        cluster_ports = [free_port() for _ in range(size)]
        routes = [f"nats-route://{host}:{port}" for host, port in zip(hosts, cluster_ports, strict=True)]
        self.servers = [
            EmbeddedServer(
                {"cluster": {"name": name, "host": host, "port": port, "routes": routes}},
                name=f"{name}-{index}",
                host=host,
                netns=self.network.namespaces[index] if self.network else None,
            )
            for index, (host, port) in enumerate(zip(hosts, cluster_ports, strict=True))
        ]

    @property
    def urls(self) -> str:
        return ",".join(server.url for server in self.servers)

    def start(self, wait: float = 60.0) -> EmbeddedCluster:
        """Launch every server and wait, up to ``wait`` s for each step, until a meta leader is elected and the cluster
        places a replicated stream that every server routes publishes to (``_wait_for_placement``). A cluster with a
        2.10 server took 0.3-12.3 s for the meta leader on 2 busy cores, and once over 30 s in a full test run."""
        try:
            for server in self.servers:  # peers must all be launched before any reports healthy
                server.launch()
            for server in self.servers:
                server.wait_ready(wait)
            self.wait_for_meta_leader(wait)
            self._wait_for_placement(wait)
        except BaseException:
            self.close()  # the servers, and an isolated network's namespaces
            raise
        return self

    def wait_for_meta_leader(self, wait: float = 30.0) -> str:
        """Wait until the JetStream meta group has elected a leader (API calls fail before that)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if leader := meta_leader(self.servers):
                return leader
            time.sleep(0.1)
        raise JetStreamError(f"JetStream cluster elected no meta leader within {wait:g}s.")

    def _wait_for_placement(self, wait: float) -> None:
        """Place a probe stream on every server and publish to it through each: a meta leader, even one seeing every
        peer current, may not have a peer's JetStream statistics yet ("no suitable peers for placement, peer
        offline"), and a server may not know the new leader's interest yet (503, no responders): both failed a CI
        run's first tests. Its connections are its own: a caller's cached one for the same servers (a cluster started
        again) stays."""
        servers = tuple(server.url for server in self.servers)
        config = {"name": "SJC_PROBE", "subjects": ["sjc.probe"], "num_replicas": len(self.servers)}
        deadline = time.monotonic() + wait
        with _own_connection(ConnectionOptions(servers=servers, request_timeout=wait)) as conn:
            api = JetStreamApi(conn)
            while True:
                try:
                    api.create_stream(config)
                    break
                except ApiError as exc:
                    if time.monotonic() > deadline:
                        raise JetStreamError(f"The cluster placed no probe stream within {wait:g}s: {exc}") from exc
                    time.sleep(0.1)
            for url in servers:
                with _own_connection(ConnectionOptions(servers=(url,), request_timeout=wait)) as one:
                    one.run(retry.request(one, "sjc.probe", b"probe"), timeout=wait + 5)
            api.delete_stream("SJC_PROBE")

    def partition(self, server: EmbeddedServer, cut: bool = True) -> None:
        """Cut ``server`` off from the other servers and every client (``cut=False``: heal it): its link goes down,
        so packets are dropped both ways and nobody gets a reset, as in a network partition."""
        if self.network is None:
            raise JetStreamError("partition needs a cluster made with isolated=True")
        self.network.cut(self.servers.index(server), cut)

    def cut_between(self, one: EmbeddedServer, other: EmbeddedServer, cut: bool = True) -> None:
        """Cut two servers off from each other only (``cut=False``: heal it): each still reaches the third and every
        client, so one can lead a consumer while its replica of the stream falls behind the stream's leader."""
        if self.network is None:
            raise JetStreamError("cut_between needs a cluster made with isolated=True")
        self.network.cut_between(self.servers.index(one), self.servers.index(other), cut)

    def close(self) -> None:
        for server in self.servers:
            server.close()
        if self.network is not None:
            self.network.close()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


_MADE = itertools.count()
"""Isolated networks this process made (their names' second part)."""


class IsolatedNetwork:
    """A bridge of its own with ``size`` network namespaces on it, each reached from this one at its own address
    (``hosts``, in 10.77.<n>.0/24). ``cut`` takes a namespace's link down and up again: a partition that drops
    packets both ways and sends no reset. Needs root and iproute2; names carry this process's id and a count of its
    networks, so parallel test processes do not meet, nor one network with the last one's veth pairs, which live on
    while anything still holds their namespace (a closing socket); ``close`` removes everything."""

    def __init__(self, size: int) -> None:
        tag = f"{os.getpid() % 100_000:05d}{next(_MADE) % 100:02d}"
        taken = subprocess.run([IP_BINARY, "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
        subnet = next(n for n in range(os.getpid() % 200 + 1, 256) if f" 10.77.{n}." not in taken)
        self.bridge = f"sjb{tag}"
        self.links = [f"sjv{tag}{index}" for index in range(size)]
        self.namespaces = [f"sjn{tag}-{index}" for index in range(size)]
        self.hosts = [f"10.77.{subnet}.{11 + index}" for index in range(size)]
        try:
            self._ip("link", "add", self.bridge, "type", "bridge")
            self._ip("addr", "add", f"10.77.{subnet}.1/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            for link, namespace, host in zip(self.links, self.namespaces, self.hosts, strict=True):
                peer = link.replace("sjv", "sjp")
                self._ip("netns", "add", namespace)
                self._ip("link", "add", link, "type", "veth", "peer", "name", peer)
                self._ip("link", "set", peer, "netns", namespace)
                inside = ("-n", namespace)
                self._ip(*inside, "link", "set", peer, "name", "eth0")
                self._ip(*inside, "addr", "add", f"{host}/24", "dev", "eth0")
                self._ip(*inside, "link", "set", "eth0", "up")
                self._ip(*inside, "link", "set", "lo", "up")
                self._ip("link", "set", link, "master", self.bridge)
                self._ip("link", "set", link, "up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _ip(*args: str) -> None:
        done = subprocess.run([IP_BINARY, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise JetStreamError(f"`ip {' '.join(args)}` failed (an isolated network needs root): {done.stderr}")

    def cut(self, index: int, cut: bool = True) -> None:
        self._ip("link", "set", self.links[index], "down" if cut else "up")

    def cut_between(self, one: int, other: int, cut: bool = True) -> None:
        """Drop what two namespaces send each other (a blackhole route in each to the other), nothing else."""
        for here, there in ((one, other), (other, one)):
            action = "add" if cut else "del"
            self._ip("-n", self.namespaces[here], "route", action, "blackhole", f"{self.hosts[there]}/32")

    def close(self) -> None:
        for namespace in self.namespaces:
            subprocess.run([IP_BINARY, "netns", "del", namespace], capture_output=True)
        subprocess.run([IP_BINARY, "link", "del", self.bridge], capture_output=True)


@contextmanager
def _own_connection(options: ConnectionOptions) -> Iterator[Connection]:
    """A connection of its own for ``options``, closed after: not the process's cached one (``connect``)."""
    conn = open_connection(options, None, "spark-jetstream cluster probe")
    try:
        yield conn
    finally:
        conn.run(conn.client.close(), timeout=5)


def meta_leader(servers: Iterable[EmbeddedServer]) -> str | None:
    """The JetStream meta leader as the given servers' ``/jsz`` reports it (None: none of them names one)."""
    for server in servers:
        try:
            with urllib.request.urlopen(f"{server.monitor}/jsz", timeout=1) as response:
                leader = json.load(response).get("meta_cluster", {}).get("leader")
        except OSError:
            continue
        if leader:
            return leader
    return None
