"""``spark-jetstream demo``: a whole pipeline on one machine, checked at the end.

It starts a ``nats-server`` with a temporary store (or uses ``--servers``), creates a stream of
order events partitioned four ways, and while it publishes JSON orders with headers at a steady
rate, runs ``spark.readStream.format("jetstream")`` -> ``from_json`` -> per-batch revenue by
region -> parquet (``foreachBatch``, one directory per batch id, overwritten on replay: an
idempotent sink). A status line shows the batch, rows, rate and lag as it goes (before the first
batch: what Spark is doing). Then it reads the same stream again into Spark's ``noop`` sink, to
show the connector's own read speed next to the pipeline's. At the end it checks that the parquet
totals equal what was published, exactly, and that every member consumer's ack floor equals the
checkpoint; saves a PNG of throughput and lag; and stops everything it started.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession

from spark_jetstream import register
from spark_jetstream.client.connection import close_all, connect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import JetStreamError, StreamNotFoundError
from spark_jetstream.groups.admin import status
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.options import parse_connection_options
from spark_jetstream.streaming.offsets import committed_offset, planned_offset
from spark_jetstream.testing import EmbeddedServer
from spark_jetstream.tools.demo_orders import PacedPublisher, parse_orders, write_revenue
from spark_jetstream.tools.monitoring import BatchProgress, JetStreamLagListener, batch_progress
from spark_jetstream.tools.worker_warmup import WorkerWarmUp

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

GROUP = "demo"
QUIET_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""
"""Spark's driver logs errors only: the demo's own lines are the progress display."""


class StatusLine:
    """One line redrawn in place on a terminal, printed every few seconds otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last = 0.0

    def due(self) -> bool:
        """Whether a line is due now (making one asks the server for the stream's state)."""
        return time.monotonic() - self.last >= (0.25 if self.tty else 3.0)

    def show(self, text: str, final: bool = False) -> None:
        self.last = time.monotonic()
        if self.tty:
            print(f"\r\033[K{text}", end="\n" if final else "", flush=True)
        else:
            print(text, flush=True)


