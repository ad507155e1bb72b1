"""The CPU Spark's Python workers spend on a multi-batch streaming read: the default group read and
``preservePartitionOrder=false``, 200,000 x 100 B on 8 partitions x 1,024 subjects in 8 batches, each read 3 and 2
times after a warm-up query, against Spark's no-I/O Python source with the connector's schema (``noio``: the same
rows in 8 partitions and one batch, what Spark itself costs), read twice after a warm-up of its own (its workers are
a pool apart). CPU is the sum over the processes of Spark's Python daemons and their workers (reused, so they live
through a read). To compare trees, run it from outside the checkout with ``PYTHONPATH=<tree>``.

    python bench/worker_cpu.py
"""

from __future__ import annotations

import os
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


def main() -> None:
    print(f"package: {spark_jetstream.__file__}; load average at start: {os.getloadavg()[0]:.2f}")
    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    with EmbeddedServer(name="worker-cpu") as server:
        api = JetStreamApi(connect(ConnectionOptions(servers=(server.url,))))
        api.create_stream({**partitioned_stream_config("SHAPES", "ev.*", 8), "allow_direct": True})
        payload = os.urandom(100)
        publish_all(api.conn, ((f"ev.k{i % 1024}", payload, None) for i in range(MESSAGES)))
        spark.dataSource.register(noio_source("noio-workers", 100, MESSAGES, 8))
        for name, extra in READS:
            if extra.get("noio"):
                frame = spark.readStream.format("noio-workers").load()
            else:
                reader = spark.readStream.format("jetstream").options(servers=server.url, stream="SHAPES", **extra)
                frame = reader.option("maxMessagesPerTrigger", str(MESSAGES // BATCHES)).load()
            before, began = worker_cpu(), time.monotonic()
            writer = frame.writeStream.format("noop").option("checkpointLocation", tempfile.mkdtemp())
            writer.trigger(availableNow=True).start().awaitTermination()
            took, cpu = time.monotonic() - began, worker_cpu() - before
            per, load = cpu / MESSAGES * 1e6, os.getloadavg()[0]
            print(f"{name}: {took:.1f} s, workers' CPU {cpu:.2f} s ({per:.2f} us a message), load {load:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
