"""What a long-running pipeline leaves on the server: the subjects and messages of every stream and KV bucket the
connector writes, sampled while it runs, so that its bookkeeping is seen to stay bounded.

One server of its own; messages arrive on the 4-partition stream ``SOAK`` at ``--rate`` a second. Running at once:

* ``atomic``: a group read of ``SOAK`` written to ``OUT`` with ``progressSubject`` (progress markers on
  ``out_progress.sjp-<query id>.<partition>``, ``OUT`` allows rollups), 8 shuffle partitions; stopped and started
  again from its checkpoint halfway (a restart keeps its query id, so its marker subjects);
* ``bucket``: a read of ``SOAK`` without a group written to ``OUT2`` with the KV commit bucket (a key per query id);
* a batch write (``df.write``) with ``progressSubject`` into ``OUT`` every ``--batch-write-every`` seconds: each is a
  write id of its own, whose markers go when it ends.

Every ``--sample-every`` seconds it prints, per stream: messages and subjects, and the consumers of ``SOAK``. The
bookkeeping (marker subjects and messages, commit keys and messages, consumers) must be the same at the end as after
the first sample; the data streams grow with the data.

    python bench/soak.py [--minutes 10] [--rate 200] [--sample-every 60] [--batch-write-every 20]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.testing import EmbeddedServer

BUCKET = "spark-jetstream-commits"


def bookkeeping(api: JetStreamApi) -> dict[str, int]:
    """What the connector keeps for itself: marker subjects and messages in ``OUT``, commit keys and messages, and the
    consumers on ``SOAK``."""
    out = api.call(("STREAM", "INFO", "OUT"), {"subjects_filter": "out_progress.>"}, "Stream 'OUT'", "OUT")
    markers = out["state"].get("subjects") or {}
    commits = api.stream_info(f"KV_{BUCKET}")["state"]
    return {
        "marker subjects": len(markers),
        "marker messages": sum(markers.values()),
        "commit keys": int(commits.get("num_subjects", 0)),
        "commit messages": int(commits["messages"]),
        "consumers on SOAK": int(api.stream_info("SOAK")["state"].get("consumer_count", 0)),
    }


def streams(api: JetStreamApi) -> dict[str, tuple[int, int]]:
    """Every stream's (messages, subjects)."""
    found = {}
    for name in sorted(api.stream_names()):
        state = api.stream_info(name)["state"]
        found[name] = (int(state["messages"]), int(state.get("num_subjects", 0)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0, help="messages a second into SOAK")
    parser.add_argument("--sample-every", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--batch-write-every", type=float, default=20.0, help="seconds between batch writes")
    args = parser.parse_args()
    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    builder = builder.config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "8")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    with EmbeddedServer(name="soak") as server:
        options = ConnectionOptions(servers=(server.url,))
        api = JetStreamApi(connect(options))
        api.create_stream({**partitioned_stream_config("SOAK", "soak.*", 4), "allow_direct": True})
        out = {"subjects": ["out.>", "out_progress.>"], "allow_atomic": True, "allow_rollup_hdrs": True}
        api.create_stream({"name": "OUT", **out})
        api.create_stream({"name": "OUT2", "subjects": ["out2.>"]})
        stop = threading.Event()

        def publish() -> None:
            sent, begun = 0, time.monotonic()
            while not stop.is_set():
                publish_all(api.conn, [(f"soak.k{sent % 512}", b"x" * 100, None)])
                sent += 1
                time.sleep(max(0.0, begun + sent / args.rate - time.monotonic()))

        def read(**extra: str) -> DataFrame:
            return spark.readStream.format("jetstream").options(servers=server.url, stream="SOAK", **extra).load()

        folder = tempfile.mkdtemp(prefix="soak-")

        def atomic() -> StreamingQuery:
            rows = read(group="g").selectExpr("concat('out.', subject) AS subject", "data").repartition(8)
            writer = rows.writeStream.format("jetstream").options(servers=server.url, progressSubject="out_progress")
            return writer.option("checkpointLocation", f"{folder}/atomic").start()

        rows = read().selectExpr("concat('out2.', subject) AS subject", "data")
        bucket = rows.writeStream.format("jetstream").option("servers", server.url)
        queries = {"atomic": atomic(), "bucket": bucket.option("checkpointLocation", f"{folder}/bucket").start()}
        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        begun = time.monotonic()
        next_sample, next_write, restarted, writes, first = begun + 30, begun, False, 0, None
        print(f"{'t (s)':>6}  " + "  ".join(f"{k:>17}" for k in ("marker subjects", "marker messages", "commit keys")))
        while (now := time.monotonic()) < begun + args.minutes * 60:
            if now >= next_write:
                batch = spark.range(0, 1000, 1, 4).selectExpr("'out.batch' AS subject", "CAST(id AS STRING) AS data")
                batch.write.format("jetstream").options(servers=server.url, progressSubject="out_progress").mode(
                    "append"
                ).save()
                writes += 1
                next_write = now + args.batch_write_every
            if not restarted and now >= begun + args.minutes * 30:
                queries["atomic"].stop()
                queries["atomic"] = atomic()
                restarted = True
            for name, query in queries.items():
                if query.exception() is not None:
                    raise SystemExit(f"query {name} failed: {query.exception()}")
            if now >= next_sample:
                kept = bookkeeping(api)
                first = first or kept
                shown = "  ".join(f"{kept[k]:>17}" for k in ("marker subjects", "marker messages", "commit keys"))
                print(f"{now - begun:6.0f}  {shown}  consumers {kept['consumers on SOAK']}, {writes} batch writes")
                next_sample = now + args.sample_every
            time.sleep(0.5)
        stop.set()
        publisher.join()
        for query in queries.values():
            query.processAllAvailable()
        last = bookkeeping(api)
        every = streams(api)
        print("\nat the end, every stream (messages, subjects):")
        for name, (messages, subjects) in every.items():
            print(f"  {name:<28}{messages:>10}{subjects:>10}")
        rows = every["OUT"][0] - writes * 1000 - last["marker messages"]
        print(
            f"\nrows read and written once: SOAK {every['SOAK'][0]}, OUT {rows} (less the batch writes and markers), "
            f"OUT2 {every['OUT2'][0]}"
        )
        print("\nbookkeeping after the first sample -> at the end:")
        for key, value in last.items():
            held = first is not None and first[key] == value
            print(f"  {key:<20}{first[key] if first else '-':>8} -> {value:<8} {'same' if held else 'CHANGED'}")
        for query in queries.values():
            query.stop()
        disconnect(options)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
