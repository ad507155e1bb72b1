"""``first-batch``: time to the first batch in a fresh process: the connector against a Python source that does
no I/O and against Spark's ``rate`` source, in the same run, each query in a process of its own.

``FIRST_BATCH_MESSAGES`` messages wait on a 4-partition stream. For each contender a child process
(``python -c``, running ``child``) starts Spark (not timed), then times ``load()`` (the source's ``schema()`` and
option checks) and ``start()`` to the first committed batch into the ``noop`` sink. The jetstream query reads the
stream from the start (a new group per round); the no-I/O Python source yields the rows the connector yields for
that stream (its schema, subjects, payload size, seqs, partitions) as one Arrow batch built in ``read()`` without
I/O: the same rows cost Spark the same to convert and pass on, so the difference is what reading costs. ``rate``
is Spark's own floor. ``--first-batch-rounds`` rounds interleave the contenders (this machine's speed drifts);
medians are printed.

The child imports this module, so it imports ``suite`` (and through it more of the connector) only in ``run``: a
child's ``load()`` finds no more of the connector imported than ``common`` brings.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from common import SUBJECTS, fresh_session, heading, in_fresh_process, publish

if TYPE_CHECKING:
    import pyarrow as pa
    from suite import Suite

STREAM = "FIRST"
FIRST_BATCH_MESSAGES = 100_000
FIRST_BATCH_TARGET = 1.3  # load() plus the first batch, against a Python source that does no I/O
CONTENDERS = ("jetstream", "python-noio", "rate")


def child(kind: str, servers: str, stream: str, group: str, count: str) -> dict[str, float]:
    """Runs in the fresh process (``common.in_fresh_process``): one query, timed."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    from spark_jetstream.read.row_schema import spark_schema_ddl

    def same_rows(count: int) -> pa.RecordBatch:
        """The rows the connector reads from the stream ``run`` publishes: ``first.k<i % SUBJECTS>`` with 100 bytes
        of data, seqs 1..count, partition by key (the values need not match the hash, only its spread). Built with
        vectorised calls, so the no-I/O source spends next to nothing of its own. Nested, so Spark pickles it by
        value: the task worker imports nothing of the benchmark."""
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

    class NoIoReader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
            return {"n": messages}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            return [InputPartition(end["n"] - start["n"])] if end["n"] > start["n"] else []

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            yield same_rows(partition.value)

    class NoIoSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "noio"

        def schema(self) -> str:
            return spark_schema_ddl(include_headers=False)

        def streamReader(self, schema: Any) -> NoIoReader:
            return NoIoReader()

    messages = int(count)
    spark = fresh_session(**{"spark.sql.shuffle.partitions": "2"})
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


def measure(servers: str, messages: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """Every contender ``rounds`` times, interleaved, each in a fresh process, on ``STREAM`` (which holds
    ``messages`` messages partitioned 4 ways); a new group per round."""
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in CONTENDERS}
    for round_ in range(rounds):
        for kind in CONTENDERS:
            result = in_fresh_process(
                "scenarios.first_batch.child", kind, servers, STREAM, f"first{round_}", str(messages)
            )
            runs[kind].append(result)
            print(
                f"  round {round_ + 1}, {kind}: load() {result['load']:.2f} s, "
                f"first batch {result['first_batch']:.2f} s",
                flush=True,
            )
    return runs


def together(runs: list[dict[str, float]]) -> float:
    """Median of load() plus the first batch."""
    return statistics.median(r["load"] + r["first_batch"] for r in runs)


def first_batch(runs: list[dict[str, float]]) -> float:
    return statistics.median(r["first_batch"] for r in runs)


def print_table(runs: dict[str, list[dict[str, float]]]) -> None:
    print(f"  {'source':<12}{'load() s':>10}{'first batch s':>15}{'together s':>12}{'rows':>9}")
    for kind, done in runs.items():
        load = statistics.median(r["load"] for r in done)
        rows = int(statistics.median(r["rows"] for r in done))
        print(f"  {kind:<12}{load:>10.2f}{first_batch(done):>15.2f}{together(done):>12.2f}{rows:>9}")


def run(suite: Suite) -> None:
    from suite import SIZE, Summary

    rounds = suite.args.first_batch_rounds
    heading(
        f"first batch: load() + first batch in a fresh process, {FIRST_BATCH_MESSAGES:,} messages waiting, "
        f"{rounds} round{'s' if rounds > 1 else ''}"
    )
    suite.fresh_stream(STREAM, "first.*", 4)
    payload, count = b"x" * SIZE, FIRST_BATCH_MESSAGES
    publish(suite.conn, "first-batch", ((f"first.k{i % SUBJECTS}", payload, None) for i in range(count)), count)
    runs = measure(suite.url, count, rounds)
    print_table(runs)
    connector, floor = together(runs["jetstream"]), together(runs["python-noio"])
    print(
        f"  jetstream / python-noio: {connector / floor:.2f} (target <= {FIRST_BATCH_TARGET:g}); jetstream / rate: "
        f"{connector / together(runs['rate']):.2f}; jetstream first batch {first_batch(runs['jetstream']):.2f} s"
    )
    suite.summary.append(
        Summary(
            "first batch: connector vs no-I/O Python source (s)",
            connector,
            floor,
            "s",
            f"<= {FIRST_BATCH_TARGET:g}x",
            connector / floor <= FIRST_BATCH_TARGET,
        )
    )
    suite.api.delete_stream(STREAM)
