"""Speculative execution against a real two-host Spark cluster: a speculative copy of a slow member's
task reads the member again (UNPIN, RESET) while the stalled original holds the pin with its range
delivered and unacked; the copy's output is the one kept and it is exact.

Spark never starts a speculative copy on the host of the running attempt, so ``local[*]`` and
``local-cluster`` (one host) never speculate. Here a standalone Master and two Workers bound to
127.0.0.2 and 127.0.0.3 give Spark two hosts on one machine; executors take their worker's host.
The query runs in a child process (this file run as a script) because a process holds one
SparkContext and the suite's local session may already exist.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for

from spark_jetstream.testing import HOSTS, StandaloneCluster, kill_tree

pytestmark = pytest.mark.slow

STALL_SECONDS = 60.0
"""The first attempt of member 0's task stalls at its first row until Spark kills it (this is a cap): whatever
the speculation threshold on a loaded machine, the copy finishes first, so every row of member 0 that the
query commits was read by the copy (measured: after the original had pulled its whole range, unacked)."""


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """One cluster for the module's jobs (a Master and two Workers are three JVM starts); each job is an app of
    its own, with executors of its own."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.close()


TaskKey = tuple[int, int, int]
"""(stage id, task index, attempt number)"""


def task_events(event_log_dir: Path) -> tuple[dict[TaskKey, dict[str, Any]], dict[TaskKey, tuple[dict[str, Any], str]]]:
    """Task starts (task info) and ends (task info, end reason) from Spark's event log (uncompressed, not rolled)."""
    starts: dict[TaskKey, dict[str, Any]] = {}
    ends: dict[TaskKey, tuple[dict[str, Any], str]] = {}
    for path in event_log_dir.iterdir():
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] in ("SparkListenerTaskStart", "SparkListenerTaskEnd"):
                info = event["Task Info"]
                key = (event["Stage ID"], info["Index"], info["Attempt"])
                if event["Event"] == "SparkListenerTaskStart":
                    starts[key] = info
                else:
                    ends[key] = (info, event["Task End Reason"]["Reason"])
    return starts, ends


@pytest.mark.parametrize("read_mode", ["auto", "pull"])
def test_a_speculative_copy_of_a_slow_member_takes_over_and_the_output_is_exact(
    read_mode, standalone, nats_server, api, make_stream, tmp_path
):
    """``auto`` reads the stream (it has Direct Get) with Direct Get; ``pull`` makes the copy UNPIN and RESET the
    member consumer while the stalled original holds the pin."""
    stream = make_stream(20_000, partitions=2)
    out, checkpoint, events, result = (tmp_path / name for name in ("out", "cp", "events", "rows.json"))
    events.mkdir()
    command = [sys.executable, __file__, "--master", standalone.url, "--servers", nats_server.url,
               "--stream", stream.name, "--group", stream.group, "--out", str(out), "--checkpoint", str(checkpoint),
               "--events", str(events), "--result", str(result), "--read-mode", read_mode]  # fmt: skip
    job = subprocess.Popen(
        command,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = job.communicate(timeout=400)
    finally:
        kill_tree(job)
    text = output.decode(errors="replace")
    assert job.returncode == 0, text[-4000:] + standalone.log("worker0")

    # Spark really ran a speculative copy on the other host, and the copy's result is the one kept.
    starts, ends = task_events(events)
    assert {info["Host"] for info in starts.values()} == set(HOSTS)
    won = [key for key, (info, reason) in ends.items() if info["Speculative"] and reason == "Success"]
    assert won, f"no speculative attempt succeeded: {sorted(starts)}"
    for stage, index, attempt in won:
        original, copy = starts[(stage, index, 0)], starts[(stage, index, attempt)]
        assert not original["Speculative"] and original["Host"] != copy["Host"]
        # The original never succeeded: it was killed (its end event may come after the event log closed).
        assert ends.get((stage, index, 0), (original, "TaskKilled"))[1] == "TaskKilled"

    # Every message exactly once in the committed output.
    rows = json.loads(result.read_text())
    assert len(rows) == len(stream.messages)
    assert sorted(map(tuple, rows)) == sorted((part, seq) for seq, (_, _, _, part) in stream.messages.items())

    # The ack floors equal the checkpoint.
    offsets = [p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()]
    last = max(offsets, key=lambda p: int(p.name))
    assert json.loads(last.read_text().splitlines()[2])["seq"] == stream.last_seq
    floors = {api.consumer_info(stream.name, stream.consumer(p))["ack_floor"]["stream_seq"] for p in range(2)}
    assert floors == {stream.last_seq}


def _job() -> None:
    """The driver: a streaming query on the standalone cluster whose member 0 stalls in its first attempts."""
    parser = argparse.ArgumentParser()
    for name in ("master", "servers", "stream", "group", "out", "checkpoint", "events", "result", "read-mode"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    spark = (
        SparkSession.builder.master(args.master)
        .appName("spark-jetstream-speculation")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "1g")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "100ms")
        .config("spark.speculation.quantile", "0.5")  # one of the two tasks done is enough
        .config("spark.speculation.multiplier", "2")
        .config("spark.speculation.minTaskRuntime", "1s")
        # The efficiency check compares input-record rates, which Python data sources do not report.
        .config("spark.speculation.efficiency.enabled", "false")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", args.events)
        .config("spark.eventLog.compress", "false")
        .config("spark.eventLog.rolling.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")

    def executors():
        return spark.sparkContext._jsc.sc().getExecutorMemoryStatus()

    wait_for(  # the driver's block manager and one executor per host
        lambda: executors().size() >= 3,
        180,
        lambda: f"executors to register: {executors().keys().toString()}",
        poll=0.2,
    )
    print("executors:", executors().keys().toString(), flush=True)
    stall = STALL_SECONDS

    @F.udf(LongType())
    def stall_first_attempt_of_member_0(partition: int, seq: int) -> int:
        from pyspark import TaskContext

        context = TaskContext.get()
        key = f"_stalled_{context.stageId()}_{context.partitionId()}"
        if partition == 0 and context.attemptNumber() == 0 and key not in globals():
            globals()[key] = True
            time.sleep(stall)
        return seq

    rows = (
        spark.readStream.format("jetstream")
        .option("servers", args.servers)
        .option("stream", args.stream)
        .option("group", args.group)
        .option("maxMessagesPerTrigger", 10_000)
        .option("readMode", args.read_mode)
        .load()
        .withColumn("seq", stall_first_attempt_of_member_0("partition", "seq"))
    )
    query = (
        rows.writeStream.format("parquet")
        .option("path", args.out)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    written = spark.read.parquet(args.out).select("partition", "seq").collect()
    Path(args.result).write_text(json.dumps([[r.partition, r.seq] for r in written]))
    spark.stop()


if __name__ == "__main__":
    _job()