def run(
    servers: str | None = None,
    creds: str | None = None,
    messages: int = 200_000,
    partitions: int = 4,
    stream: str = "demo_orders",
    rate: int = 20_000,
    batch_limit: int = 25_000,
    out: str | None = None,
    keep: bool = False,
    timeout: float = 600.0,
) -> int:
    """Run the demo; 0 when every check passed, 1 when one failed (the output says which)."""
    out_dir = Path(out or tempfile.mkdtemp(prefix="spark-jetstream-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    earlier = [
        name for name in ("checkpoint", "checkpoint_read_only", "revenue_by_region") if (out_dir / name).exists()
    ]
    if earlier:  # a checkpoint of an earlier stream fails the query; earlier batches' parquet would count again
        raise JetStreamError(f"{out_dir} holds an earlier demo run ({', '.join(earlier)}): use a new --out directory.")
    with ExitStack() as stack:
        if servers is None:
            print("Starting an embedded nats-server with a temporary store ...")
            server = stack.enter_context(EmbeddedServer(name="demo"))
            servers = server.url
            print(f"  nats-server at {server.url} (pid {server.pid}, store {server.dir})")
        stack.callback(close_all)
        nats = {"servers": servers, **({"creds": creds} if creds else {})}  # options of every connection
        conn = connect(parse_connection_options(nats))
        api = JetStreamApi(conn)
        try:
            api.stream_info(stream)
        except StreamNotFoundError:
            pass
        else:
            raise JetStreamError(f"Stream {stream!r} already exists on {conn.server_url}: pick another with --stream.")
        print(f"Creating stream {stream!r}: subjects orders.*, {partitions} partitions by customer ...")
        api.create_stream(partitioned_stream_config(stream, "orders.*", partitions))
        if not keep:
            stack.callback(api.delete_stream, stream)

        print("Starting Spark (local[2]) ...")
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local demo: no "resolves to a loopback" warning
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers run this Python, venv active or not
        log_config = out_dir / "log4j2.properties"
        log_config.write_text(QUIET_LOG4J)
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("spark-jetstream demo")
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log_config}")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        stack.callback(spark.stop)
        spark.sparkContext.setLogLevel("ERROR")
        # Registered from Python, so that the Python workers the warm-up starts are the ones the query's tasks
        # reuse: Spark pools workers by their environment, and a source its own look-up finds gets a pool of its
        # own (measured with PySpark 4.3: the first batch's tasks then started new workers, ~0.6 s later).
        warm_up = WorkerWarmUp(spark)
        warm_up.start()  # while the source is registered (Spark's look-up of sources, a Python process: ~1.4 s)
        register(spark)
        listener = JetStreamLagListener()
        spark.streams.addListener(listener)

        results, checkpoint = out_dir / "revenue_by_region", out_dir / "checkpoint"
        source = _orders(spark, nats, stream, group=GROUP, maxMessagesPerTrigger=str(batch_limit))

        def write_batch(frame: DataFrame, batch_id: int) -> None:
            write_revenue(frame, results / f"batch_id={batch_id}")  # a replay overwrites its own: idempotent

        query = (
            parse_orders(source)
            .writeStream.foreachBatch(write_batch)
            .option("checkpointLocation", str(checkpoint))
            .queryName("demo_orders")
            .start()
        )
        started = time.time()
        stack.callback(query.stop)

        publisher = PacedPublisher(conn, messages, rate)
        print(f"Publishing {messages:,} orders at ~{rate:,}/s while the query reads (batches <= {batch_limit:,}) ...")
        began = time.monotonic()
        publisher.start()
        line = StatusLine()
        warm_up_reported = False
        while True:
            if publisher.error is not None:
                raise publisher.error
            if query.exception() is not None:
                raise JetStreamError(f"The streaming query failed: {query.exception()}")
            if warm_up.failure and not warm_up_reported:
                note = f"  (Spark's Python workers were not warmed up, the first batch starts them: {warm_up.failure})"
                line.show(note, final=True)
                warm_up_reported = True
            batches = [b for b in listener.batches if b.rows]
            read = sum(b.rows for b in batches)
            if line.due():
                doing = "" if batches else _before_first_batch(spark, query, checkpoint, warm_up.is_alive())
                line.show(_status(batches, read, publisher.published, api, stream, doing, time.monotonic() - began))
            if not publisher.is_alive() and read >= publisher.published:
                break
            if time.monotonic() - began > timeout:
                raise JetStreamError(f"The demo did not finish within {timeout:g}s (read {read:,} rows).")
            time.sleep(0.1)
        elapsed = time.monotonic() - began
        line.show(_status(batches, read, publisher.published, api, stream, "", elapsed), final=True)

        floors_ok, committed, floors = _wait_for_floors(api, stream, checkpoint)
        query.stop()
        spark.streams.removeListener(listener)  # the plot shows the pipeline's batches only
        print(f"Reading the same {publisher.published:,} orders again into Spark's noop sink (the connector alone) ...")
        read_only = _read_only_pass(spark, api, nats, stream, out_dir / "checkpoint_read_only", timeout)
        print(_speed(batches, started, read_only))
        return _report(
            spark, results, publisher, read, batches, read_only, committed, floors, floors_ok, listener, out_dir
        )


def _status(
    batches: list[BatchProgress], read: int, published: int, api: JetStreamApi, stream: str, doing: str, t: float
) -> str:
    """The live line: the last finished batch, or before the first one what Spark is doing."""
    last = batches[-1] if batches else None
    if last is None:
        return f"  {t:5.1f}s  published {published:>9,}  {doing}"
    end_seq = last.end_seq if last.end_seq is not None else 0
    lag = api.stream_info(stream)["state"]["last_seq"] - end_seq
    return (
        f"  {t:5.1f}s  batch {last.batch_id:>3}  published {published:>9,}  "
        f"read {read:>9,}  {last.processed_rate:>8,.0f} rows/s  lag {lag:>7,}"
    )


