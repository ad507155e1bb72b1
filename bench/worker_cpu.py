"""The CPU Spark's Python workers spend on a multi-batch streaming read: the default group read and
``preservePartitionOrder=false``, 200,000 x 100 B on 8 partitions x 1,024 subjects in 8 batches, each read 3 and 2
times after a warm-up query, against Spark's no-I/O Python source with the connector's schema (``noio``: the same
rows in 8 partitions and one batch, what Spark itself costs), read twice after a warm-up of its own (its workers are
a pool apart). CPU is the sum over the processes of Spark's Python daemons and their workers (reused, so they live
through a read). To compare trees, run it from outside the checkout with ``PYTHONPATH=<tree>``.

``--slope`` measures instead the workers' CPU per message as a slope: each read of 100,000 and of 800,000 messages
(both in 8 batches, so the batches' fixed costs cancel), the default group read, ``readMode=pull`` and
``preservePartitionOrder=false`` against the no-I/O source, in ``--rounds`` interleaved rounds; it prints each
read's median slope and what it costs beyond the no-I/O source's.

    python bench/worker_cpu.py
    python bench/worker_cpu.py --slope --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from noio import noio_source
from pyspark.sql import SparkSession

import spark_jetstream
from spark_jetstream.client.connection import ConnectionOptions, connect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.testing import EmbeddedServer

MESSAGES = 200_000
BATCHES = 8
READS = [("warm-up", {"group": "w"})]
READS += [(f"group, default, run {r + 1}", {"group": f"g{r}"}) for r in range(3)]
READS += [(f"group, preservePartitionOrder=false, run {r + 1}", {"group": f"p{r}", "preservePartitionOrder": "false"})
          for r in range(2)]  # fmt: skip
READS += [("no-I/O warm-up", {"noio": "yes"})]
READS += [(f"Spark's no-I/O source, run {r + 1}", {"noio": "yes"}) for r in range(2)]


def worker_cpu() -> float:
    """CPU seconds so far of every process of Spark's Python daemons."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"pyspark.daemon" not in cmdline.read():
                    continue
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:  # gone meanwhile
            continue
    return total / os.sysconf("SC_CLK_TCK")


SLOPE_SIZES = (100_000, 800_000)
SLOPE_READS = {
    "group, default": {},
    "group, readMode=pull": {"readMode": "pull"},
    "group, preservePartitionOrder=false": {"preservePartitionOrder": "false"},
    "Spark's no-I/O source": {"noio": "yes"},
}


def fill(api: JetStreamApi, stream: str, count: int) -> None:
    """``count`` x 100 B on 8 partitions x 1,024 subjects."""
    api.create_stream({**partitioned_stream_config(stream, f"{stream.lower()}.*", 8), "allow_direct": True})
    payload = os.urandom(100)
    publish_all(api.conn, ((f"{stream.lower()}.k{i % 1024}", payload, None) for i in range(count)))


def read(spark: SparkSession, url: str, stream: str, count: int, extra: dict[str, str]) -> tuple[float, float]:
    """Seconds and workers' CPU seconds of one ``availableNow`` read of ``count`` messages in 8 batches."""
    if extra.get("noio"):
        frame = spark.readStream.format(f"noio-{count}").load()
    else:
        reader = spark.readStream.format("jetstream").options(servers=url, stream=stream, **extra)
        frame = reader.option("maxMessagesPerTrigger", str(count // BATCHES)).load()
    before, began = worker_cpu(), time.monotonic()
    writer = frame.writeStream.format("noop").option("checkpointLocation", tempfile.mkdtemp())
    writer.trigger(availableNow=True).start().awaitTermination()
    return time.monotonic() - began, worker_cpu() - before


def fixed(spark: SparkSession, url: str) -> None:
    """The default: 200,000 messages, each read in ``READS`` once, CPU per message."""
    for name, extra in READS:
        took, cpu = read(spark, url, "SHAPES", MESSAGES, extra)
        per, load = cpu / MESSAGES * 1e6, os.getloadavg()[0]
        print(f"{name}: {took:.1f} s, workers' CPU {cpu:.2f} s ({per:.2f} us a message), load {load:.2f}")


def slope(spark: SparkSession, url: str, rounds: int) -> None:
    """``--slope`` (module doc): a warm-up of each read, then ``rounds`` rounds of every read at both sizes."""
    slopes: dict[str, list[float]] = {name: [] for name in SLOPE_READS}
    streams = {count: f"S{count // 1000}K" for count in SLOPE_SIZES}
    for index in range(rounds + 1):
        for read_index, (name, extra) in enumerate(SLOPE_READS.items()):
            cpu, took = {}, {}
            for count in SLOPE_SIZES:
                options = extra if extra.get("noio") else {**extra, "group": f"g{index}-{read_index}-{count}"}
                took[count], cpu[count] = read(spark, url, streams[count], count, options)
            per = (cpu[SLOPE_SIZES[1]] - cpu[SLOPE_SIZES[0]]) / (SLOPE_SIZES[1] - SLOPE_SIZES[0]) * 1e6
            label = "warm-up" if index == 0 else f"round {index}"
            print(f"{label}, {name}: workers' CPU {cpu[SLOPE_SIZES[0]]:.2f} s and {cpu[SLOPE_SIZES[1]]:.2f} s "
                  f"({took[SLOPE_SIZES[0]]:.1f} s and {took[SLOPE_SIZES[1]]:.1f} s), "
                  f"slope {per:.2f} us a message, load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
            if index:
                slopes[name].append(per)
    base = statistics.median(slopes["Spark's no-I/O source"])
    print(f"median slope over {rounds} rounds, us a message (beyond the no-I/O source's {base:.2f}):")
    for name, values in slopes.items():
        median = statistics.median(values)
        print(f"  {name}: {median:.2f} ({median - base:+.2f}), rounds {', '.join(f'{v:.2f}' for v in values)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slope", action="store_true", help="the per-message slope over 100,000 and 800,000")
    parser.add_argument("--rounds", type=int, default=5, help="--slope: rounds after the warm-up (5)")
    args = parser.parse_args()
    print(f"package: {spark_jetstream.__file__}; load average at start: {os.getloadavg()[0]:.2f}")
    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    with EmbeddedServer(name="worker-cpu") as server:
        api = JetStreamApi(connect(ConnectionOptions(servers=(server.url,))))
        for count in SLOPE_SIZES if args.slope else (MESSAGES,):
            spark.dataSource.register(noio_source(f"noio-{count}", 100, count, 8))
            if not args.slope:
                fill(api, "SHAPES", count)
        if args.slope:
            for count in SLOPE_SIZES:
                fill(api, f"S{count // 1000}K", count)
            slope(spark, server.url, args.rounds)
        else:
            fixed(spark, server.url)
    spark.stop()


if __name__ == "__main__":
    main()
