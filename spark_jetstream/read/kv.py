"""A KV bucket read as a table or as a stream of its changes: the bucket's stream read as any stream, its rows
turned into ``key, value, revision, created, operation`` (decision 0023).

A bucket ``b`` is the stream ``KV_b`` with subjects ``$KV.b.<key>``; a revision is the stream seq; a delete stores
an empty message with ``KV-Operation: DEL``, a purge ``KV-Operation: PURGE`` (and removes the key's older
revisions); a server-written delete marker (2.11+, a bucket with ``subject_delete_marker_ttl``) carries
``Nats-Marker-Reason``: ``Remove`` is a delete, ``MaxAge`` and ``Purge`` a purge. Reads go through the stream's
read paths with headers (the operation is in them) and filters ``$KV.b.<key filter>`` (without ``keys``, ``>``: the
whole stream); ``kv_rows`` turns each record batch into the bucket's rows with Arrow kernels, and for a table read
keeps each live key's latest value.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from spark_jetstream.options import default_of

if TYPE_CHECKING:
    import pyarrow as pa

    from spark_jetstream.client.connection import Connection

KV_SCHEMA_DDL = "key string, value binary, revision bigint, created timestamp, operation string"
PUT, DEL, PURGE = "PUT", "DEL", "PURGE"
_MARKER_OPERATIONS = {"Remove": DEL, "MaxAge": PURGE, "Purge": PURGE}
"""``Nats-Marker-Reason`` of a server's delete marker -> the operation it stands for."""


def kv_stream(bucket: str) -> str:
    return f"KV_{bucket}"


def key_prefix(bucket: str) -> str:
    """What a key's subject starts with: ``$KV.<bucket>.``."""
    return f"$KV.{bucket}."


def bucket_read(values: dict[str, Any]) -> dict[str, Any]:
    """Parsed read options with ``bucket``: a read of its stream with headers (the operation is in them), of the
    ``keys``' subjects or, without ``keys``, of the whole stream (``>``: it holds the keys' subjects alone, and a
    read of ``>`` costs the server less than of a filter, decision 0017); the options as they were without."""
    bucket = values.get("bucket")
    if not bucket:
        return values
    keys = values.get("keys")
    subjects = kv_subjects(bucket, keys) if keys else None
    return {**values, "stream": kv_stream(bucket), "subjects": subjects, "includeHeaders": True}


@cache
def kv_arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.string()),
            ("value", pa.binary()),
            ("revision", pa.int64()),
            ("created", pa.timestamp("us", tz="UTC")),
            ("operation", pa.string()),
        ]
    )


def kv_subjects(bucket: str, keys: Sequence[str]) -> tuple[str, ...]:
    """The stream subjects of ``keys`` (key filters with ``*``/``>`` over the key's tokens)."""
    return tuple(key_prefix(bucket) + key for key in keys)


@dataclass(frozen=True)
class KvView:
    """How a range of a bucket's stream becomes its rows: every revision (``latest_as_of`` None: the changes, or
    ``includeHistory``), or each live key's latest revision up to seq ``latest_as_of`` (a table). ``history``:
    revisions the bucket keeps per key (with one, every stored message is its key's latest). ``per_key``: the range
    is read through a ``last_per_subject`` consumer (``read.kv_latest``), which hands over each key's latest
    revision alone."""

    bucket: str
    latest_as_of: int | None = None
    history: int = 1
    per_key: bool = False

    @property
    def prefix(self) -> str:
        return key_prefix(self.bucket)


def table_view(conn: Connection, bucket: str, stream_config: dict[str, Any], as_of: int) -> KvView:
    """How a read of ``bucket``'s latest values up to seq ``as_of`` keeps each live key's latest revision. A bucket
    that keeps one revision per key stores only latest revisions. One that keeps several is asked which is each
    key's latest with Direct Get (``multi_last``: nats-server 2.11+, ``allow_direct``), or without Direct Get (as
    nats-py makes buckets) read through ``last_per_subject`` consumers of the read's own (``read.kv_latest``):
    refused here, naming what to grant, when the NATS user may not make them."""
    from spark_jetstream.client.features import BATCHED_DIRECT_GET

    history = max(int(stream_config.get("max_msgs_per_subject") or 1), 1)
    if history == 1:
        return KvView(bucket, as_of, history)
    if stream_config.get("allow_direct") and conn.supports(BATCHED_DIRECT_GET):
        return KvView(bucket, as_of, history)
    _check_consumer_rights(conn, bucket, history)
    return KvView(bucket, as_of, history, per_key=True)