def _before_first_batch(spark: SparkSession, query: StreamingQuery, checkpoint: Path, warming: bool) -> str:
    """What Spark is doing before the first batch ends, from the checkpoint's offset log and the query's jobs.

    A query's jobs run in a job group named after its run id; a batch's first stage reads the source, one task
    per partition with messages, so its finished tasks say how far the read is without asking the source. The
    demo's stream and checkpoint are new, so batch 0 holds the messages of seqs 1 to its end offset."""
    planned = planned_offset(checkpoint)
    if planned is None:
        return "starting the query and Spark's Python workers" if warming else "starting the query"
    batch, end = planned[0], int(planned[1]["seq"])
    tracker = spark.sparkContext.statusTracker()
    stage_ids = sorted(
        stage
        for job in tracker.getJobIdsForGroup(str(query.runId))
        if (info := tracker.getJobInfo(job))
        for stage in info.stageIds
    )
    stages = [info for info in map(tracker.getStageInfo, stage_ids) if info is not None]
    if not stages:
        return f"planning batch {batch} ({end:,} messages)"
    reading = stages[0]
    if reading.numCompletedTasks < reading.numTasks:
        return (
            f"reading batch {batch} ({end:,} messages): {reading.numCompletedTasks} of {reading.numTasks} "
            "partitions read"
        )
    return f"batch {batch} read ({end:,} messages): from_json, aggregate, parquet write"


@dataclass(frozen=True)
class ReadOnlyPass:
    """The read-only pass of the stream: what the connector reads on this machine, without the pipeline's work."""

    batches: list[BatchProgress]
    seconds: float  # from the query's start to its end
    stored_bytes: int  # the stream's size: the messages as stored, subjects and headers included

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.batches)

    @property
    def busy(self) -> float:
        """Seconds the batches took, from the query's progress (the query's start-up excluded)."""
        return sum(b.duration_ms for b in self.batches) / 1000


def _orders(spark: SparkSession, nats: dict[str, str], stream: str, **options: str) -> DataFrame:
    """The order stream as the pipeline reads it (the read-only pass reads it the same way, without its group and
    per-batch limit)."""
    return (
        spark.readStream.format("jetstream")
        .options(**nats)
        .option("stream", stream)
        .option("includeHeaders", "true")
        .options(**options)
        .load()
    )


def _read_only_pass(
    spark: SparkSession,
    api: JetStreamApi,
    nats: dict[str, str],
    stream: str,
    checkpoint: Path,
    timeout: float,
) -> ReadOnlyPass:
    """Read the whole stream again into Spark's ``noop`` sink (``availableNow``), as a query catching up reads a
    backlog: without a group (nothing on the server changes; the pipeline's ack floors stay where they are) and
    without a per-batch limit, so the figure is the connector's own speed on this machine."""
    began = time.monotonic()
    query = (
        _orders(spark, nats, stream, startingPosition="earliest")
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .queryName("demo_read_only")
        .trigger(availableNow=True)
        .start()
    )
    finished = False
    try:
        with contextlib.suppress(Exception):  # a failed query raises here: its exception() is reported below
            finished = query.awaitTermination(timeout)
        seconds = time.monotonic() - began
        if query.exception() is not None:
            raise JetStreamError(f"The read-only pass failed: {query.exception()}")
        if not finished:
            raise JetStreamError(f"The read-only pass did not finish within {timeout:g}s.")
    finally:
        query.stop()
    batches = [batch for batch in map(batch_progress, query.recentProgress) if batch.rows]
    return ReadOnlyPass(batches, seconds, int(api.stream_info(stream)["state"]["bytes"]))


