"""``shapes``: streaming and batch reads of the stream shapes users have, by read mode, against raw protocol
loops on the same data and against what Spark itself moves from a Python source.

``--shape-messages`` x 100 B per shape, each on a fresh stream (file storage):

* ``8 partitions, 1,024 subjects`` and ``8 partitions, 200,000 subjects``: a pcgroups partition transform;
* ``no transform, Direct Get`` and ``no transform, client defaults`` (no ``allow_direct``): 1,024 subjects
  under ``ev.>``, as a client's ``StreamConfig(name, subjects)`` makes them;
* ``KV bucket, a key per message``: a bucket of history 1 as nats-py makes it, every message a key of its own.

Each stream is read with ``trigger(availableNow=True)`` into ``noop``, in ``--shape-batches`` micro-batches (8 by
default, through ``maxMessagesPerTrigger``: as a live query reads), and as a bounded batch read (``count``),
by default, with ``readMode=pull`` and with ``minPartitions`` (``--min-partitions``, 8 by default; without Direct Get:
slices through consumers of the tasks' own), with ``subjects=ev.*`` (every message, through the subject filter), and
streaming with ``preservePartitionOrder=false``, through a group and without; the bucket by default and with
``readMode=pull``, its changes streaming and its latest values in batch. ``--shapes`` picks shapes by a part of their
names. Every read's and raw loop's nats-server CPU per message is printed against the raw
'>' loop's of the same shape (the server's share, issue 57). The references, in the same run on the same data:

* ``raw Direct Get``: ``raw_direct`` reading the shape's partition filters in 2 processes (Direct Get shapes): the
  reference of streaming reads; reading ``>`` in one process: of batch reads, one task reading ``>`` here; and
  ``>`` in 2 contiguous seq slices, one per process: of ``minPartitions`` reads (decision 0017);
* ``raw pull``: ``raw_pull`` draining the member consumers the ``readMode=pull`` streaming read created, in
  2 processes (as ``local[2]`` runs 2 tasks); on a stream without Direct Get also ``raw_pull`` on 2 ephemeral
  AckNone consumers of contiguous seq slices, one per process: the reference of ``minPartitions`` reads there;
* Spark's ceiling: a Python source with the connector's schema that does no I/O (``noio``), 8 partitions,
  streaming (in ``--shape-batches`` micro-batches, as the streaming reads) and batch.

A read's ratio is against the lower of its path's raw loop and Spark's ceiling; ``stream/batch`` is the
streaming read's time over the batch read's (a goal only for reads in one micro-batch: each further batch costs
Spark itself a few tenths of a second, as the no-I/O source's streaming time shows). Every contender runs
``ROUNDS`` times in turn, best kept.

Then the scaling curve (``--curve-shape``, a part of a shape's name; ``none`` leaves it out): for N = 1, 2, 4, ... up to
the machine's cores, a session ``local[N]`` reads that shape with ``minPartitions=N``, streaming and batch, against
the raw loop of its path in N processes (Direct Get: ``>`` in N seq slices; without Direct Get: N ephemeral
consumers' slices, ``raw_pull`` on N slice consumers) and the no-I/O batch source in N partitions.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from common import KINDS, MASTER_ENV, PROCESSES_ENV, Cpu, CpuWatch, heading, processes
from noio import noio_source
from raw_direct import run_direct_parallel
from raw_pull import run_baseline_parallel, run_slices_parallel
from suite import SIZE, Measurement, Suite, Summary, start_session

from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partition_filters, partitioned_stream_config

STREAM = "SHAPES"
NOIO = "noio-shapes"
NOIO_PARTITIONS = 8
ROUNDS = 2
RATIO_TARGET = 0.8
STREAM_VS_BATCH_TARGET = 1.15


@dataclass(frozen=True)
class Shape:
    name: str
    subjects: int  # a bucket's: keys
    partitions: int | None  # None: no partition transform
    direct: bool
    bucket: bool = False  # the KV bucket ``STREAM`` (its stream ``KV_<STREAM>``): a key per message

    @property
    def stream(self) -> str:
        return f"KV_{STREAM}" if self.bucket else STREAM

    def config(self, storage: str) -> dict[str, object]:
        if self.bucket:  # as nats-py's create_key_value makes a bucket of history 1
            return {
                **{"name": self.stream, "subjects": [f"$KV.{STREAM}.>"], "allow_direct": True, "storage": storage},
                **{"max_msgs_per_subject": 1, "allow_rollup_hdrs": True, "deny_delete": True, "discard": "new"},
            }
        if self.partitions is None:
            return {"name": STREAM, "subjects": ["ev.>"], "allow_direct": self.direct, "storage": storage}
        return partitioned_stream_config(STREAM, "ev.*", self.partitions, storage=storage, allow_direct=self.direct)

    def subject(self, index: int) -> str:
        return f"$KV.{STREAM}.k{index}" if self.bucket else f"ev.k{index}"

    def filters(self) -> list[str]:
        return [">"] if self.partitions is None else partition_filters(range(self.partitions))

    def options(self, url: str) -> dict[str, str]:
        return {"servers": url, "bucket" if self.bucket else "stream": STREAM}


SHAPES = (
    Shape("8 partitions, 1,024 subjects", 1024, 8, True),
    Shape("8 partitions, 5,000 subjects", 5000, 8, True),
    Shape("8 partitions, 200,000 subjects", 200_000, 8, True),
    Shape("no transform, Direct Get", 1024, None, True),
    Shape("no transform, client defaults", 1024, None, False),
    Shape("KV bucket, a key per message", 0, None, True, bucket=True),
)


PARTITIONED = {shape.name for shape in SHAPES if shape.partitions}
"""The shapes the server's-share goals are about (issue 57)."""
BUCKETS = {shape.name for shape in SHAPES if shape.bucket}

