"""``pull-reader``: the connector's pinned pull reader against the raw-protocol pull loop, outside Spark.

``--messages`` x 100 B on ``--pull-subjects`` interleaved subjects ``ev.k<i % n>`` of a stream partitioned
``--pull-partitions`` ways, one pinned member consumer per partition (group ``bench``); every member is drained
over the whole stream, one member after the other, by two contenders taking turns ``ROUNDS`` times on the same
consumers and data, best kept:

* ``connector``: ``spark_jetstream.streaming.pull.read_member`` with default ``PullSettings``, counting the rows of
  the Arrow record batches it yields (building them is part of its cost);
* ``raw pull loop``: ``raw_drain`` of ``bench/raw_pull.py`` in this process (no nats-py): one
  ``CONSUMER.MSG.NEXT`` request of 1,000 messages at a time, carrying the pin id once known, parsing each
  message's ack reply subject for its seq and pending count and nothing else; the UNPIN + RESET of each member
  before it is set-up, not timed.

Both must read exactly ``--messages`` messages; the target is the reader at least ``TARGET`` of the raw loop.
``--storage memory`` takes the server's file-store read cost (large for filtered consumers) out of both,
leaving mostly client cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from common import GROUP, STREAM, Cpu, heading, messages, print_rows, publish, rate
from raw_pull import run_baseline_sequential
from suite import SIZE, Measurement, Suite, Summary

from spark_jetstream.client.connection import Connection
from spark_jetstream.groups.layout import member_consumer_config, partition_filters
from spark_jetstream.read.ranges import MemberRange
from spark_jetstream.streaming.config import PullSettings
from spark_jetstream.streaming.pull import read_member

ROUNDS = 2
TARGET = 0.8


def run_connector(conn: Connection, consumers: list[str], last_seq: int) -> tuple[float, int]:
    """Drain every member with ``read_member``; return (seconds, messages)."""
    settings = PullSettings()
    total = 0
    began = time.perf_counter()
    for consumer in consumers:
        for batch in read_member(conn, MemberRange(STREAM, consumer, 0, last_seq), settings):
            total += batch.num_rows
    return time.perf_counter() - began, total


def run(suite: Suite) -> None:
    args = suite.args
    n, partitions, subjects = args.messages, args.pull_partitions, args.pull_subjects
    heading(
        f"pull-reader: {n:,} x {SIZE} B on {subjects:,} subjects, {partitions} partitions, one member each, "
        "outside Spark"
    )
    suite.fresh_stream(STREAM, "ev.*", partitions)
    api = suite.api
    consumers = [
        api.create_consumer(STREAM, member_consumer_config(GROUP, str(p), partition_filters([p])))["name"]
        for p in range(partitions)
    ]
    took = publish(suite.conn, "pull-reader", messages(n, SIZE, subjects), n)
    print(f"  published in {took:.1f} s", flush=True)
    last_seq = api.stream_info(STREAM)["state"]["last_seq"]
    contenders: dict[str, Callable[[], tuple[float, int]]] = {
        "raw pull loop (1 process)": lambda: run_baseline_sequential(suite.conn, suite.address, consumers),
        "connector read_member": lambda: run_connector(suite.conn, consumers, last_seq),
    }
    best: dict[str, tuple[float, Cpu]] = {}
    for round_ in range(1, ROUNDS + 1):
        for name, contender in contenders.items():
            watch = Measurement(suite, f"pull-reader: {name}, round {round_}", None)
            seconds, count = contender()
            cpu = watch.stop()
            if count != n:
                raise SystemExit(f"FAILED: {name} round {round_} read {count:,} of {n:,}")
            print(f"  round {round_}, {name}: {rate(count, seconds):,.0f} msgs/s", flush=True)
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, cpu)
    print_rows([(name, n, seconds, None, cpu) for name, (seconds, cpu) in best.items()])
    for name, (_, cpu) in best.items():  # the client's CPU is what a reader costs where the server is elsewhere
        client, server = (cpu.seconds[kind] / n * 1e6 for kind in ("this process", "nats-server"))
        print(f"  {name}: client CPU {client:.2f} us/msg, nats-server {server:.2f} us/msg")
    raw_name, connector_name = contenders
    raw, connector = rate(n, best[raw_name][0]), rate(n, best[connector_name][0])
    suite.summary.append(
        Summary(
            f"pull reader, {partitions} members: connector vs raw pull, no Spark (msgs/s)",
            connector,
            raw,
            "msgs/s",
            f">= {TARGET:g}x",
            connector / raw >= TARGET,
        )
    )
    api.delete_stream(STREAM)
