"""What the query-level fault tests share (``test_leader_change_query.py``: crashes and clean shutdowns;
``test_silent_faults_query.py``: frozen and partitioned servers): a stream of the fault's own on the cluster, a
publisher feeding it, a streaming query through a group into parquet, and the checks after the fault."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path

from helpers import wait_for
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import ApiError
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.testing import (
    EmbeddedCluster,
    Publisher,
    commits,
    inject_fault,
    longest_commit_gap,
    wait_healthy,
    writable_again,
)

RATE = 400
"""Messages per second published throughout a test."""
PARTITIONS = 4
GROUP = "g"
CONSUMERS = [f"{GROUP}-{p}" for p in range(PARTITIONS)]
DOWN = 5.0
"""Seconds from the fault to the victim's restart on its store."""
SETTLE = 2.0
"""Seconds of steady reading before the fault."""
AFTER = 3.0
"""Seconds of publishing after the victim is back (its catch-up happens under load)."""
WAIT = 90.0
"""Seconds to wait for anything that should come (an election, new rows, the last commit): not a timing check,
only a bound on a test that would otherwise hang."""
RECOVERY_BOUND = 15.0
"""Seconds within which new rows are committed after the stream takes writes again: the connection's API
deadline, which no wait on the batches' path may run out (the target, 5 s, is the benchmark's)."""

PARTITION = "partition"
"""A fault that cuts the server off (``EmbeddedCluster.partition``) instead of signalling it."""
FROZEN = 15.0
"""Seconds a frozen server stays frozen: longer than an election (2-5 s) plus the connections' silence timeout
(3 s) and a batch, so rows committed before the thaw were read without the frozen server."""


class ElectedFirst(AssertionError):
    """A killed consumer leader's successor came before the query committed new rows: the query may have waited for
    it, or only have been slow (a loaded machine, an election of 3.9 s); the caller injects the fault again."""


def create_stream(api: JetStreamApi, name: str, subjects: str) -> None:
    """An R3 stream; right after an earlier test's restart a server may not be counted as a peer yet."""

    def created() -> bool:
        with contextlib.suppress(ApiError):
            api.create_stream(partitioned_stream_config(name, subjects, PARTITIONS, num_replicas=3, storage="file"))
            return True
        return False

    wait_for(created, WAIT, f"the R3 stream {name} to be created", poll=1.0)


def start_query(spark: SparkSession, servers: str, stream: str, work: Path) -> StreamingQuery:
    return (
        spark.readStream.format("jetstream")
        .option("servers", servers)
        .option("stream", stream)
        .option("group", GROUP)
        .option("maxMessagesPerTrigger", 2000)
        .load()
        .select("seq", "subject", "data")
        .writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "cp"))
        .trigger(processingTime="1 second")
        .start()
    )


def count_failed_tasks(spark: SparkSession, query: StreamingQuery) -> int:
    """Failed task attempts in the query's jobs (Spark runs them in a job group named after the run id)."""
    tracker = spark.sparkContext.statusTracker()
    jobs = tracker.getJobIdsForGroup(str(query.runId))
    assert jobs, "no job of the query found: failed tasks cannot be counted"
    stages = [stage for job in jobs if (info := tracker.getJobInfo(job)) is not None for stage in info.stageIds]
    return sum(info.numFailedTasks for stage in stages if (info := tracker.getStageInfo(stage)) is not None)


class Running:
    """The query is the one started, still running: active, no exception, the same run id."""

    def __init__(self, spark: SparkSession, query: StreamingQuery) -> None:
        self.spark, self.query, self.run_id = spark, query, query.runId

    def check(self) -> None:
        assert self.query.exception() is None, f"the query failed: {self.query.exception()}"
        assert self.query.isActive, "the query stopped"
        assert [q.runId for q in self.spark.streams.active] == [self.run_id], "the query was restarted"

    def wait_for(self, done, what: str | Callable[[], str]) -> None:
        """The shared ``wait_for``, up to ``WAIT`` seconds, checking all along that the query still runs (``check``)."""
        wait_for(done, WAIT, what, poll=0.2, check=self.check)


def where_it_stands(query: StreamingQuery, api: JetStreamApi, stream: str, checkpoint: Path) -> str:
    """What a wait that timed out found: the last commits, the query's last progress (offsets, the batch's
    durations), the stream's state as its leader answers it: a stall named in the failure, not guessed after it."""
    progress = query.lastProgress or {}
    sources = [
        {key: source.get(key) for key in ("startOffset", "endOffset", "latestOffset", "numInputRows")}
        for source in progress.get("sources", [])
    ]
    try:
        state = api.stream_info(stream)["state"]
        shown = {key: state.get(key) for key in ("first_seq", "last_seq", "messages")}
    except Exception as exc:  # a clue, not the failure
        shown = {"stream info failed": repr(exc)}
    try:
        committed = commits(checkpoint)[-3:]
    except Exception as exc:
        committed = [repr(exc)]
    return (
        f"last commits {committed}; last progress at {progress.get('timestamp')}: batch "
        f"{progress.get('batchId')}, durations {progress.get('durationMs')}, sources {sources}; stream {shown}; "
        f"query status {query.status}"
    )


