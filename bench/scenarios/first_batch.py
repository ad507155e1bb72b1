"""``first-batch``: ``load()`` plus the first batch in a fresh process (``bench/first_batch.py``)."""

from __future__ import annotations

import first_batch
from common import SUBJECTS, heading, publish
from suite import SIZE, Suite, Summary

FIRST_BATCH_MESSAGES = 100_000
FIRST_BATCH_TARGET = 1.3  # load() plus the first batch, against a Python source that does no I/O


def run(suite: Suite) -> None:
    """Time to the first batch in a fresh process (bench/first_batch.py), 100,000 messages waiting:
    the connector against a Python source that does no I/O (every Python source's floor) and Spark's
    ``rate`` source, three interleaved rounds, medians."""
    heading(f"first batch: load() + first batch in a fresh process, {FIRST_BATCH_MESSAGES:,} messages waiting")
    suite.fresh_stream("FIRST", "first.*", 4)
    payload, count = b"x" * SIZE, FIRST_BATCH_MESSAGES
    publish(suite.conn, "first-batch", ((f"first.k{i % SUBJECTS}", payload, None) for i in range(count)), count)
    runs = first_batch.measure(suite.url, "FIRST", FIRST_BATCH_MESSAGES, rounds=3, log=False)
    first_batch.print_table(runs)
    connector, floor = first_batch.together(runs["jetstream"]), first_batch.together(runs["python-noio"])
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
    suite.api.delete_stream("FIRST")
