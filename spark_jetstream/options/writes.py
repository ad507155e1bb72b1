"""The options of writes (``df.write`` and ``df.writeStream``): where rows go and how exactly-once is kept."""

from __future__ import annotations

from spark_jetstream.options.option import WRITE, Option
from spark_jetstream.options.parsers import (
    parse_bool,
    parse_duration,
    parse_int,
    parse_name,
    parse_positive_int,
    parse_size,
    parse_subject,
)

WRITES: tuple[Option, ...] = (
    Option(
        "subject",
        parse_subject,
        None,
        "Subject of rows without a `subject` column, or whose `subject` is null.",
        frozenset({WRITE}),
        "sink",
    ),
    Option(
        "deduplicate",
        parse_bool,
        True,
        "Give every message a `Nats-Msg-Id` (the row's `msg_id`, else one derived from the query, batch, "
        "partition and row), so a replayed batch or retried task is stored once (within the stream's duplicate "
        "window); `false` is faster, but a replay or retry stores its messages again.",
        frozenset({WRITE}),
        "sink",
    ),
    Option(
        "expectedStream",
        parse_name,
        None,
        "Every message must be stored by this stream (`Nats-Expected-Stream`); otherwise the write fails.",
        frozenset({WRITE}),
        "sink",
    ),
    Option(
        "progressSubject",
        parse_subject,
        None,
        "Subject prefix of the writer's progress markers (`<prefix>.sjp-<query or write id>.<partition>`), which the "
        "stream the rows go to must capture. On a stream with `allow_atomic` (nats-server 2.12+) each task stores "
        "its rows in atomic batches, each with a marker, so a retry, a speculative copy or a replay at any age "
        "stores every row exactly once; otherwise exactly-once holds within the stream's duplicate window.",
        frozenset({WRITE}),
        "sink",
    ),
    Option(
        "atomicBatchSize",
        parse_int,
        1000,
        "Messages per atomic batch with `progressSubject` (rows and one marker): at most the server's "
        "`jetstream.limits.batch` (1,000 by default).",
        frozenset({WRITE}),
        "sink",
        minimum=2,
    ),
    Option(
        "commitBucket",
        parse_name,
        "spark-jetstream-commits",
        "KV bucket of the streaming writer's committed-batch markers; created when missing.",
        frozenset({WRITE}),
        "sink",
    ),
    Option(
        "commitBucketReplicas",
        parse_positive_int,
        None,
        "Replicas of `commitBucket` when the writer creates it. Default: as many as the target stream has (the "
        "stream `expectedStream` names, or the one that takes the `subject` option's subject), else 1; a bucket "
        "with fewer replicas than the stream loses the markers, and exactly-once with them, with one server.",
        frozenset({WRITE}),
        "sink",
    ),
    Option(
        "publishWindow",
        parse_int,
        4000,
        "Messages a task publishes ahead of their PubAcks.",
        frozenset({WRITE}),
        "sink",
        attr="window",
        minimum=2,
    ),
    Option(
        "publishWindowBytes",
        parse_size,
        32 * 1024 * 1024,
        "Bytes a task publishes ahead of their PubAcks (with `publishWindow`, whichever is reached first; a "
        "larger message is still sent, on its own).",
        frozenset({WRITE}),
        "sink",
        attr="window_bytes",
        minimum=1024,
    ),
    Option(
        "publishTimeout",
        parse_duration,
        30.0,
        "How long a task waits for outstanding PubAcks before it fails.",
        frozenset({WRITE}),
        "sink",
        attr="timeout",
        minimum=0.1,
    ),
)
