"""Arrow rows: the schema Spark expects, header parsing, partition tokens."""

from __future__ import annotations

import pyarrow as pa

from spark_jetstream.read.rows import RowBuffer, arrow_schema, parse_headers, spark_schema_ddl


def test_schema_matches_spark_ddl():
    assert spark_schema_ddl(False) == (
        "subject string, data binary, stream string, seq bigint, timestamp timestamp, partition int"
    )
    assert spark_schema_ddl(True).endswith(", headers map<string,array<string>>")


def test_headers_keep_repeated_keys_and_drop_the_pin():
    block = b"NATS/1.0\r\nA: 1\r\nNats-Pin-Id: xyz\r\nb: \r\nA:  2\r\nUnicode: h\xc3\xa9\r\n\r\n"
    assert parse_headers(block) == [("A", ["1", "2"]), ("b", [""]), ("Unicode", ["h\u00e9"])]
    assert parse_headers(None) == []
    assert parse_headers(b"NATS/1.0\r\nNats-Pin-Id: xyz\r\n\r\n") == []


def _buffer() -> RowBuffer:
    rows = RowBuffer()
    for seq, subject in ((3, b"1.orders.a.b"), (9, b"12.orders.c")):
        rows.subjects.append(subject)
        rows.data.append(b"payload-%d" % seq)
        rows.seqs.append(seq)
        rows.times.append(1_700_000_000_123_456_789)
        rows.headers.append(b"NATS/1.0\r\nk: v\r\n\r\n")
    return rows


def test_partition_token_moves_to_its_column():
    batch = _buffer().to_record_batch("S", partitioned=True, include_headers=True)
    assert batch.schema == arrow_schema(True)
    assert batch.column("subject").to_pylist() == ["orders.a.b", "orders.c"]
    assert batch.column("partition").to_pylist() == [1, 12]
    assert batch.column("stream").to_pylist() == ["S", "S"]
    assert batch.column("headers").to_pylist() == [[("k", ["v"])], [("k", ["v"])]]
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123_456] * 2


def test_unpartitioned_streams_keep_the_subject():
    batch = _buffer().to_record_batch("S", partitioned=False, include_headers=False)
    assert batch.schema == arrow_schema(False)
    assert batch.column("subject").to_pylist() == ["1.orders.a.b", "12.orders.c"]
    assert batch.column("partition").null_count == 2