def _check_consumer_rights(conn: Connection, bucket: str, history: int) -> None:
    """Refuse, before any task runs, a read through consumers that the NATS user may not create: one request to
    ``CONSUMER.CREATE`` without a config (the server answers it with an error and creates nothing)."""
    from spark_jetstream.client.jsapi import JetStreamApi
    from spark_jetstream.client.messages import may_request
    from spark_jetstream.errors import NotPermittedError

    api, stream = JetStreamApi(conn), kv_stream(bucket)
    if may_request(api, api.subject("CONSUMER", "CREATE", stream, "spark-read-rights"), b""):
        return
    subjects = ", ".join(api.subject("CONSUMER", verb, stream, "*") for verb in ("CREATE", "MSG.NEXT", "DELETE"))
    raise NotPermittedError(
        f"KV bucket {bucket!r} keeps {history} revisions per key and has no Direct Get, so its latest values are "
        f"read through consumers of the read's own, which the NATS user may not create (the server refused a "
        f"publish to {api.subject('CONSUMER', 'CREATE', stream)}.*): allow the user to publish to {subjects}; or "
        f"enable Direct Get (`nats stream edit {stream} --allow-direct`, then {api.subject('DIRECT', 'GET', stream)}"
        " is what it needs); or read every revision (includeHistory=true) and keep the highest per key."
    )


def kv_rows(conn: Connection, batches: Iterator[pa.RecordBatch], view: KvView) -> Iterator[pa.RecordBatch]:
    """The bucket's rows of record batches read with headers (the source's schema)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for batch in batches:
        subjects = batch.column("subject")
        keys = pc.utf8_slice_codeunits(subjects, len(view.prefix))
        rows = pa.RecordBatch.from_arrays(
            [keys, batch.column("data"), batch.column("seq"), batch.column("timestamp"), operations(batch)],
            schema=kv_arrow_schema(),
        )
        if view.latest_as_of is not None:
            rows = rows.filter(pc.equal(rows.column("operation"), PUT))
            if view.history > 1 and not view.per_key and rows.num_rows:
                rows = rows.filter(_latest(conn, rows, view))
        if rows.num_rows:
            yield rows


def operations(batch: pa.RecordBatch) -> pa.Array:
    """Each message's operation: its ``KV-Operation`` header, else what a server's delete marker stands for, else
    ``PUT``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    headers = batch.column("headers")
    operation = _first(pc.map_lookup(headers, "KV-Operation", "first"))
    reason = _first(pc.map_lookup(headers, "Nats-Marker-Reason", "first"))
    if reason.null_count < len(reason):
        names = pa.array(list(_MARKER_OPERATIONS))
        found = pc.index_in(reason, value_set=names)
        operation = pc.coalesce(operation, pc.take(pa.array(list(_MARKER_OPERATIONS.values())), found))
    return pc.coalesce(operation, pa.scalar(PUT)).cast(pa.string())


def _first(values: pa.Array) -> pa.Array:
    """``map_lookup``'s list of a header's values -> its first value (null without the header: a header that is
    there has a value)."""
    import pyarrow.compute as pc

    return pc.list_element(values, 0)


MULTI_LAST_BYTES = default_of("directGetMaxBytes")
"""Bytes of values one ``multi_last`` request of ``_latest`` asks for: it needs their seqs only, and the server sends
whole messages (up to 64 MiB a request)."""


def _latest(conn: Connection, rows: pa.RecordBatch, view: KvView) -> pa.Array:
    """Which rows are their key's latest revision up to ``view.latest_as_of`` (a bucket that keeps several):
    asked of the stream with Direct Get ``multi_last`` (at most 1,024 keys a request)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from spark_jetstream.client.messages import last_seqs

    keys = rows.column("key").to_pylist()
    distinct = sorted(set(keys))
    latest: dict[str, int] = {}
    for low in range(0, len(distinct), 1024):
        subjects = [view.prefix + key for key in distinct[low : low + 1024]]
        answered = last_seqs(conn, kv_stream(view.bucket), subjects, view.latest_as_of or 0, MULTI_LAST_BYTES)
        for subject, seq in answered.items():
            latest[subject[len(view.prefix) :]] = seq
    wanted = pa.array([latest.get(key, -1) for key in keys], pa.int64())
    return pc.equal(rows.column("revision"), wanted)