UNORDERED = "preservePartitionOrder=false"
"""A streaming read's mode only: batch reads of a stream that is all the read's are unfiltered already."""
NO_GROUP = "no group"
"""Streaming reads without the group option (the checkpoint alone holds the position); batch reads take no group
anyway."""
SUBJECTS = "subjects=ev.*"
"""A read with a subject filter that every message matches, without a group (a group reads what its members read):
``<p>.ev.*`` for each partition, the transform's whole pattern; on a stream without a transform (``ev.>``) ``ev.*``,
read as a filter of part of the stream is."""
RAW_WHOLE = "raw Direct Get ('>', 2 slices)"
"""The server's cheapest read of a shape's messages: what every read's server CPU per message is held against."""
SERVER_UNORDERED_TARGET = 1.3
"""nats-server CPU per message of a ``UNORDERED`` streaming read at most this times the raw '>' loop's."""
SERVER_DEFAULT_TARGET = 1.2
"""nats-server CPU per message of a default streaming read at most this times its raw filtered loop's."""


def modes(min_partitions: int) -> dict[str, dict[str, str]]:
    """The read options each shape is read with (``--min-partitions``: the last one's, 8 by default)."""
    return {
        "default": {},
        "readMode=pull": {"readMode": "pull"},
        f"minPartitions={min_partitions}": {"minPartitions": str(min_partitions)},
        UNORDERED: {"preservePartitionOrder": "false"},
        NO_GROUP: {},
        f"{NO_GROUP}, {UNORDERED}": {"preservePartitionOrder": "false"},
        SUBJECTS: {"subjects": "ev.*"},
        f"{SUBJECTS}, {UNORDERED}": {"subjects": "ev.*", "preservePartitionOrder": "false"},
    }


BUCKET_MODES = {"default": {}, "readMode=pull": {"readMode": "pull"}}
"""A bucket's reads: its changes (streaming, without a group), its live keys' latest values (batch)."""


@dataclass
class Row:
    shape: str
    what: str  # "streaming <mode>", "batch <mode>", "raw ...", "Spark no-I/O ..."
    rate: float  # rows/s
    seconds: float
    cpu: Cpu | None
    reference: float | None = None  # the lower of the path's raw loop and Spark's ceiling
    phases: dict[str, float] | None = None  # a streaming read's durationMs summed over its batches
    raw: float | None = None  # the path's raw loop, rows/s

    @property
    def ratio(self) -> float | None:
        return self.rate / self.reference if self.reference else None


