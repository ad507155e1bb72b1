"""The row schema and building Arrow record batches from pulled messages.

Messages are collected as raw bytes in plain lists (cheap on the hot path) and turned into
Arrow columns in one step per batch. Spark requires the first batch's schema to equal the
declared one exactly: ``string``/``binary`` (not ``large_*``) and ``timestamp[us, UTC]``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from spark_jetstream.client.protocol import header_fields

HEADERS_TYPE = pa.map_(pa.string(), pa.list_(pa.string()))

_BASE_FIELDS = [
    pa.field("subject", pa.string()),
    pa.field("data", pa.binary()),
    pa.field("stream", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("partition", pa.int32()),
]

_SPARK_TYPES = {
    pa.string(): "string",
    pa.binary(): "binary",
    pa.int64(): "bigint",
    pa.int32(): "int",
    pa.timestamp("us", tz="UTC"): "timestamp",
    HEADERS_TYPE: "map<string,array<string>>",
}

INTERNAL_HEADERS = frozenset({"Nats-Pin-Id"})
"""Headers the server adds on delivery; they are not part of the stored message."""


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The row schema; ``headers`` is the last column, present only with ``includeHeaders``."""
    fields = list(_BASE_FIELDS)
    if include_headers:
        fields.append(pa.field("headers", HEADERS_TYPE))
    return pa.schema(fields)


def spark_schema_ddl(include_headers: bool) -> str:
    """The same schema as a Spark DDL string."""
    return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in arrow_schema(include_headers))


def parse_headers(block: bytes | None) -> list[tuple[str, list[str]]]:
    """A raw NATS header block -> ``[(key, [values...]), ...]`` in first-seen key order.

    Repeated keys keep every value; delivery-only headers (the pin id) are dropped.
    """
    if not block:
        return []
    grouped: dict[str, list[str]] = {}
    for key, value in header_fields(block):
        if key not in INTERNAL_HEADERS:
            grouped.setdefault(key, []).append(value)
    return list(grouped.items())


class RowBuffer:
    """Columns of messages being collected for one record batch."""

    __slots__ = ("data", "headers", "nbytes", "seqs", "subjects", "times")

    def __init__(self) -> None:
        self.nbytes = 0  # payload bytes, to bound memory by bytes as well as rows
        self.subjects: list[bytes] = []
        self.data: list[bytes] = []
        self.seqs: list[int] = []
        self.times: list[int] = []
        self.headers: list[bytes | None] = []

    def __len__(self) -> int:
        return len(self.seqs)

    def to_record_batch(self, stream: str, partitioned: bool, include_headers: bool) -> pa.RecordBatch:
        """Build the batch; on a partitioned stream the leading partition token moves to its column."""
        n = len(self.seqs)
        subjects = pa.array(self.subjects, pa.binary()).cast(pa.string())
        if partitioned:
            parts = pc.split_pattern(subjects, ".", max_splits=1)
            partition = pc.list_element(parts, 0).cast(pa.int32())
            subjects = pc.list_element(parts, 1)
        else:
            partition = pa.nulls(n, pa.int32())
        columns = [
            subjects,
            pa.array(self.data, pa.binary()),
            pa.repeat(pa.scalar(stream, pa.string()), n),
            pa.array(self.seqs, pa.int64()),
            pa.array(self.times, pa.timestamp("ns", tz="UTC")).cast(pa.timestamp("us", tz="UTC"), safe=False),
            partition,
        ]
        if include_headers:
            columns.append(pa.array([parse_headers(h) for h in self.headers], HEADERS_TYPE))
        return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))
