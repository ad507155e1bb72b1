"""The JetStream API client rides through meta-leader changes on a real 3-node cluster.

While the meta leader (which also leads the stream and the consumer, the hardest placement) is
stopped with SIGTERM or crashed with SIGKILL and restarted on its store, a driver-side client keeps
asking for consumer info, stream info and UNPIN. Measured (docs/decisions/0010-api-through-leader-changes.md):
during the election the API times out, and right after the restart the recovering server answers UNPIN "stream
not found" / "consumer not found" for ~0.1 s. No call may fail, and each must answer within the
connection's API deadline with the right object.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from helpers import wait_for

from spark_jetstream.client.connection import ConnectionOptions, connect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import ApiError, ClusterUnavailableError, ConsumerNotFoundError, StreamNotFoundError
from spark_jetstream.groups.layout import member_consumer_config, partition_filters, partitioned_stream_config
from spark_jetstream.testing import EmbeddedCluster, EmbeddedServer

pytestmark = pytest.mark.slow

STREAM = "LDR"
CONSUMER = "g-0"
DOWN = 3.0
"""Seconds the meta leader stays down before it is restarted on its store."""
AFTER = 4.0
"""Seconds the client keeps calling after the restart (the recovering server's wrong answers come then)."""
_restarted: list[float] = []
"""When this module restarted a server."""


@dataclass(frozen=True)
class Call:
    name: str
    started: float
    took: float
    error: BaseException | None = None
    answer: Any = None


@pytest.fixture(scope="module")
def leader_api(nats_cluster: EmbeddedCluster) -> JetStreamApi:
    api = JetStreamApi(connect(ConnectionOptions(servers=tuple(s.url for s in nats_cluster.servers))))
    api.create_stream(partitioned_stream_config(STREAM, "ldr.*", 2, num_replicas=3))
    api.create_consumer(STREAM, member_consumer_config("g", "0", partition_filters([0])))
    return api


def _checked_calls(api: JetStreamApi) -> dict[str, tuple[Callable[[], Any], Callable[[Any], bool]]]:
    """Each call the client makes, with a check that it answered about the right object."""

    def unpin() -> None:
        api.conn.run(api.unpin(STREAM, CONSUMER))

    return {
        "consumer_info": (lambda: api.consumer_info(STREAM, CONSUMER), lambda i: i["name"] == CONSUMER),
        "stream_info": (lambda: api.stream_info(STREAM), lambda i: i["config"]["name"] == STREAM),
        "unpin": (unpin, lambda _: True),
    }


def _keep_calling(api: JetStreamApi, name: str, stop: threading.Event) -> Iterator[Call]:
    """Call one API method back to back until ``stop``; yield each call's outcome. Back to back, because
    the recovering server's wrong answers last only ~0.1 s."""
    call, right = _checked_calls(api)[name]
    while not stop.is_set():
        started = time.monotonic()
        try:
            answer = call()
            error = None if right(answer) else AssertionError(f"{name} answered about another object: {answer}")
        except Exception as exc:  # every failure is a finding: collected and asserted on below
            error = exc
        yield Call(name, started, time.monotonic() - started, error, None if error else answer)
        time.sleep(0.005)


def _lead_everything(api: JetStreamApi, cluster: EmbeddedCluster) -> EmbeddedServer:
    """Move the stream's and the consumer's leaders onto the meta leader, and return that server."""
    meta = cluster.wait_for_meta_leader()
    steps = (
        (("STREAM", "LEADER", "STEPDOWN", STREAM), lambda: api.stream_info(STREAM)),
        (("CONSUMER", "LEADER", "STEPDOWN", STREAM, CONSUMER), lambda: api.consumer_info(STREAM, CONSUMER)),
    )
    for tokens, info in steps:
        deadline = time.monotonic() + 30
        while info()["cluster"].get("leader") != meta:
            assert time.monotonic() < deadline, f"could not move the leader of {tokens} to {meta}"
            with contextlib.suppress(ApiError):  # a step-down while the group is still settling: ask again
                api.call(tokens, {"placement": {"preferred": meta}}, "leader step-down")
            time.sleep(1.0)
    return next(server for server in cluster.servers if server.name == meta)


def _wait_healthy(api: JetStreamApi) -> None:
    """Every replica of the stream and consumer current again (so the next fault starts from a whole cluster)."""

    def infos() -> tuple[dict, dict]:  # a server just restarted may answer before it has the group's cluster: not yet
        return api.stream_info(STREAM).get("cluster") or {}, api.consumer_info(STREAM, CONSUMER).get("cluster") or {}

    def healthy() -> bool:
        found = infos()
        return all(c.get("leader") and len(c.get("replicas") or []) == 2 for c in found) and all(
            r.get("current") for c in found for r in c["replicas"]
        )

    wait_for(healthy, 30, lambda: f"the cluster to be healthy again: {infos()}", poll=0.5)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_api_calls_ride_through_a_meta_leader_change(leader_api, nats_cluster, sig):
    api = leader_api
    _wait_healthy(api)
    victim = _lead_everything(api, nats_cluster)
    stop = threading.Event()
    calls: list[Call] = []
    callers = [
        threading.Thread(target=lambda n=name: calls.extend(_keep_calling(api, n, stop)), daemon=True)
        for name in _checked_calls(api)
    ]
    for caller in callers:
        caller.start()
    try:
        time.sleep(1.0)
        faulted = time.monotonic()
        assert victim.process is not None
        victim.process.send_signal(sig)
        victim.process.wait(15)
        victim.process = None
        time.sleep(DOWN)
        victim.start()
        _restarted.append(time.monotonic())
        time.sleep(AFTER)
    finally:
        stop.set()
        for caller in callers:
            caller.join(api.conn.options.request_timeout + 5)
    failures = [c for c in calls if c.error is not None]
    assert not [c for c in failures if isinstance(c.error, ConsumerNotFoundError | StreamNotFoundError)], failures
    assert not failures, failures
    during = [c for c in calls if c.started + c.took >= faulted]
    assert {c.name for c in during} == {"consumer_info", "stream_info", "unpin"}
    slowest = max(c.took for c in calls)
    assert slowest < api.conn.options.request_timeout, f"a call took {slowest:.1f}s, over the API deadline"
    # The fault was exercised: calls made after it were answered by new leaders. (A pause is no proof either way: a
    # SIGTERM'd server hands its leaderships over as it stops, and calls may never stall.)
    leaders = {
        (c.answer.get("cluster") or {}).get("leader") for c in during if c.name in ("stream_info", "consumer_info")
    }
    assert leaders - {victim.name, None}, (
        f"every answer named the old leader {victim.name}: the fault was not exercised"
    )


def test_a_missing_consumer_or_stream_still_fails_at_once(leader_api):
    """A real absence, on a cluster with a meta leader, is confirmed by one question to it, not waited out."""
    api = leader_api
    started = time.monotonic()
    with pytest.raises(ConsumerNotFoundError, match="Consumer 'nobody' on stream 'LDR' does not exist on nats://"):
        api.consumer_info(STREAM, "nobody")
    with pytest.raises(StreamNotFoundError, match="Stream 'NOPE' does not exist on nats://"):
        api.stream_info("NOPE")
    with pytest.raises(ConsumerNotFoundError, match="create the group's member consumers"):
        api.conn.run(api.unpin(STREAM, "nobody"))
    assert time.monotonic() - started < 2.5  # one question to the meta leader per call, not the 10 s deadline


def test_no_quorum_error_says_an_election_is_under_way(leader_api, nats_cluster):
    """With the meta leader and one more server down no leader can be elected: the call fails at the deadline
    saying so, as a ConnectError (never a not-found), and without advice to re-create anything. The survivor answers
    the connection, so the deadline is ``requestTimeout`` (15 s here, 60 s by default)."""
    api = JetStreamApi(connect(replace(leader_api.conn.options, request_timeout=15.0)))
    _wait_healthy(api)
    # A member whose raft node is younger than the server's lost-quorum interval (10 s) answers on its
    # own, as does a leader that has not yet noticed it lost its quorum: wait out the former, and take
    # down the meta leader and the consumer's leader, so the survivor is a settled follower of both.
    time.sleep(max(0.0, max(_restarted, default=0.0) + 12 - time.monotonic()))
    leaders = {nats_cluster.wait_for_meta_leader(), api.consumer_info(STREAM, CONSUMER)["cluster"]["leader"]}
    down = [server for server in nats_cluster.servers if server.name in leaders]
    down += [server for server in nats_cluster.servers if server not in down][: 2 - len(down)]
    for server in down:
        server.kill()
    try:
        started = time.monotonic()
        with pytest.raises(ClusterUnavailableError) as caught:
            api.consumer_info(STREAM, CONSUMER)
        took = time.monotonic() - started
    finally:
        for server in down:
            server.launch()
        for server in down:
            server.wait_ready()
    message = str(caught.value)
    assert message.startswith("The JetStream meta leader is being elected"), message
    assert "consumer 'g-0' on stream 'LDR'" in message
    assert "create" not in message
    assert 15 - 1.5 <= took < 15 + 2  # retried to the deadline, not beyond
    _wait_healthy(api)
