"""Writing a KV bucket: rows ``key``, ``value`` (null: delete the key) and an optional ``revision``
(compare-and-set), published as the bucket's messages by the stream writer (``sink.writer``, decision 0023).

A put is a message on ``$KV.<bucket>.<key>``; a delete an empty one with ``KV-Operation: DEL``; a row's
``revision`` becomes ``Nats-Expected-Last-Subject-Sequence`` (0: the key must not exist yet), which the server
checks when it stores the message. Replays are stored once as any write's are (msg ids within the duplicate
window, committed batches never again). The server checks a revision before a msg id, so a compare-and-set row is
published on its own, in order with the rows around it, and a refusal whose key's last message carries the row's
own msg id is its earlier attempt's store: a duplicate, not a refusal.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructType

from spark_jetstream.client.connection import Connection
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.messages import last_message_async
from spark_jetstream.client.publish import EXPECTED_SUBJECT_SEQ_HEADER, MSG_ID_HEADER, PublishError
from spark_jetstream.errors import SchemaError
from spark_jetstream.read.kv import kv_stream
from spark_jetstream.read.rows import binary_array
from spark_jetstream.sink.config import Columns, SinkConfig
from spark_jetstream.sink.publishing import publish_rows

KEY_PATTERN = r"^[-/_=a-zA-Z0-9]+(\.[-/_=a-zA-Z0-9]+)*$"
"""A KV key: dot-separated tokens of letters, digits and ``-/_=`` (what the NATS clients accept)."""
OPERATION_HEADER = "KV-Operation"
WRITE_COLUMNS = Columns(subject=0, data=1, headers=2)
"""The columns of the record batches ``kv_batches`` makes for the stream writer."""
_HEADERS = pa.map_(pa.string(), pa.string())
WRONG_LAST_SEQUENCE = 10071


@dataclass(frozen=True)
class KvColumns:
    """Positions of the input columns of a bucket write."""

    key: int
    value: int
    revision: int | None = None


def check_kv_columns(schema: StructType, bucket: str) -> KvColumns:
    """Map a bucket write's columns, or raise ``SchemaError`` naming the column and what it must be (on the
    driver, before anything is published)."""
    by_name = {f.name.lower(): (i, f) for i, f in enumerate(schema.fields)}
    wanted = {
        "key": ("string", (StringType,)),
        "value": ("binary or string", (BinaryType, StringType)),
        "revision": ("bigint", (LongType, IntegerType)),
    }
    found: dict[str, int] = {}
    for name, (shown, types) in wanted.items():
        if name not in by_name:
            continue
        index, field = by_name[name]
        if not isinstance(field.dataType, types):
            raise SchemaError(
                f"Column {name!r} has type {field.dataType.simpleString()}, but a write to KV bucket {bucket!r} "
                f"takes {shown}: cast it."
            )
        found[name] = index
    for name in ("key", "value"):
        if name not in found:
            raise SchemaError(
                f"A write to KV bucket {bucket!r} needs a {name!r} column: rows key (string), value (binary or string; "
                "null deletes the key) and, for compare-and-set, revision (bigint)."
            )
    extra = sorted(set(by_name) - set(wanted))
    if extra:
        raise SchemaError(
            f"Column {extra[0]!r} is not used by a write to KV bucket {bucket!r}, which takes key, value and "
            "revision: select those."
        )
    return KvColumns(found["key"], found["value"], found.get("revision"))


def publish_kv(
    conn: Connection,
    config: SinkConfig,
    columns: KvColumns,
    batches: Iterator[pa.RecordBatch],
    id_prefix: str,
) -> tuple[int, int]:
    """Publish a task's rows to ``config.bucket``, pipelined (``publish_rows``); with a ``revision`` column each
    compare-and-set row on its own, between the pipelined runs of the others. Returns (messages stored, of which
    duplicates)."""
    assert config.bucket is not None
    if columns.revision is None:  # no compare-and-set: the task's rows pipelined as any write's
        try:
            rows = kv_batches(batches, columns, config.bucket, conn.options.kv_prefix(config.bucket))
            return publish_rows(conn, config, WRITE_COLUMNS, rows, id_prefix)
        except PublishError as exc:
            raise kv_failure(exc, config.bucket) from None
    stored = duplicates = 0
    first = 0  # the task's row number of the batch's first row: msg ids number the task's rows
    for batch in kv_batches(batches, columns, config.bucket, conn.options.kv_prefix(config.bucket)):
        revisions = batch.column(3).is_valid().to_pylist()
        start = 0
        while start < batch.num_rows:
            stop = start
            while stop < batch.num_rows and revisions[stop] == revisions[start]:
                stop += 1
            if revisions[start]:
                for row in range(start, stop):
                    duplicates += _compare_and_set(conn, config, batch.slice(row, 1), f"{id_prefix}{first + row}")
                    stored += 1
            else:
                run = batch.slice(start, stop - start).select([0, 1, 2])
                try:
                    count, seen = publish_rows(conn, config, WRITE_COLUMNS, iter([run]), f"{id_prefix}{first + start}-")
                except PublishError as exc:
                    raise kv_failure(exc, config.bucket) from None
                stored, duplicates = stored + count, duplicates + seen
            start = stop
        first += batch.num_rows
    return stored, duplicates


def _compare_and_set(conn: Connection, config: SinkConfig, row: pa.RecordBatch, msg_id: str) -> int:
    """Publish one compare-and-set row and wait for its PubAck; 1 when it was a duplicate (an earlier attempt of
    this task stored it: the key's last message carries its msg id), 0 when stored now."""
    subject = row.column(0)[0].as_py()
    headers = dict(row.column(2)[0].as_py() or [])
    if config.deduplicate:
        headers[MSG_ID_HEADER] = msg_id

    async def send() -> dict[str, Any]:
        reply = await conn.client.request(subject, row.column(1)[0].as_py(), timeout=config.timeout, headers=headers)
        return json.loads(reply.data)

    try:
        ack = conn.run(send())
    except Exception as exc:  # no answer in time: the task fails, its retry tells a store from a refusal
        raise PublishError(f"Publishing to {subject!r} got no PubAck within {config.timeout:g}s: {exc}") from None
    if "error" not in ack:
        return int(bool(ack.get("duplicate")))
    error = ack["error"]
    if error.get("err_code") == WRONG_LAST_SEQUENCE and config.deduplicate:
        stored = conn.options.stored_subject(subject)
        last = conn.run(last_message_async(JetStreamApi(conn), kv_stream(config.bucket), stored))
        if last is not None and last.headers.get(MSG_ID_HEADER) == msg_id:
            return 1  # this row's own earlier store
    reason = f"{error.get('description')} (error {error.get('err_code')})"
    raise kv_failure(PublishError(f"Publishing to {subject!r} failed: {reason}"), config.bucket)


def kv_batches(
    batches: Iterator[pa.RecordBatch], columns: KvColumns, bucket: str, prefix: str
) -> Iterator[pa.RecordBatch]:
    """The bucket's messages of a task's rows: ``subject, data, headers`` (``WRITE_COLUMNS``), published to ``prefix``
    and the key (``ConnectionOptions.kv_prefix``)."""
    for batch in batches:
        keys = batch.column(columns.key).cast(pa.string())
        bad = pc.invert(pc.fill_null(pc.match_substring_regex(keys, KEY_PATTERN), False))
        if pc.any(bad).as_py():
            key = keys[bad.to_pylist().index(True)].as_py()
            raise PublishError(
                f"Cannot write key {key!r} to KV bucket {bucket!r}: a key is dot-separated tokens of letters, digits "
                "and -/_= (no spaces, wildcards or empty tokens)."
            )
        values = batch.column(columns.value)
        revisions = batch.column(columns.revision) if columns.revision is not None else None
        subjects = pc.binary_join_element_wise(pa.scalar(prefix), keys, pa.scalar(""))
        data = values.cast(pa.binary()).fill_null(b"")
        arrays = [subjects, data, _headers(values.is_null(), revisions)]
        names = ["subject", "data", "headers"]
        if revisions is not None:  # which rows are compare-and-set (``publish_kv``)
            arrays.append(revisions.cast(pa.int64()))
            names.append("revision")
        yield pa.RecordBatch.from_arrays(arrays, names=names)


def _headers(deletes: pa.Array, revisions: pa.Array | None) -> pa.Array:
    """Each row's headers: ``KV-Operation: DEL`` for a delete, the expected revision for a compare-and-set."""
    names: list[bytes] = []
    items: list[bytes] = []
    ends = array("i", [0])
    expected = revisions.to_pylist() if revisions is not None else [None] * len(deletes)
    for delete, revision in zip(deletes.to_pylist(), expected, strict=True):
        if delete:
            names.append(OPERATION_HEADER.encode())
            items.append(b"DEL")
        if revision is not None:
            names.append(EXPECTED_SUBJECT_SEQ_HEADER.encode())
            items.append(b"%d" % revision)
        ends.append(len(names))
    offsets = pa.Array.from_buffers(pa.int32(), len(ends), [None, pa.py_buffer(ends)])
    return pa.MapArray.from_arrays(
        offsets, binary_array(names).cast(pa.string()), binary_array(items).cast(pa.string()), type=_HEADERS
    )


_REFUSED = re.compile(
    r"Publishing to '(?:\$JS\.[^.']+\.API\.)?\$KV\.[^.']+\.([^']+)' failed: wrong last sequence: (\d+)"
)


def kv_failure(exc: PublishError, bucket: str) -> PublishError:
    """A refused compare-and-set told as one (the server says only "wrong last sequence")."""
    found = _REFUSED.search(str(exc))
    if found is None:
        return exc
    key, revision = found.groups()
    return PublishError(
        f"Compare-and-set refused for key {key!r} of KV bucket {bucket!r}: the key is at revision {revision}, not "
        "the row's revision (it was written since the row's revision was read; 0 means it must not exist). Read the "
        "key again and retry."
    )
