"""A streaming query rides through servers that fall silent: frozen (SIGSTOP keeps the sockets open, answers
nothing and sends no reset, as a paused VM does) or cut off by a partition (each server of ``isolated_cluster`` runs in
a network namespace of its own; its link goes down: packets dropped both ways, no reset). The same checks as the
crash faults of ``test_leader_change_query.py`` (``fault_query.ride_through``), and the query commits new rows
before the server is back; and a streaming write whose target's leader freezes stores every row once (decision
0026). Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import contextlib
import signal
import time

import pytest
from fault_query import (
    PARTITION,
    RATE,
    SETTLE,
    WAIT,
    Running,
    count_failed_tasks,
    create_stream,
    ride_through,
)

from spark_jetstream.client.connection import ConnectionOptions, connect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.testing import EmbeddedCluster, Publisher, commits, inject_fault, wait_healthy

pytestmark = pytest.mark.slow

FAULTS: dict[str, tuple[str, signal.Signals | str]] = {
    "stream-leader-sigstop": ("stream leader", signal.SIGSTOP),
    "query-connection-sigstop": ("query connection", signal.SIGSTOP),
    "task-connections-sigstop": ("task connections", signal.SIGSTOP),
    "stream-leader-partition": ("stream leader", PARTITION),
}
"""SIGSTOP freezes the server for ``FROZEN`` s (sockets open, nothing answered, no reset: a paused VM); a partition
(on a cluster whose servers each have a network namespace, ``isolated_cluster``) takes its link down for as long,
dropping its packets both ways: the query must go on without it, committing new rows before it is back."""


WRITE_FROZEN = 20.0
"""Seconds the write target's leader stays frozen: its election (4-8 s measured) and the writer's resend every 2 s
took rows 7.0-12.4 s to be stored again here; the test asserts they were before the thaw."""


@pytest.mark.parametrize("case", list(FAULTS))
def test_query_rides_through_a_silent_server(case, request, spark, nats_cluster, cluster_api, tmp_path):
    fault, how = FAULTS[case]
    if how == PARTITION:
        nats_cluster = request.getfixturevalue("isolated_cluster")
        cluster_api = JetStreamApi(connect(ConnectionOptions(servers=tuple(s.url for s in nats_cluster.servers))))
    ride_through(case, fault, how, spark, nats_cluster, cluster_api, tmp_path)


def test_a_streaming_write_rides_through_its_target_leader_freezing(
    spark, nats_cluster: EmbeddedCluster, cluster_api: JetStreamApi, tmp_path
):
    """A query that writes into a stream whose leader freezes (SIGSTOP for ``WRITE_FROZEN`` s): what the frozen leader
    swallowed is sent again with its msg ids, the new leader stores it, the query goes on (no restart, no failed
    task) and the target holds every source message exactly once; rows reach it while the old leader is frozen."""
    api = cluster_api
    source, target = "WQ_SOURCE", "WQ_TARGET"
    create_stream(api, source, "wqs.*")
    api.create_stream({"name": target, "subjects": ["wqt.>"], "num_replicas": 3, "storage": "file"})
    publisher = Publisher([s.url for s in nats_cluster.servers], RATE, prefix="wqs", record=True).start()
    checkpoint = tmp_path / "cp"
    query = (
        spark.readStream.format("jetstream").option("servers", nats_cluster.urls).option("stream", source)
        .option("maxMessagesPerTrigger", 2000).load().select("data")
        .writeStream.format("jetstream").option("servers", nats_cluster.urls).option("subject", "wqt.rows")
        .option("commitBucketReplicas", 3).option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second").start()
    )  # fmt: skip
    running = Running(spark, query)
    try:
        running.wait_for(lambda: len(commits(checkpoint)) >= 3, "three batches before the fault")
        assert wait_healthy(api, target, [], WAIT), "the target stream never had current replicas"
        time.sleep(SETTLE)
        stored_before = api.stream_info(target)["state"]["last_seq"]
        injected = inject_fault(
            "stream leader", api, nats_cluster, target, [], publisher, WRITE_FROZEN, WAIT, signal.SIGSTOP
        )
        running.wait_for(
            lambda: api.stream_info(target)["state"]["last_seq"] > stored_before + RATE, "rows stored after the freeze"
        )
        stored_again = time.time() - injected.at
        assert injected.watcher is not None
        assert injected.restarted is None or stored_again < injected.restarted, "rows were stored only after the thaw"
        running.wait_for(lambda: not injected.watcher.is_alive(), "the successor's election and the thaw")
        publisher.stop()
        last = api.stream_info(source)["state"]["last_seq"]
        running.wait_for(
            lambda: any(seq == last for _, seq in commits(checkpoint)),
            lambda: (
                f"a commit through seq {last}: commits {commits(checkpoint)[-3:]}, status {query.status}, "
                f"last progress {query.lastProgress}"
            ),
        )
        running.check()
        failed_tasks = count_failed_tasks(spark, query)
        query.stop()
        print(
            f"\nwrite target leader frozen: victim {injected.victim_name}, successor after "
            f"{injected.elected or -1:.1f} s, {RATE} rows/s stored into the target again {stored_again:.1f} s after "
            f"the freeze; thawed after {injected.restarted:.1f} s; failed tasks {failed_tasks}; {last} messages"
        )
        assert failed_tasks == 0
        assert publisher.messages is not None
        written = spark.read.format("jetstream").option("servers", nats_cluster.urls).option("stream", target).load()
        rows = sorted(bytes(row.data) for row in written.select("data").collect())
        assert rows == sorted(data for _, data in publisher.messages.values())
    finally:
        with contextlib.suppress(Exception):
            query.stop()
        publisher.stop(drain=0)
