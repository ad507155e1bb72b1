"""``groupless``: a streaming read without a group next to the grouped one on the same stream (see ``bench/run.py``).

Two streams of ``--messages`` x 100 B: 4 partitions with Direct Get, and one made with a client's defaults (no
transform, no Direct Get: both reads go through consumers). ``availableNow`` into ``noop`` in batches of a tenth of
the stream, each contender once per round, the best round kept. The driver's requests per micro-batch are counted
by the server: the messages the query's own connection (``spark-jetstream query``, one per query run) published,
from ``/connz``.
"""

from __future__ import annotations

import json
import urllib.request

from common import Cpu, heading, messages, print_rows, publish, rate, run_spark
from suite import SIZE, Measurement, Suite, Summary, start_session

ROUNDS = 3
TARGET = 1.0
"""Without a group at least as fast as with one (the issue's goal)."""
QUERY_CONNECTION = "spark-jetstream query"


def connections(monitor: str) -> dict[int, tuple[str, int]]:
    """Every connection the server knows, open or recently closed: cid -> (name, messages it published)."""
    with urllib.request.urlopen(f"{monitor}/connz?state=any&limit=100000", timeout=10) as reply:
        listed = json.load(reply)["connections"] or []
    return {c["cid"]: (c.get("name", ""), c.get("in_msgs", 0)) for c in listed}


def run(suite: Suite) -> None:
    args = suite.args
    count = args.messages
    per_trigger = max(1, count // 10)
    heading(f"groupless: {count:,} x {SIZE} B, availableNow in batches of {per_trigger:,} into noop")
    suite.fresh_stream("GL_PART", "glp.*", 4)
    if "GL_PLAIN" in suite.api.stream_names():
        suite.api.delete_stream("GL_PLAIN")
    suite.api.create_stream({"name": "GL_PLAIN", "subjects": ["glplain.>"], "storage": args.storage})
    for stream, prefix in (("GL_PART", "glp"), ("GL_PLAIN", "glplain")):
        batch = ((f"{prefix}.{subject.split('.')[-1]}", payload, None) for subject, payload, _ in messages(count, SIZE))
        print(f"  {stream}: published in {publish(suite.conn, stream, batch, count):.1f} s", flush=True)
    spark = start_session(suite, "groupless")
    best: dict[str, tuple[int, float, int, Cpu]] = {}
    requests: dict[str, float] = {}  # contender -> the driver's requests per micro-batch in its best round
    try:
        for round_ in range(1, ROUNDS + 1):
            for stream in ("GL_PART", "GL_PLAIN"):
                for group in (f"gl{round_}", None):  # a new group each round: made by its query
                    name = f"{stream}, {'with a group' if group else 'without a group'}"
                    before = connections(suite.monitor)
                    watch = Measurement(suite, f"groupless: {name}, round {round_}", spark)
                    checkpoint = suite.checkpoint(f"gl-{stream}-{group}-{round_}")
                    result = run_spark(spark, suite.url, stream, group, checkpoint, per_trigger)
                    cpu = watch.stop()
                    if result.messages != count:
                        raise SystemExit(f"FAILED: {name} read {result.messages:,} of {count:,}")
                    driver = sum(
                        published
                        for cid, (label, published) in connections(suite.monitor).items()
                        if label == QUERY_CONNECTION and cid not in before
                    )
                    print(
                        f"  round {round_}, {name}: {rate(count, result.seconds):,.0f} rows/s, {result.batches} "
                        f"batches, the driver's requests {driver / max(result.batches, 1):,.1f} per batch",
                        flush=True,
                    )
                    if name not in best or result.seconds < best[name][1]:
                        best[name] = (count, result.seconds, result.batches, cpu)
                        requests[name] = driver / max(result.batches, 1)
    finally:
        spark.stop()
    print_rows([(name, *figures) for name, figures in best.items()])
    print(
        "  the driver's requests per micro-batch (best round): "
        + "; ".join(f"{n} {r:,.1f}" for n, r in requests.items())
    )
    for stream in ("GL_PART", "GL_PLAIN"):
        without = rate(*best[f"{stream}, without a group"][:2])
        with_group = rate(*best[f"{stream}, with a group"][:2])
        suite.summary.append(
            Summary(
                f"groupless {stream}: without vs with a group (rows/s)",
                without,
                with_group,
                "rows/s",
                f">= {TARGET:g}x",
                without / with_group >= TARGET,
            )
        )
        suite.summary.append(
            Summary(
                f"groupless {stream}: the driver's requests per batch, without vs with a group",
                requests[f"{stream}, without a group"],
                requests[f"{stream}, with a group"],
                "requests",
            )
        )
    for stream in ("GL_PART", "GL_PLAIN"):
        suite.api.delete_stream(stream)