def _speed(batches: list[BatchProgress], started: float, read_only: ReadOnlyPass) -> str:
    """Where the time went, from the queries' progress: the pipeline's first batch, then its pace per batch
    (reading, from_json, the aggregate and the parquet write together) against the publishing pace, then the
    read-only pass: the connector alone, on the same machine and stream."""
    if not batches:
        return "\n  no batch finished"
    first, rest = batches[0], batches[1:] or batches
    first_done = first.at + first.duration_ms / 1000 - started
    busy = sum(b.duration_ms for b in rest) / 1000
    arriving = [b.input_rate for b in rest if b.input_rate]
    passes = max(len(read_only.batches), 1)
    busy_only, megabytes = max(read_only.busy, 1e-9), read_only.stored_bytes / 1e6
    return (
        f"\n  first batch: {first.rows:,} rows, finished {first_done:.1f}s after the query started "
        "(the query's start-up included)\n"
        f"  then {len(rest)} batches of {sum(b.rows for b in rest) // len(rest):,} rows on average, "
        f"{busy * 1000 / len(rest):,.0f} ms each: Spark processed {sum(b.rows for b in rest) / max(busy, 1e-9):,.0f} "
        f"rows/s (read, from_json, aggregate, parquet write) while they arrived at "
        f"{(sum(arriving) / len(arriving)) if arriving else 0:,.0f} rows/s\n"
        "  read-only pass (the whole stream again into Spark's noop sink, as a query catching up reads it): "
        f"{read_only.rows:,} rows ({megabytes:,.1f} MB as stored) in {_batches(passes, read_only.busy)}: "
        f"the connector read {read_only.rows / busy_only:,.0f} rows/s, "
        f"{megabytes / busy_only:,.1f} MB/s ({read_only.seconds:.1f}s with the query's start)"
    )


def _batches(count: int, seconds: float) -> str:
    """``1 batch of 3,567 ms`` or ``4 batches, 890 ms each``."""
    if count == 1:
        return f"1 batch of {seconds * 1000:,.0f} ms"
    return f"{count} batches, {seconds * 1000 / count:,.0f} ms each"


def _wait_for_floors(api: JetStreamApi, stream: str, checkpoint: Path) -> tuple[bool, int, dict[str, int]]:
    """Spark commits a batch to the source when it plans the next or sits idle: give it a moment."""
    deadline = time.monotonic() + 20
    while True:
        offset = committed_offset(checkpoint)
        committed = offset["seq"] if offset else 0
        floors = {row.consumer: row.ack_floor for row in status(api, stream, GROUP)}
        if (floors and set(floors.values()) == {committed}) or time.monotonic() > deadline:
            return set(floors.values()) == {committed}, committed, floors
        time.sleep(0.2)


def _report(
    spark: SparkSession,
    results: Path,
    publisher: PacedPublisher,
    read: int,
    batches: list[BatchProgress],
    read_only: ReadOnlyPass,
    committed: int,
    floors: dict[str, int],
    floors_ok: bool,
    listener: JetStreamLagListener,
    out_dir: Path,
) -> int:
    from pyspark.sql import functions as F

    totals = publisher.totals
    rows = spark.read.parquet(str(results)).groupBy("region").agg(F.sum("orders"), F.sum("revenue")).collect()
    got = {row[0]: (row[1], row[2]) for row in rows}
    print(f"\n  {'region':<8}{'orders':>10}{'revenue':>16}   published orders / revenue")
    totals_ok = set(got) == set(totals.orders)
    for region in sorted(totals.orders):
        orders_, revenue = got.get(region, (0, 0))
        expected = (totals.orders[region], totals.revenue_cents[region])
        totals_ok &= (orders_, revenue) == expected
        mark = "ok" if (orders_, revenue) == expected else "MISMATCH"
        print(
            f"  {region:<8}{orders_:>10,}{revenue / 100:>16,.2f}   {expected[0]:,} / {expected[1] / 100:,.2f}  {mark}"
        )
    print(f"\n  {'member consumer':<18}{'ack floor':>10}   checkpoint seq {committed:,}")
    for name, floor in sorted(floors.items()):
        print(f"  {name:<18}{floor:>10,}   {'ok' if floor == committed else 'MISMATCH'}")
    plot = None
    try:
        plot = listener.plot(out_dir / "throughput_and_lag.png", title="spark-jetstream demo")
    except ImportError as exc:
        print(f"\n  (no plot: {exc})")
    ok = totals_ok and floors_ok and read == publisher.published == read_only.rows
    print(
        f"\n{'OK' if ok else 'FAILED'}: published {publisher.published:,} orders; Spark read {read:,} rows in "
        f"{len(batches)} batches (and {read_only.rows:,} in the read-only pass); "
        f"revenue by region {'matches' if totals_ok else 'DOES NOT match'} exactly; "
        f"ack floors {'equal' if floors_ok else 'DO NOT equal'} the checkpoint (seq {committed:,})."
    )
    print(f"Output: {results}" + (f"\nPlot:   {plot}" if plot else ""))
    return 0 if ok else 1
