"""The options of reads (``spark.readStream`` and ``spark.read``): what to read, from where to where, how fast,
how it is split into Spark partitions and handed to Spark."""

from __future__ import annotations

from spark_jetstream.options.option import BATCH, READ, STREAM, WRITE, Option
from spark_jetstream.options.parsers import (
    parse_bool,
    parse_duration,
    parse_end_position,
    parse_int,
    parse_name,
    parse_position,
    parse_positive_int,
    parse_read_mode,
    parse_size,
    parse_subject_filters,
    parse_timestamp,
)

READS: tuple[Option, ...] = (
    Option(
        "stream",
        parse_name,
        None,
        "The JetStream stream to read (or `bucket`).",
        READ,
        "read",
    ),
    Option(
        "bucket",
        parse_name,
        None,
        "A KV bucket to read instead of a stream: every change (put, delete, purge) in revision order, rows `key, "
        "value, revision, created, operation`; no group needed.",
        READ | {WRITE},
        "read",
        batch_doc="A KV bucket to read instead of a stream: its live keys' latest values (with `includeHistory`, "
        "every revision), rows `key, value, revision, created, operation`.",
        write_doc="A KV bucket to write instead of a stream: rows `key`, `value` (null: delete the key) and optional "
        "`revision` (compare-and-set: the write fails when the key has moved on).",
    ),
    Option(
        "keys",
        parse_subject_filters,
        None,
        "With `bucket`: comma-separated key filters (`*` and `>` over the key's dot-separated tokens); only "
        "matching keys are read.",
        READ,
        "read",
    ),
    Option(
        "includeHistory",
        parse_bool,
        False,
        "With `bucket`: every stored revision of each key, deletes and purges included, instead of the live keys' "
        "latest values.",
        frozenset({BATCH}),
        "read",
    ),
    Option(
        "subjects",
        parse_subject_filters,
        None,
        "Comma-separated subject filters (`*` and `>` wildcards) on the subjects as the `subject` column shows them: "
        "only matching messages are read, filtered by the server. Reads without `group` (a group reads what its "
        "member consumers filter).",
        READ,
        "read",
    ),
    Option(
        "startingPosition",
        parse_position,
        None,
        "Where a new query starts: `earliest`, `latest`, `group` (the member consumers' ack floor) or a "
        "stream sequence (a bucket's revision). Default: `group` when the group's member consumers exist, else "
        "`earliest`. With `bucket`, also `snapshot`: the live keys' latest values in the first batch, then every "
        "change after them.",
        READ,
        "read",
        batch_doc="First message: `earliest` (default), `latest`, `group` (after the group's ack floor) or a stream "
        "sequence.",
    ),
    Option(
        "startingTimestamp",
        parse_timestamp,
        None,
        "Start at the first message stored at or after this time (ISO-8601 or epoch ms).",
        READ,
        "read",
        batch_doc="Start at the first message stored at or after this time.",
    ),
    Option(
        "maxMessagesPerTrigger",
        parse_positive_int,
        None,
        "At most this many messages per micro-batch.",
        frozenset({STREAM}),
        "read",
        attr="max_messages",
    ),
    Option(
        "maxBytesPerTrigger",
        parse_size,
        None,
        "About at most this many bytes per micro-batch (estimated from the stream's average message size).",
        frozenset({STREAM}),
        "read",
        attr="max_bytes_per_trigger",
    ),
    Option(
        "minMessagesPerTrigger",
        parse_positive_int,
        None,
        "Wait for at least this many messages before a micro-batch (up to `maxTriggerDelay`, counted from the last "
        "batch or the query's start, as Kafka's source does); an `availableNow` run reads everything there was.",
        frozenset({STREAM}),
        "read",
        attr="min_messages",
    ),
    Option(
        "maxTriggerDelay",
        parse_duration,
        15 * 60.0,
        "Longest wait for `minMessagesPerTrigger` before a smaller batch runs.",
        frozenset({STREAM}),
        "read",
        minimum=0,
    ),
    Option(
        "idleInterval",
        parse_duration,
        1.0,
        "How often a caught-up query asks for stream info (one JetStream API request each, answered by the stream "
        "leader) while it waits for the next message on a core subscription to the stream's subjects; a message "
        "published there is read at once whatever this says. Messages that reach the stream another way (a stream "
        "that sources or mirrors) wait up to this long.",
        frozenset({STREAM}),
        "read",
        minimum=0.1,
    ),
    Option(
        "endingPosition",
        parse_end_position,
        "latest",
        "Last message: `latest` (the stream's last sequence when the query is planned) or a stream sequence "
        "(inclusive).",
        frozenset({BATCH}),
        "read",
    ),
    Option(
        "endingTimestamp",
        parse_timestamp,
        None,
        "Stop before the first message stored at or after this time.",
        frozenset({BATCH}),
        "read",
    ),
    Option(
        "failOnDataLoss",
        parse_bool,
        True,
        "Fail when messages of a batch were removed before they were read (retention, purge; seen when the batch is "
        "planned and by its tasks), or the stream was deleted and created again; `false` skips the removed messages "
        "in one step (or reads the new stream from its first message), with a warning.",
        READ,
        "read",
        batch_doc="Fail when messages from `startingPosition` on were already removed; `false` reads what is left.",
    ),
    Option("includeHeaders", parse_bool, False, "Add the `headers` column.", READ, "read"),
    Option(
        "readMode",
        parse_read_mode,
        "auto",
        "How tasks read: `direct` (Direct Get, every partition filter in parallel, from any replica; the stream "
        "needs `allow_direct` and nats-server 2.11+), `pull` (with `group`, each member's task pulls from its member "
        "consumer, which the task pins, one Spark partition per member; without, each task reads its range through "
        "an ephemeral consumer of its own) or `auto`: `direct` where the stream, the server and the NATS user allow "
        "Direct Get, else `pull` (docs: Reading guide).",
        READ,
        "read",
        batch_doc="How tasks read: `direct` (Direct Get; the stream needs `allow_direct`), `pull` (each task "
        "creates an ephemeral consumer for its range and deletes it when done; nothing else on the server "
        "changes) or `auto`: `direct` where the stream allows Direct Get and the NATS user may use it, else `pull`.",
    ),
    Option(
        "minPartitions",
        parse_positive_int,
        None,
        "At least this many Spark partitions per micro-batch (as Kafka's `minPartitions`): the widest seq ranges "
        "are cut into contiguous slices, each read in seq order, so one partition's messages may then be read "
        "by several tasks at once. The same batch is always cut the same way. Without Direct Get the slices are "
        "read through consumers of the tasks' own; a group's member consumers then keep the floors and the pins, "
        "but deliver nothing.",
        READ,
        "read",
        batch_doc="At least this many Spark partitions (as Kafka's `minPartitions`): the widest seq ranges are cut "
        "into contiguous slices, each read in seq order, so one partition's messages may then be read by several "
        "tasks at once.",
    ),
    Option(
        "preservePartitionOrder",
        parse_bool,
        True,
        "`true`: a task per partition filter (a group's member), each reading its messages in seq order. `false`: "
        "each micro-batch is read as contiguous seq ranges of the whole stream through the server's unfiltered "
        "read (Direct Get of `>`, or without Direct Get a consumer of each task's own), a task each (as many as the "
        "read has filters, or `minPartitions`), which costs nats-server a half to a seventh of the filtered reads "
        "(measured: more subjects per partition, more saved); for queries that do not "
        "need one partition's messages together and in order (aggregations, table writes, `foreachBatch`). A "
        "group's pins, member consumers and ack floors stay as they are. Needs a read of all of the stream (every "
        "partition of its transform, or no `subjects`).",
        frozenset({STREAM}),
        "read",
        attr="preserve_order",
    ),
    Option(
        "maxRangePerPartition",
        parse_positive_int,
        1_000_000,
        "Most stream sequences one Spark partition covers; longer ranges are split into more partitions.",
        frozenset({BATCH}),
        "read",
        attr="max_range",
    ),
    Option(
        "directGetBatch",
        parse_positive_int,
        10_000,
        "Messages asked for by one Direct Get request.",
        READ,
        "read",
        attr="direct_batch",
        minimum=1,
    ),
    Option(
        "directGetMaxBytes",
        parse_size,
        8 * 1024 * 1024,
        "Payload bytes asked for by one Direct Get request (bounds executor memory; a larger message still arrives).",
        READ,
        "read",
        attr="direct_max_bytes",
        minimum=1024,
    ),
    Option(
        "pullBatchSize",
        parse_int,
        1000,
        "Messages asked for by one pull request.",
        READ,
        "pull",
        attr="batch",
        minimum=1,
        batch_doc="Messages asked for by one pull request (`readMode=pull`).",
    ),
    Option(
        "pullMaxBytes",
        parse_size,
        4 * 1024 * 1024,
        "Payload bytes asked for by one pull request (bounds executor memory; a larger message still arrives).",
        READ,
        "pull",
        attr="max_bytes",
        minimum=1024,
        batch_doc="Payload bytes asked for by one pull request (`readMode=pull`; bounds executor memory; a larger "
        "message still arrives).",
    ),
    Option(
        "recordBatchSize",
        parse_int,
        10_000,
        "Rows per Arrow record batch handed to Spark.",
        READ,
        "pull",
        minimum=1,
    ),
    Option(
        "recordBatchBytes",
        parse_size,
        16 * 1024 * 1024,
        "Payload and header bytes per Arrow record batch handed to Spark, whatever the message size (a larger "
        "message gets a batch of its own): bounds the executors' memory and what Spark moves through its direct "
        "memory.",
        READ,
        "pull",
        minimum=1024,
        maximum=1024 * 1024 * 1024,
    ),
)