def ride_through(
    case: str,
    fault: str,
    how: signal.Signals | str,
    spark: SparkSession,
    nats_cluster: EmbeddedCluster,
    api: JetStreamApi,
    tmp_path: Path,
) -> None:
    """One fault (``inject_fault``'s ``fault``, by signal ``how`` or ``PARTITION``) while a query reads a stream of
    its own that a publisher feeds: the checks of the module docstrings of the tests that call it."""
    partition = how == PARTITION
    sig = None if partition else how
    stream = "LQ_" + case.replace("-", "_").upper()
    prefix = stream.lower()
    create_stream(api, stream, f"{prefix}.*")
    checkpoint = tmp_path / "cp"
    publisher = Publisher([s.url for s in nats_cluster.servers], RATE, prefix=prefix, record=True).start()
    query = start_query(spark, nats_cluster.urls, stream, tmp_path)
    running = Running(spark, query)
    try:
        running.wait_for(lambda: len(commits(checkpoint)) >= 3, "three batches before the fault")
        assert wait_healthy(api, stream, CONSUMERS, WAIT), "the stream and its members never had current replicas"
        time.sleep(SETTLE)

        silent = partition or sig == signal.SIGSTOP
        down = FROZEN if silent else DOWN
        injected = inject_fault(fault, api, nats_cluster, stream, CONSUMERS, publisher, down, WAIT, sig, partition)
        new_rows: list[float] = []

        def new_rows_committed() -> bool:
            again = writable_again(publisher, injected)
            if again is None or time.time() < again[0] + 1.0:  # a longer stall would have shown by now
                return False
            new_rows.extend(t - injected.at for t, seq in commits(checkpoint) if t > injected.at and seq >= again[1])
            return bool(new_rows)

        running.wait_for(new_rows_committed, "a committed batch with rows stored after the stall")
        again = writable_again(publisher, injected)
        assert again is not None
        writable = again[0] - injected.at
        recovery = new_rows[0] - writable
        assert injected.watcher is not None
        running.wait_for(lambda: not injected.watcher.is_alive(), "the successor's election and the victim's restart")
        assert injected.victim is not None and injected.victim.process is not None
        assert injected.failed is None, injected.failed
        assert injected.victim.process.poll() is None, (
            f"the victim did not stay up after its restart:\n{injected.victim.log_tail()}"
        )
        assert injected.restarted is not None
        restarted_at = time.monotonic()
        running.wait_for(lambda: time.monotonic() - restarted_at >= AFTER, "publishing after the restart")

        publisher.stop()
        last = api.stream_info(stream)["state"]["last_seq"]
        running.wait_for(
            lambda: any(seq == last for _, seq in commits(checkpoint)),
            lambda: f"a commit through seq {last}; {where_it_stands(query, api, stream, checkpoint)}",
        )
        running.wait_for(
            lambda: (
                {c: api.consumer_info(stream, c)["ack_floor"]["stream_seq"] for c in CONSUMERS}
                == dict.fromkeys(CONSUMERS, last)
            ),
            f"every member's ack floor at the checkpoint's last offset {last}",
        )
        running.check()
        failed_tasks = count_failed_tasks(spark, query)
        query.stop()
        times = [t for t, _ in commits(checkpoint)]
        gap = longest_commit_gap(times, injected.at, injected.at + new_rows[0])
        print(
            f"\n{case}: victim {injected.victim_name} led {injected.led}; "
            f"successor after {injected.elected or -1:.1f} s, victim restarted after {injected.restarted:.1f} s; "
            f"the stream took writes again {writable:.1f} s after the fault, the first message stored then was "
            f"committed {recovery:.1f} s later; longest time without a commit {gap:.1f} s; "
            f"publishes retried {publisher.retries}; failed tasks {failed_tasks}; {last} messages"
        )
        assert recovery < RECOVERY_BOUND, f"new rows committed {recovery:.1f} s after the stream took writes again"
        if silent:
            assert new_rows[0] < injected.restarted, (
                f"the query committed new rows only {new_rows[0]:.1f} s after the fault, after the server was back "
                f"({injected.restarted:.1f} s)"
            )
        elected_first = None
        if fault == "consumer leader" and sig == signal.SIGKILL:  # its election takes seconds: rows come meanwhile
            assert injected.elected is not None, "no successor of the killed consumer leader seen"
            if new_rows[0] >= injected.elected:  # checked last: the output is checked whatever the answer
                elected_first = (
                    f"member consumer {CONSUMERS[0]}'s new leader ({injected.elected:.1f} s after the fault) came "
                    f"before the query committed new rows ({new_rows[0]:.1f} s)"
                )

        assert commits(checkpoint)[-1][1] == last
        published = publisher.messages
        assert published is not None
        state = api.stream_info(stream)["state"]
        assert (state["first_seq"], state["last_seq"], state["messages"]) == (1, last, len(published)), (
            "the publisher's record does not match the stream (a publish it gave up on was stored)"
        )
        rows = spark.read.parquet(str(tmp_path / "out")).collect()
        output = {row.seq: (row.subject, bytes(row.data)) for row in rows}
        assert len(rows) == len(output), f"{len(rows) - len(output)} messages written twice"
        missing = sorted(set(published) - set(output))
        extra = sorted(set(output) - set(published))
        assert not missing and not extra, f"missing seqs {missing[:20]} ({len(missing)}), extra {extra[:20]}"
        assert output == published
        assert failed_tasks == 0, f"{failed_tasks} task attempts failed (with local[2] the query would have failed)"
        if elected_first is not None:
            raise ElectedFirst(elected_first)
    finally:
        query.stop()
        publisher.stop()
        with contextlib.suppress(Exception):  # the next test's load
            api.delete_stream(stream)
