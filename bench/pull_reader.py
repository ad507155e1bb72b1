"""Benchmark: the connector's pinned pull reader against a raw-protocol pull baseline.

One run starts a real nats-server (``EmbeddedServer``, file store in a temp dir), publishes
``--messages`` messages of ``--size`` bytes to ``--subjects`` (1,024) interleaved subjects ``ev.k<i % n>`` of a
stream partitioned ``--partitions`` ways, creates one pinned member consumer per partition
(group ``bench``), and then drains every member over the whole stream, one member after the
other, with two contenders taking turns ``--repeat`` times on the same consumers and data:

* ``connector``: ``spark_jetstream.streaming.pull.read_member`` with default ``PullSettings``, counting the
  rows of the Arrow record batches it yields (building them is part of its cost);
* ``baseline``: the simplest raw NATS protocol pull loop on a blocking TCP socket (no nats-py):
  one ``CONSUMER.MSG.NEXT`` request of 1,000 messages at a time, carrying the pin id once known,
  parsing each message's ack reply subject for its seq and pending count and nothing else.

Each contender is timed end to end over all members; the baseline's per-member consumer reset
(UNPIN + RESET through the connector's API) is set-up and not timed. Both must read exactly
``--messages`` messages. It prints a table and the ratio connector/baseline msgs/s (best run of
each); the target is a ratio of at least 0.8.

The stream uses file storage by default; ``--storage memory`` takes the server's file-store
read cost (large for filtered consumers) out of both contenders, leaving mostly client cost.

Run it from the repository root::

    python bench/pull_reader.py --messages 1000000
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from common import GROUP, STREAM, SUBJECTS, messages, server_version
from raw_pull import raw_drain

from spark_jetstream.client.connection import Connection, ConnectionOptions, close_all, connect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import member_consumer_config, partition_filters, partitioned_stream_config
from spark_jetstream.read.ranges import MemberRange
from spark_jetstream.streaming.pull import PullSettings, read_member
from spark_jetstream.tools.embedded import EmbeddedServer

TARGET_RATIO = 0.8


@dataclass(frozen=True)
class Run:
    contender: str
    index: int
    messages: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


# -- set-up ------------------------------------------------------------------------------------


def setup(api: JetStreamApi, partitions: int, storage: str) -> list[str]:
    """Create the partitioned stream and one member consumer per partition; return their names."""
    api.create_stream(partitioned_stream_config(STREAM, "ev.*", partitions, storage=storage))
    consumers = []
    for p in range(partitions):
        config = member_consumer_config(GROUP, str(p), partition_filters([p]))
        consumers.append(api.create_consumer(STREAM, config)["name"])
    return consumers


# -- the raw baseline --------------------------------------------------------------------------


def run_baseline(
    conn: Connection, api: JetStreamApi, address: tuple[str, int], consumers: list[str]
) -> tuple[float, int]:
    """Drain every member with the raw loop; return (seconds, messages), resets not timed."""
    seconds = 0.0
    total = 0
    for consumer in consumers:
        conn.run(api.unpin(STREAM, consumer))
        pending = conn.run(api.reset(STREAM, consumer, 1))["num_pending"]
        if pending == 0:
            continue
        began = time.perf_counter()
        total += raw_drain(address, STREAM, consumer)
        seconds += time.perf_counter() - began
    return seconds, total


# -- the connector -----------------------------------------------------------------------------


def run_connector(conn: Connection, consumers: list[str], last_seq: int) -> tuple[float, int]:
    """Drain every member with ``read_member``; return (seconds, messages)."""
    settings = PullSettings()
    total = 0
    began = time.perf_counter()
    for consumer in consumers:
        for batch in read_member(conn, MemberRange(STREAM, consumer, 0, last_seq), settings):
            total += batch.num_rows
    return time.perf_counter() - began, total


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages to publish and read")
    parser.add_argument("--partitions", type=int, default=4, help="partitions = member consumers")
    parser.add_argument("--size", type=int, default=100, help="payload bytes per message")
    parser.add_argument("--subjects", type=int, default=SUBJECTS, help="distinct subjects ev.k<i %% subjects>")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each contender, alternating")
    parser.add_argument(
        "--storage",
        choices=("file", "memory"),
        default="file",
        help="stream storage; memory takes the server's file-store read cost out of both contenders",
    )
    args = parser.parse_args(argv)
    if min(args.messages, args.partitions, args.repeat) < 1 or args.size < 0:
        parser.error("--messages, --partitions and --repeat must be positive, --size not negative")
    return args


def print_table(runs: list[Run]) -> None:
    print(f"{'contender':<10} {'run':>3} {'messages':>11} {'seconds':>8} {'msgs/s':>10}")
    for run in runs:
        print(f"{run.contender:<10} {run.index:>3} {run.messages:>11,} {run.seconds:>8.2f} {run.rate:>10,.0f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with EmbeddedServer(name="bench") as server:
        address = ("127.0.0.1", server.port)
        conn = connect(ConnectionOptions(servers=(server.url,)))
        try:
            api = JetStreamApi(conn)
            consumers = setup(api, args.partitions, args.storage)
            print(f"nats-server {server_version(address)}, {os.cpu_count()} cores, Python {platform.python_version()}")

            began = time.perf_counter()
            published = publish_all(conn, messages(args.messages, args.size, args.subjects))
            took = time.perf_counter() - began
            print(
                f"published {published.count:,} msgs of {args.size} B to {args.subjects:,} subjects "
                f"in {args.partitions} partitions ({args.storage} storage): {took:.2f} s "
                f"({published.count / took:,.0f} msgs/s)"
            )
            if published.count != args.messages:
                raise SystemExit(f"FAILED: published {published.count:,} of {args.messages:,} messages")
            last_seq = published.last_seq

            contenders: list[tuple[str, Callable[[], tuple[float, int]]]] = [
                ("baseline", lambda: run_baseline(conn, api, address, consumers)),
                ("connector", lambda: run_connector(conn, consumers, last_seq)),
            ]
            runs: list[Run] = []
            for index in range(1, args.repeat + 1):
                for name, contender in contenders:
                    seconds, count = contender()
                    if count != args.messages:
                        raise SystemExit(f"FAILED: {name} run {index} read {count:,} of {args.messages:,}")
                    runs.append(Run(name, index, count, seconds))
        finally:
            close_all()

    print()
    print_table(runs)
    best = {name: max(r.rate for r in runs if r.contender == name) for name, _ in contenders}
    ratio = best["connector"] / best["baseline"]
    verdict = "meets" if ratio >= TARGET_RATIO else "BELOW"
    print(
        f"\nratio connector/baseline (best msgs/s of {args.repeat}): {ratio:.2f} ({verdict} the {TARGET_RATIO} target)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
