"""Time to the first batch in a fresh process: the connector against a Python source that does no I/O
and against Spark's ``rate`` source, in the same run, each query in a process of its own.

python bench/first_batch.py [--rounds 3] [--messages 100000]

For each contender a child process starts Spark (not timed), then times ``load()`` (the source's
``schema()`` and option checks) and ``start()`` to the first committed batch into the ``noop`` sink.
The jetstream query reads a stream holding ``--messages`` messages from the start (a new group per
run); the no-I/O Python source yields the rows the connector yields for that stream (its schema,
subjects, payload size, seqs, partitions) as one Arrow batch built in ``read()`` without I/O: the same
rows cost Spark the same to convert and pass on, so the difference is what reading costs. ``rate`` is
Spark's own floor. Rounds interleave the contenders (this machine's speed drifts); medians are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import SUBJECTS

if TYPE_CHECKING:
    import pyarrow as pa

CONTENDERS = ("jetstream", "python-noio", "rate")


def child(kind: str, servers: str, stream: str, group: str, messages: int) -> dict[str, float]:
    """Runs in the fresh process: one query, timed."""
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    from spark_jetstream.read.row_schema import spark_schema_ddl

    class NoIoReader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
            return {"n": messages}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            return [InputPartition(end["n"] - start["n"])] if end["n"] > start["n"] else []

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            yield same_rows(stream, partition.value)

    class NoIoSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "noio"

        def schema(self) -> str:
            return spark_schema_ddl(include_headers=False)

        def streamReader(self, schema: Any) -> NoIoReader:
            return NoIoReader()

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NoIoSource)
    began = time.monotonic()
    if kind == "jetstream":
        frame = (
            spark.readStream.format("jetstream")
            .option("servers", servers)
            .option("stream", stream)
            .option("group", group)
            .load()
        )
    elif kind == "python-noio":
        frame = spark.readStream.format("noio").load()
    else:
        frame = spark.readStream.format("rate").option("rowsPerSecond", messages).load()
    loaded, loaded_wall = time.monotonic(), time.time()
    query = frame.writeStream.format("noop").start()
    while not [p for p in query.recentProgress if p.numInputRows]:
        if not query.isActive:
            raise RuntimeError(f"The {kind} query ended before its first batch: {query.exception()}")
        time.sleep(0.01)
    first = time.monotonic()
    progress = next(p for p in query.recentProgress if p.numInputRows)
    query.stop()
    spark.stop()
    started = datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
    return {
        "load": loaded - began,
        "first_batch": first - loaded,
        "rows": progress.numInputRows,
        "to_trigger": started - loaded_wall,  # start() until Spark began the first batch's trigger
        **{k: v / 1000 for k, v in progress.durationMs.items() if v >= 50},  # where that trigger's time went
    }


def same_rows(stream: str, count: int) -> pa.RecordBatch:
    """The rows the connector reads from the stream ``main`` (and the ``first-batch`` scenario) publishes:
    ``first.k<i % SUBJECTS>`` with 100 bytes of data, seqs 1..count, partition by key (the values need not
    match the hash, only its spread). Built with vectorised calls, so the no-I/O source spends next to nothing
    of its own."""
    import numpy as np
    import pyarrow as pa

    index = np.arange(count)
    keys, first = index % SUBJECTS, pa.array(np.zeros(count, np.int64))
    return pa.RecordBatch.from_pydict(
        {
            "subject": pa.array([f"first.k{k}" for k in range(SUBJECTS)]).take(pa.array(keys)),
            "data": pa.array([b"x" * 100], pa.binary()).take(first),
            "stream": pa.array([stream]).take(first),
            "seq": pa.array(index + 1),
            "timestamp": pa.array(time.time_ns() // 1000 + index, pa.timestamp("us", tz="UTC")),
            "partition": pa.array((keys % 4).astype(np.int32)),
        }
    )


def measure(servers: str, stream: str, messages: int, rounds: int, log: bool = True) -> dict[str, list[dict]]:
    """Every contender ``rounds`` times, interleaved, each in a fresh process, on ``stream`` (which
    holds ``messages`` messages partitioned 4 ways); a new group per round."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    runs: dict[str, list[dict]] = {kind: [] for kind in CONTENDERS}
    for round_ in range(rounds):
        for kind in CONTENDERS:
            done = subprocess.run(
                [sys.executable, __file__, "--child", kind, servers, stream, f"first{round_}", str(messages)],
                capture_output=True, text=True, env=env, cwd=Path(__file__).parent, check=False,
            )  # fmt: skip
            if done.returncode:
                sys.exit(f"{kind} failed:\n{done.stderr[-3000:]}")
            runs[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
            if log:
                print(f"round {round_ + 1} {kind:<12} {json.dumps(runs[kind][-1])}", flush=True)
    return runs


def together(runs: list[dict]) -> float:
    """Median of load() plus the first batch."""
    return statistics.median(r["load"] + r["first_batch"] for r in runs)


def first_batch(runs: list[dict]) -> float:
    return statistics.median(r["first_batch"] for r in runs)


def print_table(runs: dict[str, list[dict]]) -> None:
    print(f"\n{'source':<12}{'load() s':>10}{'first batch s':>15}{'together s':>12}{'rows':>9}")
    for kind, done in runs.items():
        load = statistics.median(r["load"] for r in done)
        rows = int(statistics.median(r["rows"] for r in done))
        print(f"{kind:<12}{load:>10.2f}{first_batch(done):>15.2f}{together(done):>12.2f}{rows:>9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--child", nargs=5, metavar=("KIND", "SERVERS", "STREAM", "GROUP", "MESSAGES"))
    args = parser.parse_args()
    if args.child:
        kind, servers, stream, group, messages = args.child
        print(json.dumps(child(kind, servers, stream, group, int(messages))))
        return

    from spark_jetstream.client.connection import ConnectionOptions, close_all, connect
    from spark_jetstream.client.jsapi import JetStreamApi
    from spark_jetstream.client.publish import publish_all
    from spark_jetstream.groups.layout import partitioned_stream_config
    from spark_jetstream.tools.embedded import EmbeddedServer

    with EmbeddedServer(name="first-batch") as server:
        server.start()
        conn = connect(ConnectionOptions(servers=(server.url,)))
        JetStreamApi(conn).create_stream(partitioned_stream_config("FIRST", "first.*", 4))
        publish_all(conn, ((f"first.k{i % SUBJECTS}", b"x" * 100, None) for i in range(args.messages)))
        close_all()
        runs = measure(server.url, "FIRST", args.messages, args.rounds)
    print_table(runs)
    print(
        f"\njetstream / python-noio: {together(runs['jetstream']) / together(runs['python-noio']):.2f} "
        f"(target <= 1.3); jetstream / rate: {together(runs['jetstream']) / together(runs['rate']):.2f}; "
        f"jetstream first batch {first_batch(runs['jetstream']):.2f} s (target < 5 s)"
    )


if __name__ == "__main__":
    main()
