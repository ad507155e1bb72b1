"""The streaming writer's commit markers: the last committed batch of each query, in a KV bucket.

The driver's ``commit`` writes the marker (``write_marker``) after every task of a batch succeeded;
each task reads it first (``read_marker``) and skips a batch committed before (see ``sink.writer``).
A writer with ``progressSubject`` keeps its markers in the target stream instead (``sink.atomic``);
``progress_markers`` and ``forget_progress`` list and remove those per query or write id, as
``markers`` and ``forget`` do the bucket's (``spark-jetstream commits``).
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from spark_jetstream.client import retry
from spark_jetstream.client.connection import Connection, ConnectionOptions
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.kv import get_entry, key_value
from spark_jetstream.client.messages import stored_message_async, time_ns
from spark_jetstream.client.progress_markers import sink_of, sink_subjects
from spark_jetstream.errors import ClusterUnavailableError, ConnectError, JetStreamError
from spark_jetstream.sink.atomic import progress_stream

_ensured: set[tuple[ConnectionOptions, str]] = set()
_ensured_lock = threading.Lock()


def ensure_bucket(conn: Connection, bucket: str, replicas: int | None, target: str | None = None) -> None:
    """Create the KV bucket of commit markers when missing (once per process), with ``replicas`` or, when None, as
    many as the stream ``target`` (None: 1)."""
    with _ensured_lock:
        if (conn.options, bucket) in _ensured:
            return
    if replicas is None:
        replicas = 1 if target is None else int(JetStreamApi(conn).stream_info(target)["config"].get("num_replicas", 1))
    description = "spark-jetstream: the last committed batch of each streaming query"
    conn.run(
        key_value(JetStreamApi(conn), bucket, create=True, replicas=replicas, description=description, direct=True)
    )
    with _ensured_lock:
        _ensured.add((conn.options, bucket))


def read_marker(conn: Connection, bucket: str, key: str) -> int:
    """The batch id stored under ``key`` (-1: none), read from the bucket's leader (read-after-write)."""
    entry = get_entry(JetStreamApi(conn), bucket, key)
    if entry is None:
        return -1
    try:
        return int(entry.data)
    except ValueError:
        raise JetStreamError(
            f"KV bucket {bucket!r} holds {entry.data[:40]!r} under {key!r}, not a batch id: the bucket is used "
            "by something else; set commitBucket to another bucket."
        ) from None


def write_marker(conn: Connection, bucket: str, key: str, batch_id: int) -> None:
    """Record ``batch_id`` under ``key``: a publish to the bucket's subject, failing unless the stream acks it."""
    subject = f"{conn.options.kv_prefix(bucket)}{key}"
    try:
        raw = conn.run(retry.request(conn, subject, str(batch_id).encode()))
    except ClusterUnavailableError:
        raise  # an election that outlasted the deadline: its message says so
    except ConnectError as exc:
        deleted = "" if conn.options.api_import else " Was the bucket deleted?"  # else the import is the likelier cause
        raise JetStreamError(
            f"Cannot record batch {batch_id} in KV bucket {bucket!r} (key {key}): {exc}{deleted}"
        ) from None
    ack = json.loads(raw)
    if "error" in ack:
        raise JetStreamError(
            f"Cannot record batch {batch_id} in KV bucket {bucket!r} (key {key}): "
            f"{ack['error'].get('description')} (error {ack['error'].get('err_code')})."
        )


@dataclass(frozen=True)
class Marker:
    """One query's commit marker: its id (the key), its last committed batch and when that was recorded."""

    query_id: str
    batch_id: str
    written: datetime


def markers(conn: Connection, bucket: str) -> list[Marker]:
    """Every query's marker in ``bucket``, oldest first (what ``spark-jetstream commits list`` shows)."""
    api, stream, prefix = JetStreamApi(conn), f"KV_{bucket}", f"$KV.{bucket}."
    found = []
    for subject in api.subjects(stream, f"{prefix}>"):
        stored = conn.run(stored_message_async(api, stream, {"last_by_subj": subject}))
        if stored is None or "KV-Operation" in base64.b64decode(stored.get("hdrs") or b"").decode(errors="replace"):
            continue  # purged meanwhile, deleted or purged
        data = base64.b64decode(stored.get("data") or b"").decode(errors="replace")
        found.append(Marker(subject.removeprefix(prefix), data, _written(stored)))
    return sorted(found, key=lambda marker: marker.written)


def forget(conn: Connection, bucket: str, query_id: str) -> None:
    """Remove the marker of a query that will not run again, and its key with it (a purge of its subject). A query
    that does run again with that checkpoint rewrites batches it had committed: they are then stored twice."""
    JetStreamApi(conn).purge_subjects(f"KV_{bucket}", f"$KV.{bucket}.{query_id}")


def progress_markers(conn: Connection, prefix: str) -> list[Marker]:
    """Every writer's progress markers under ``prefix`` (the option ``progressSubject``), one per query or write id:
    its last batch and when its newest marker was written, oldest first."""
    api = JetStreamApi(conn)
    stream = progress_stream(api, prefix)
    found: dict[str, list[tuple[int, datetime]]] = {}
    for subject in api.subjects(stream, f"{prefix}.*.*"):
        if (sink := sink_of(prefix, subject)) is None:
            continue
        stored = conn.run(stored_message_async(api, stream, {"last_by_subj": subject}))
        if stored is None:
            continue  # purged meanwhile
        try:
            batch = int(json.loads(base64.b64decode(stored.get("data") or b""))["batch"])
        except (ValueError, KeyError, TypeError):
            continue  # something else publishes under the prefix
        found.setdefault(sink, []).append((batch, _written(stored)))
    listed = [
        Marker(query_id, str(max(b for b, _ in seen)), max(w for _, w in seen)) for query_id, seen in found.items()
    ]
    return sorted(listed, key=lambda marker: marker.written)


def forget_progress(conn: Connection, prefix: str, query_id: str, stream: str | None = None) -> int:
    """Remove the progress markers of a query or write id that will not write again (a purge of its subjects, in
    ``stream`` or the stream that captures them); returns how many went. A query that does run again with its
    checkpoint stores a replayed batch twice."""
    api = JetStreamApi(conn)
    return api.purge_subjects(stream or progress_stream(api, prefix), sink_subjects(prefix, query_id))


def _written(stored: dict[str, Any]) -> datetime:
    """When a message ``STREAM.MSG.GET`` gave was stored."""
    return datetime.fromtimestamp(time_ns(stored["time"]) / 1e9, UTC)