def run(suite: Suite) -> None:
    count = suite.args.shape_messages
    heading(f"shapes: {count:,} x {SIZE} B per stream shape, availableNow into noop and batch count()")
    spark = start_session(suite, "shapes")
    rows: list[Row] = []
    try:
        spark.dataSource.register(noio_source(NOIO, SIZE, count, NOIO_PARTITIONS, suite.args.shape_batches))
        ceiling = {
            "streaming": _best(suite, "Spark no-I/O streaming", lambda r: _streaming(suite, NOIO, {}, f"noio-{r}")),
            "batch": _best(suite, "Spark no-I/O batch", lambda r: _batch(suite, NOIO, {})),
        }
        for kind, (seconds, cpu, phases) in ceiling.items():
            rows.append(Row("-", f"Spark no-I/O {kind}", count / seconds, seconds, cpu, phases=phases))
        rates = {kind: count / seconds for kind, (seconds, _, _) in ceiling.items()}
        for index, shape in enumerate(SHAPES):
            if suite.args.shapes in shape.name:  # --shapes: a part of the shapes' names
                rows += _one_shape(suite, index, shape, rates)
    finally:
        spark.stop()
        _drop_streams(suite)
    _report(suite, rows)
    curve = [shape for shape in SHAPES if suite.args.curve_shape in shape.name]
    if curve:
        _curve(suite, curve[0])


def _one_shape(suite: Suite, index: int, shape: Shape, ceiling: dict[str, float]) -> list[Row]:
    api, count = suite.api, suite.args.shape_messages
    _fill(suite, shape)
    options = shape.options(suite.url)
    timed: dict[str, tuple[float, Cpu, dict[str, float] | None]] = {}
    for mode, extra in (BUCKET_MODES if shape.bucket else modes(suite.args.min_partitions)).items():
        slug = f"shape{index}-{re.sub(r'[^a-z0-9]+', '-', mode.lower())}"  # a checkpoint and group name per mode
        grouped = not mode.startswith((NO_GROUP, SUBJECTS)) and not shape.bucket
        timed[f"streaming {mode}"] = _best(
            suite,
            f"{shape.name}: streaming {mode}",
            lambda r, o=extra, g=slug, k=grouped: _streaming(suite, "jetstream", {**options, **o}, f"{g}-{r}", k),
        )
        if UNORDERED not in mode and mode != NO_GROUP:  # batch reads take no group: NO_GROUP's is the default's
            timed[f"batch {mode}"] = _best(
                suite, f"{shape.name}: batch {mode}", lambda r, o=extra: _batch(suite, "jetstream", {**options, **o})
            )
    raw: dict[str, tuple[float, str, Cpu]] = {}
    if shape.direct:
        filters = shape.filters()
        raw["direct"] = (
            *_raw(suite, count, lambda: _raw_direct(suite, shape, filters)),
            f"raw Direct Get ({len(filters)} filters)",
        )
        if filters != [">"]:  # a batch read reads '>' in one task here
            raw["whole"] = (*_raw(suite, count, lambda: _raw_direct(suite, shape, [">"])), "raw Direct Get ('>')")
        slices = _raw(suite, count, lambda: _raw_direct(suite, shape, [">"] * 2, last=count))
        raw["slices"] = (*slices, RAW_WHOLE)
    if not shape.bucket:  # a bucket is read without a group: no member consumers
        members = f"shape{index}-readmode-pull-0-"  # the member consumers of the first readMode=pull streaming read
        consumers = sorted(c for c in api.consumer_names(STREAM) if c.startswith(members))
        pulled = _raw(
            suite,
            count,
            lambda: _checked(
                run_baseline_parallel(suite.conn, suite.address, consumers, count, STREAM), count, "raw pull"
            ),
        )
        raw["pull"] = (*pulled, f"raw pull ({len(consumers)} consumers)")
    if not shape.direct:  # minPartitions reads slices through consumers of their own: so does its raw loop
        slices = _raw(suite, count, lambda: _raw_slices(suite, processes(), count))
        raw["slices"] = (*slices, f"raw pull ({processes()} slice consumers)")
    out = [Row(shape.name, what, rate, count / rate, cpu) for rate, cpu, what in raw.values()]
    for what, (seconds, cpu, phases) in timed.items():
        kind, mode = what.split(" ", 1)
        path = "pull" if (mode == "readMode=pull" and not shape.bucket) or not shape.direct else "direct"
        if (mode.startswith("minPartitions=") or UNORDERED in mode) and "slices" in raw:
            path = "slices"  # cut by seq: '>' with Direct Get (decision 0017), else slice consumers (decision 0021)
        elif path == "direct" and kind == "batch" and "whole" in raw:
            path = "whole"  # a batch read of a stream that is all the group's: '>' in one task (under 1,000,000 seqs)
        reference = min(raw[path][0], ceiling[kind])
        out.append(Row(shape.name, what, count / seconds, seconds, cpu, reference, phases, raw[path][0]))
    return out


