"""The table of every option, defined once: its name, type, default, documentation, the config attribute it
fills and the modes (streaming read, batch read, write) it belongs to.

The table only: ``options/option.py`` is what an option is, ``options/__init__.py`` how the rest of the package
reads them (``parse_options``, ``default_of``, ``config_values``), ``options/parse.py`` the rules a set of given
options must follow and ``options/docs.py`` the README's tables built from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from spark_jetstream.client.connection_options import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SERVERS,
    DEFAULT_SILENCE_TIMEOUT,
)
from spark_jetstream.options.option import ALL, BATCH, READ, STREAM, WRITE, Option
from spark_jetstream.options.parsers import (
    DEFAULT_PRIORITY_TIMEOUT,
    parse_ack_policy,
    parse_bool,
    parse_duration,
    parse_end_position,
    parse_int,
    parse_name,
    parse_position,
    parse_positive_int,
    parse_read_mode,
    parse_servers,
    parse_size,
    parse_subject,
    parse_subject_filters,
    parse_text,
    parse_timestamp,
)


def _connection(name: str, parse: Callable[[str], Any], default: Any, doc: str, **extra: Any) -> Option:
    return Option(name, parse, default, doc, ALL, "connection", **extra)


OPTIONS: tuple[Option, ...] = (
    _connection("servers", parse_servers, DEFAULT_SERVERS, "Comma-separated NATS server URLs."),
    _connection("creds", parse_text, None, "Path of a NATS credentials file (JWT and nkey seed)."),
    _connection("nkey", parse_text, None, "Path of a file holding an nkey seed."),
    _connection("token", parse_text, None, "Authentication token.", secret=True),
    _connection("user", parse_text, None, "User name (with `password`)."),
    _connection("password", parse_text, None, "Password (with `user`).", secret=True),
    _connection("tls.ca", parse_text, None, "Path of the CA certificate that signed the server's certificate."),
    _connection("tls.cert", parse_text, None, "Path of the client certificate for mutual TLS (with `tls.key`)."),
    _connection("tls.key", parse_text, None, "Path of the client private key for mutual TLS."),
    _connection("domain", parse_text, None, "JetStream domain, when the stream lives in another domain."),
    _connection(
        "connectTimeout",
        parse_duration,
        DEFAULT_CONNECT_TIMEOUT,
        "How long to try to reach a server before failing (e.g. `5s`).",
        minimum=0.1,
    ),
    _connection(
        "silenceTimeout",
        parse_duration,
        DEFAULT_SILENCE_TIMEOUT,
        "How long a connected server may send nothing, though pinged, before the connection moves to another of "
        "`servers` (a frozen server or a network partition sends no reset). Lower notices such a server sooner; "
        "too low for a server that stalls for seconds under load moves connections needlessly (each move asks "
        "again for what was in flight, exactly once).",
        minimum=0.3,
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
        "pullsInFlight",
        parse_int,
        4,
        "Pull requests kept outstanding per member.",
        frozenset({STREAM}),
        "pull",
        attr="in_flight",
        minimum=1,
        group_only=True,
    ),
    Option(
        "pullExpires",
        parse_duration,
        5.0,
        "How long one pull request may wait at the server: under half of `priorityTimeout` (the default drops to a "
        "quarter of a `priorityTimeout` under 10s).",
        frozenset({STREAM}),
        "pull",
        attr="expires",
        minimum=0.1,
        group_only=True,
    ),
    Option(
        "pullIdleHeartbeat",
        parse_duration,
        1.0,
        "Server heartbeat interval while a pull waits; at most half of `pullExpires` (the default drops to half "
        "of a `pullExpires` under 2s).",
        frozenset({STREAM}),
        "pull",
        attr="idle_heartbeat",
        minimum=0.05,
        group_only=True,
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
        "group",
        parse_name,
        None,
        "A partitioned consumer group (pcgroups) whose member consumers `<group>-<member>` hold the query's "
        "position as their ack floors, with pins that keep other clients out; made when missing. Without it the "
        "position lives in the checkpoint alone, and the query creates and changes nothing on the server.",
        READ,
        "read",
        batch_doc="Read what this group reads (its work stream, its members' filter subjects), without touching its "
        "consumers. Default: the whole stream.",
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
        "members",
        parse_positive_int,
        None,
        "Members of a group derived from the stream's partition transform (default: one per partition).",
        READ,
        "read",
        batch_doc="With `group`: as for streaming reads.",
        group_only=True,
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
        "Wait for at least this many messages before a micro-batch (up to `maxTriggerDelay`).",
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
        "Fail when messages of a batch were removed before they were read (retention, purge); "
        "`false` skips them with a warning.",
        READ,
        "read",
        batch_doc="Fail when messages from `startingPosition` on were already removed; `false` reads what is left.",
    ),
    Option("includeHeaders", parse_bool, False, "Add the `headers` column.", READ, "read"),
    Option(
        "ackWait",
        parse_duration,
        3600.0,
        "The member consumers' ack_wait: how long a delivered, uncommitted message waits before the "
        "server may redeliver it.",
        frozenset({STREAM}),
        "read",
        minimum=1,
        group_only=True,
    ),
    Option(
        "priorityTimeout",
        parse_duration,
        DEFAULT_PRIORITY_TIMEOUT,
        "The member consumers' priority_timeout: how long a pin survives without a pull that carries its id. "
        "The query renews its pins every second (Direct Get) or with every pull (`readMode=pull`, where an idle "
        "query's pins lapse after it).",
        frozenset({STREAM}),
        "pull",
        minimum=5,
        group_only=True,
    ),
    Option(
        "ackPolicy",
        parse_ack_policy,
        "explicit",
        "The member consumers' ack policy. `none` (Limits-retention streams only) spares the server tracking "
        "every delivered message until the commit, for about 1.3x faster pulled reads (`readMode=pull`) from "
        "file-backed streams; the commit still sets every ack floor to the checkpoint, but while a batch is read "
        "the floor runs ahead of it (see Guarantees).",
        frozenset({STREAM}),
        "read",
        group_only=True,
    ),
    Option(
        "readMode",
        parse_read_mode,
        "auto",
        "How tasks read: `direct` (Direct Get, every partition filter in parallel, from any replica; the stream "
        "needs `allow_direct` and nats-server 2.11+), `pull` (with `group`, each member's task pulls from its member "
        "consumer, which the task pins, one Spark partition per member; without, each task reads its range through "
        "an ephemeral consumer of its own) or `auto`: `direct` where the stream, the server and the NATS user allow "
        "Direct Get, else `pull` (README, Reading a stream).",
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
        1,
        "Replicas of `commitBucket` when the writer creates it.",
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

_BY_ATTR = {option.attr: option for option in OPTIONS}
assert len(_BY_ATTR) == len(OPTIONS), "two options fill the same config attribute"


def options_for(modes: str | Iterable[str]) -> tuple[Option, ...]:
    """The options of ``modes`` (a mode or several), in definition order."""
    wanted = {modes} if isinstance(modes, str) else set(modes)
    return tuple(option for option in OPTIONS if option.modes & wanted)