def _fill(suite: Suite, shape: Shape) -> None:
    """A fresh stream of ``shape`` holding ``--shape-messages`` messages over its subjects (a bucket: a key each)."""
    count = suite.args.shape_messages
    _drop_streams(suite)
    suite.api.create_stream(shape.config(suite.args.storage))
    payload = os.urandom(SIZE)
    keys = count if shape.bucket else shape.subjects
    subjects = [shape.subject(k) for k in range(keys)]
    published = publish_all(suite.conn, ((subjects[i % keys], payload, None) for i in range(count)))
    if published.count != count:
        raise SystemExit(f"FAILED: published {published.count:,} of {count:,} messages ({shape.name})")
    print(f"  {shape.name}: {count:,} messages published", flush=True)


def _drop_streams(suite: Suite) -> None:
    """Remove the streams of earlier shapes (a bucket's stream too)."""
    for name in set(suite.api.stream_names()) & {shape.stream for shape in SHAPES}:
        suite.api.delete_stream(name)


def _raw(suite: Suite, count: int, loop: Callable[[], float]) -> tuple[float, Cpu]:
    """The best of ``ROUNDS`` runs of a raw loop (its seconds): rows/s and the CPU of that run (nats-server's too)."""
    runs = []
    for _ in range(ROUNDS):
        watch = CpuWatch(suite.monitor or None)
        seconds = loop()
        runs.append((seconds, watch.stop()))
    seconds, cpu = min(runs, key=lambda run: run[0])
    return count / seconds, cpu


def _server_us(row: Row) -> float:
    """nats-server CPU per message read (us)."""
    assert row.cpu is not None
    return row.cpu.seconds["nats-server"] / (row.rate * row.seconds) * 1e6


def _checked(result: tuple[float, int], count: int, what: str) -> float:
    seconds, got = result
    if got != count:
        raise SystemExit(f"FAILED: {what} read {got:,} of {count:,}")
    return seconds


def _raw_direct(suite: Suite, shape: Shape, filters: list[str], last: int | None = None) -> float:
    seconds, got, _ = run_direct_parallel(suite.address, shape.stream, filters, last)
    return _checked((seconds, got), suite.args.shape_messages, "the raw Direct Get")


def _streaming(
    suite: Suite, source: str, options: dict[str, str], group: str, grouped: bool = True
) -> dict[str, float]:
    """Read the whole stream (through ``group``, unless not ``grouped``: the name then only names the checkpoint);
    returns Spark's ``durationMs`` phases summed over the query's batches."""
    from pyspark.sql import SparkSession

    spark, count = SparkSession.getActiveSession(), suite.args.shape_messages
    reader = spark.readStream.format(source).options(**options)
    if source == "jetstream" and grouped:
        reader = reader.option("group", group)
    if source == "jetstream" and suite.args.shape_batches > 1:  # as a live query reads: batch after batch
        reader = reader.option("maxMessagesPerTrigger", str(-(-count // suite.args.shape_batches)))
    query = (
        reader.load()
        .writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", suite.checkpoint(f"shapes-{source}-{group}"))
        .start()
    )
    query.awaitTermination()
    got = sum(p["numInputRows"] for p in query.recentProgress)
    if got != count:
        raise SystemExit(f"FAILED: the streaming read ({source}, {options}) read {got:,} of {count:,}")
    phases: dict[str, float] = {"batches": len(query.recentProgress)}
    for progress in query.recentProgress:
        for name, ms in progress["durationMs"].items():
            phases[name] = phases.get(name, 0) + ms
    return phases


def _batch(suite: Suite, source: str, options: dict[str, str]) -> None:
    from pyspark.sql import SparkSession

    spark, count = SparkSession.getActiveSession(), suite.args.shape_messages
    got = spark.read.format(source).options(**options).load().count()
    if got != count:
        raise SystemExit(f"FAILED: the batch read ({source}, {options}) read {got:,} of {count:,}")


def _best(
    suite: Suite, label: str, work: Callable[[int], dict[str, float] | None]
) -> tuple[float, Cpu, dict[str, float] | None]:
    """The fastest of ``ROUNDS`` runs of ``work(round)``: seconds, CPU and what ``work`` returned."""
    from pyspark.sql import SparkSession

    runs = []
    for round_ in range(ROUNDS):
        watch = Measurement(suite, f"{label}, run {round_}", SparkSession.getActiveSession())
        began = time.perf_counter()
        phases = work(round_)
        runs.append((time.perf_counter() - began, watch.stop(), phases))
    return min(runs, key=lambda r: r[0])


def _report(suite: Suite, rows: list[Row]) -> None:
    print(f"  {'shape':<31} {'read':<30} {'rows/s':>9} {'s':>6} {'ratio':>6} {'cores':>6} {'other CPU':>9}")
    for row in rows:
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else "-"
        cores = f"{row.cpu.own_cores:.2f}" if row.cpu else "-"
        other = f"{row.cpu.other_share:.0%}" if row.cpu else "-"
        print(
            f"  {row.shape:<31} {row.what:<30} {row.rate:>9,.0f} {row.seconds:>6.2f} {ratio:>6} {cores:>6} {other:>9}"
        )
    print("  CPU per message by process (us; the same runs):")
    print(f"  {'shape':<31} {'read':<30} " + " ".join(f"{kind:>14}" for kind in KINDS) + f" {'all':>6}")
    for row in rows:
        if row.cpu and row.cpu.seconds:
            count = row.rate * row.seconds
            per = [row.cpu.seconds[kind] / count * 1e6 for kind in KINDS]
            print(f"  {row.shape:<31} {row.what:<30} " + " ".join(f"{v:>14.2f}" for v in per) + f" {sum(per):>6.2f}")
    print(
        "  Streaming queries, where the time went (s; Spark's durationMs summed over the batches; 'read ratio':\n"
        "  the rows over the addBatch seconds against the path's raw loop: without the query's start and stop):"
    )
    names = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets")
    print(
        f"  {'shape':<31} {'read':<30} {'wall':>6} {'batches':>7} {'outside':>7} "
        + " ".join(f"{n:>13}" for n in names)
        + f" {'read ratio':>10}"
    )
    for row in rows:
        if row.phases:
            ph = row.phases
            outside = row.seconds - ph.get("triggerExecution", 0) / 1000
            adding = ph.get("addBatch", 0) / 1000
            read_ratio = f"{row.rate * row.seconds / adding / row.raw:.2f}" if adding and row.raw else "-"
            print(
                f"  {row.shape:<31} {row.what:<30} {row.seconds:>6.2f} {ph['batches']:>7.0f} {outside:>7.2f} "
                + " ".join(f"{ph.get(n, 0) / 1000:>13.2f}" for n in names)
                + f" {read_ratio:>10}"
            )
    _server_share(suite, rows)
    suite.results["shapes"] = [_result(row) for row in rows]
    seconds = {(row.shape, row.what): row.seconds for row in rows}
    slower = [  # a streaming read's time over the batch read's of the same shape and mode
        (seconds[(shape, what)] / seconds[(shape, "batch" + what[len("streaming") :])], shape, what)
        for shape, what in seconds
        if what.startswith("streaming ")
        and (shape, "batch" + what[len("streaming") :]) in seconds
        and shape not in BUCKETS  # a bucket's changes against its latest values: not the same read
    ]
    print("  streaming / batch time: " + ", ".join(f"{s} {w[10:]} {r:.2f}" for r, s, w in slower))
    pulls = [r for r in rows if r.what == "streaming readMode=pull" and r.shape.startswith("8 partitions")]
    reads = [r for r in rows if r.ratio is not None]
    for label, among in (("pull path, one partition per member", pulls), ("every read", reads)):
        if not among:  # --shapes left out the shapes it is about
            continue
        worst = min(among, key=lambda r: r.ratio or 0)
        suite.summary.append(
            Summary(
                f"shapes: {label}, worst vs min(raw, Spark) ({worst.shape}, {worst.what})",
                worst.rate,
                worst.reference or 0,
                "rows/s",
                f">= {RATIO_TARGET:g}x",
                (worst.ratio or 0) >= RATIO_TARGET,
            )
        )
    if not slower or suite.args.shape_batches > 1:  # its goal is for one batch against one job
        return
    ratio, shape, what = max(slower)
    suite.summary.append(
        Summary(
            f"shapes: streaming vs batch read time, worst ({shape}, {what[10:]})",
            seconds[(shape, what)],
            seconds[(shape, "batch" + what[len("streaming") :])],
            "s",
            f"<= {STREAM_VS_BATCH_TARGET:g}x",
            ratio <= STREAM_VS_BATCH_TARGET,
        )
    )


def _result(row: Row) -> dict[str, object]:
    """One read or raw loop as plain data (``--json``): rows/s, seconds, and CPU seconds by process kind."""
    return {
        "shape": row.shape,
        "read": row.what,
        "rows_per_s": row.rate,
        "seconds": row.seconds,
        "messages": round(row.rate * row.seconds),
        "ratio": row.ratio,
        "cpu_seconds": dict(row.cpu.seconds) if row.cpu else None,
        "server_sent": row.cpu.sent if row.cpu else None,
        "other_cpu_share": row.cpu.other_share if row.cpu else None,
    }


def _server_share(suite: Suite, rows: list[Row]) -> None:
    """The server's share of each read (issue 57): nats-server CPU per message against the raw '>' loop of the same
    shape (its cheapest read), and for streaming reads the goals: the default within ``SERVER_DEFAULT_TARGET`` of
    its raw filtered loop, ``UNORDERED`` within ``SERVER_UNORDERED_TARGET`` of the raw '>' loop."""
    by = {(row.shape, row.what): row for row in rows if row.cpu is not None}
    print(
        "  nats-server CPU per message read (us), against the raw '>' loop of the same shape (2 slices), and the\n"
        "  messages the server sent per message read:"
    )
    for (shape, what), row in by.items():
        whole = by.get((shape, RAW_WHOLE))
        against = f"{_server_us(row) / _server_us(whole):.2f}x" if whole else "-"
        sent = f"{row.cpu.sent / (row.rate * row.seconds):.3f}" if row.cpu and row.cpu.sent is not None else "-"
        print(f"  {shape:<31} {what:<40} {_server_us(row):>7.2f} {against:>7} {sent:>9}")
    for shape in dict.fromkeys(row.shape for row in rows if row.shape in PARTITIONED):
        filtered = next((row for (s, what), row in by.items() if s == shape and what.endswith(" filters)")), None)
        goals = (
            ("default", by.get((shape, "streaming default")), filtered, SERVER_DEFAULT_TARGET),
            (UNORDERED, by.get((shape, f"streaming {UNORDERED}")), by.get((shape, RAW_WHOLE)), SERVER_UNORDERED_TARGET),
        )  # fmt: skip
        for mode, read, raw, target in goals:
            if read is None or raw is None:
                continue
            ratio = _server_us(read) / _server_us(raw)
            suite.summary.append(
                Summary(
                    f"shapes: nats-server us/msg, streaming {mode} vs {raw.what} ({shape})",
                    _server_us(read),
                    _server_us(raw),
                    "us/msg",
                    f"<= {target:g}x",
                    ratio <= target,
                )
            )


def core_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to ``cores``, and ``cores`` itself."""
    counts = [1 << k for k in range(cores.bit_length()) if 1 << k <= cores]
    return counts if counts[-1] == cores else [*counts, cores]


@contextmanager
def _cores(n: int):
    """Spark sessions ``local[n]`` and raw loops in ``n`` processes, for the block's duration."""
    saved = {key: os.environ.get(key) for key in (MASTER_ENV, PROCESSES_ENV)}
    os.environ[MASTER_ENV], os.environ[PROCESSES_ENV] = f"local[{n}]", str(n)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _curve(suite: Suite, shape: Shape) -> None:
    """The scaling curve of ``shape`` (module doc)."""
    count, cores = suite.args.shape_messages, os.cpu_count() or 1
    heading(f"shapes, scaling curve: {shape.name}, {count:,} x {SIZE} B, local[N] for N in {core_counts(cores)}")
    _fill(suite, shape)
    options = shape.options(suite.url)
    table = []
    try:
        for n in core_counts(cores):
            with _cores(n):
                table.append((n, *_curve_point(suite, shape, n, options)))
    finally:
        _drop_streams(suite)
    path = "raw Direct Get ('>', N slices)" if shape.direct else "raw pull (N slice consumers)"
    print(f"  scaling curve, {shape.name}; raw: {path}, N processes; load {os.getloadavg()[0]:.2f}")
    header = ("N", "streaming rows/s", "batch rows/s", "raw rows/s", "no-I/O batch", "stream/raw", "batch/raw", "cores")
    print("  " + " ".join(f"{h:>16}" for h in header))
    for n, (s_sec, s_cpu, _), (b_sec, _, _), raw, noio in table:
        cells = [
            f"{n}",
            f"{count / s_sec:,.0f}",
            f"{count / b_sec:,.0f}",
            f"{count / raw:,.0f}",
            f"{count / noio:,.0f}",
            f"{raw / s_sec:.2f}",
            f"{raw / b_sec:.2f}",
            f"{s_cpu.own_cores:.2f}",
        ]
        print("  " + " ".join(f"{c:>16}" for c in cells))


def _curve_point(
    suite: Suite, shape: Shape, n: int, options: dict[str, str]
) -> tuple[tuple[float, Cpu, dict[str, float] | None], tuple[float, Cpu, dict[str, float] | None], float, float]:
    """One point of the curve at ``local[n]``: streaming and batch ``minPartitions=n``, the raw loop, no-I/O."""
    count = suite.args.shape_messages
    extra = {**options, "minPartitions": str(n)}
    spark = start_session(suite, f"shapes-curve-{n}")
    try:
        spark.dataSource.register(noio_source(f"{NOIO}-{n}", SIZE, count, n))
        noio = _best(suite, f"no-I/O batch, local[{n}]", lambda r: _batch(suite, f"{NOIO}-{n}", {}))
        label = f"minPartitions={n}, local[{n}]"
        streaming = _best(suite, f"streaming {label}", lambda r: _streaming(suite, "jetstream", extra, f"c{n}-{r}"))
        batch = _best(suite, f"batch {label}", lambda r: _batch(suite, "jetstream", extra))
    finally:
        spark.stop()
    if shape.direct:
        raw = min(_raw_direct(suite, shape, [">"] * n, last=count) for _ in range(ROUNDS))
    else:
        raw = min(_raw_slices(suite, n, count) for _ in range(ROUNDS))
    return streaming, batch, raw, noio[0]


def _raw_slices(suite: Suite, n: int, count: int) -> float:
    """``raw_pull`` on ``n`` ephemeral AckNone consumers, one per contiguous seq slice of the stream (what
    ``minPartitions`` reads through consumers make), in ``n`` processes; consumers made and removed untimed."""
    api = suite.api
    ends = [count * (index + 1) // n for index in range(n)]
    names = []
    for index, low in enumerate([0, *ends[:-1]]):
        config = {
            "name": f"curve-slice-{index}",
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": low + 1,
            "ack_policy": "none",
            "filter_subject": ">",
            "inactive_threshold": 60_000_000_000,
        }
        names.append(api.create_consumer(STREAM, config)["name"])
    try:
        seconds, got = run_slices_parallel(suite.address, STREAM, names, ends)
    finally:
        for name in names:
            api.delete_consumer(STREAM, name)
    return _checked((seconds, got), count, "the raw pull of the slices")
