"""Arrow rows: the schema Spark expects, header parsing, partition tokens."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from spark_jetstream.read.rows import (
    HEADERS_TYPE,
    RowBatches,
    RowBuffer,
    arrow_schema,
    headers_array,
    parse_headers,
    spark_schema_ddl,
)

ROOT = Path(__file__).resolve().parent.parent


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
    rows = RowBuffer(keep_headers=True)
    for seq, subject in ((3, b"1.orders.a.b"), (9, b"12.orders.c")):
        rows.add(subject, b"payload-%d" % seq, seq, 1_700_000_000_123_456_789, b"NATS/1.0\r\nk: v\r\n\r\n")
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


def test_headers_column_equals_pyarrows_own_conversion():
    blocks = [
        b"NATS/1.0\r\nA: 1\r\nNats-Pin-Id: xyz\r\nb: \r\nA:  2\r\nUnicode: h\xc3\xa9\r\n\r\n",
        None,
        b"NATS/1.0\r\nNats-Pin-Id: xyz\r\n\r\n",
        b"NATS/1.0\r\nbad: \xff\r\n\r\n",
    ]
    built = headers_array(blocks)
    assert built.type == HEADERS_TYPE
    assert built.equals(pa.array([parse_headers(block) for block in blocks], HEADERS_TYPE))
    assert headers_array([]).equals(pa.array([], HEADERS_TYPE))


def test_an_empty_buffer_makes_an_empty_batch():
    for partitioned in (True, False):
        batch = RowBuffer().to_record_batch("S", partitioned=partitioned, include_headers=True)
        assert batch.num_rows == 0 and batch.schema == arrow_schema(True)


@pytest.mark.slow  # starts a Python process
def test_building_a_batch_imports_no_pandas():
    """pa.array and pa.scalar import pandas (~0.2 s) on first use: a fresh executor worker would pay it
    on the way to the first batch."""
    probe = (
        "import sys\n"
        "from spark_jetstream.read.rows import RowBuffer\n"
        "rows = RowBuffer(keep_headers=True)\n"
        "rows.add(b'1.a', b'x', 7, 1_700_000_000_000_000_000, b'NATS/1.0\\r\\nk: v\\r\\n\\r\\n')\n"
        "rows.to_record_batch('S', True, True)\n"
        "texts = RowBuffer(text_times=True)\n"  # a Direct Get read's times: RFC 3339 text
        "texts.add(b'1.a', b'x', 7, b'2026-01-01T00:00:00Z')\n"
        "texts.to_record_batch('S', True, False)\n"
        "print('pandas' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", result.stderr


def test_row_batches_stay_within_their_row_and_byte_bounds():
    """Every batch holds at most ``max_rows`` rows and ``max_bytes`` payload and header bytes, except a single
    message larger than the bound, which gets a batch of its own; nothing is lost or reordered."""
    rng = random.Random(3)
    sizes = [rng.choice([0, 10, 900, 1000, 1001, 5000]) for _ in range(400)]
    batches = RowBatches(max_rows=7, max_bytes=2000, keep_headers=True)
    header = b"NATS/1.0\r\nk: v\r\n\r\n"
    for seq, size in enumerate(sizes, 1):
        batches.add(b"0.s", bytes([seq % 251]) * size, seq, seq, header if seq % 3 else None)
    batches.flush()
    seen = []
    for rows in batches.ready:
        built = rows.to_record_batch("S", True, True)
        counted = sum(len(d) for d in built.column("data").to_pylist()) + len(rows.headers or b"")
        assert counted == rows.nbytes
        assert 1 <= len(rows) <= 7
        assert rows.nbytes <= 2000 or len(rows) == 1, (len(rows), rows.nbytes)
        seen += built.column("seq").to_pylist()
        assert built.column("data").to_pylist() == [bytes([s % 251]) * sizes[s - 1] for s in rows.seqs]
    assert seen == list(range(1, len(sizes) + 1))
    assert batches.buffered() == (len(sizes), sum(r.nbytes for r in batches.ready))


@pytest.mark.parametrize("keep_headers", [True, False])
def test_runs_of_messages_make_the_batches_one_message_at_a_time_makes(keep_headers):
    """A run appended to the rows at once (as the bulk handlers append them), of which ``RowBatches.keep`` keeps a
    part, makes the batches that the kept messages added one at a time make."""
    rng = random.Random(5)
    sizes = [rng.choice([0, 10, 900, 1000, 1001, 5000]) for _ in range(400)]
    header = b"NATS/1.0\r\nk: v\r\n\r\n"
    messages = [
        (b"0.s%d" % seq, bytes([seq % 251]) * size, seq, b"%d" % seq, header if seq % 3 else None)
        for seq, size in enumerate(sizes, 1)
    ]
    one, runs = (RowBatches(max_rows=7, max_bytes=2000, keep_headers=keep_headers, text_times=True) for _ in range(2))
    first = 0
    while first < len(messages):
        run = messages[first : first + rng.choice([1, 2, 5, 13, 40])]
        low, high = sorted(
            rng.choice([0, len(run)]) if rng.random() < 0.7 else rng.randrange(len(run) + 1) for _ in "lh"
        )
        for message in run[low:high]:
            one.add(*message)
        at = len(runs.rows)
        for message in run:
            runs.rows.add(*message)
        runs.keep(at, at + low, at + high)
        first += len(run)
    one.flush()
    runs.flush()

    def shape(batches: RowBatches) -> list[tuple]:
        return [
            (
                rows.seqs,
                rows.subjects,
                rows.subject_ends,
                bytes(rows.payload),
                list(rows.offsets),
                rows.times,
                rows.time_ends,
                rows.headers,
                rows.header_ends,
                rows.nbytes,
            )
            for rows in batches.ready
        ]

    assert shape(runs) == shape(one)
    assert len(shape(one)) > 50


def test_rows_are_kept_in_order_from_a_run():
    """``keep_in_order``: of an ascending run, the seqs in ``(last, end]`` up to ``stop``; one past ``end`` ends it."""
    batches = RowBatches(max_rows=100, max_bytes=10_000, keep_headers=False)
    batches.add(b"0.a", b"x", 1, 10, None)
    for seq in (1, 2, 4, 7, 9, 12):
        batches.rows.add(b"0.b", b"p%d" % seq, seq, seq * 10)
    assert batches.keep_in_order(1, 2, 9) == (9, 3, True)
    assert list(batches.rows.seqs) == [1, 4, 7, 9]
    assert bytes(batches.rows.payload) == b"xp4p7p9" and list(batches.rows.offsets) == [0, 1, 3, 5, 7]
    for seq in (10, 11, 12):
        batches.rows.add(b"0.c", b"q", seq, seq)
    assert batches.keep_in_order(4, 9, 20, stop=6) == (11, 2, False)  # none after row 6 (a drained one)
    assert list(batches.rows.seqs) == [1, 4, 7, 9, 10, 11] and batches.rows.nbytes == 9
    batches.rows.add(b"0.d", b"r", 3, 3)
    assert batches.keep_in_order(6, 11, 20) == (11, 0, False) and len(batches.rows) == 6


def test_rows_of_no_partition_are_left_out_of_a_partitioned_read():
    """A read with ">" of a partitioned stream may meet messages stored before the stream was partitioned: no
    partition filter has them, so they are not rows either."""
    rows = RowBuffer()
    for seq, subject in enumerate([b"0.ev.a", b"ev.old", b"3.ev.b", b"x7.ev.c", b"42", b"12345678901.ev"], start=1):
        rows.add(subject, b"d%d" % seq, seq, seq * 1000)
    batch = rows.to_record_batch("S", partitioned=True, include_headers=False)
    assert batch.to_pydict()["seq"] == [1, 3]
    assert batch.to_pydict()["subject"] == ["ev.a", "ev.b"] and batch.to_pydict()["partition"] == [0, 3]
    assert batch.to_pydict()["data"] == [b"d1", b"d3"]


def test_a_partition_s_rows_and_mixed_rows_get_the_same_columns():
    """A partition's range (every subject has one partition token) has its token cut off each subject; rows of
    several partitions are split one by one: both give each row its partition and the rest of its subject."""
    cases = {
        "one partition": [b"3.ev.a", b"3.b", b"3.ev.c.d"],
        "another token that starts alike": [b"3.ev.a", b"31.b", b"3.c"],
        "several": [b"0.a", b"7.b.c", b"007.d"],
        "one of nine digits": [b"123456789.a", b"123456789.b"],
    }
    for name, subjects in cases.items():
        rows = RowBuffer()
        for seq, subject in enumerate(subjects, start=1):
            rows.add(subject, b"d", seq, seq)
        got = rows.to_record_batch("S", partitioned=True, include_headers=False).to_pydict()
        tokens = [subject.split(b".", 1) for subject in subjects]
        assert got["partition"] == [int(token) for token, _ in tokens], name
        assert got["subject"] == [rest.decode() for _, rest in tokens], name
        assert got["stream"] == ["S"] * len(subjects), name


def test_times_given_as_text_become_the_timestamp_column():
    """Direct Get's times come as RFC 3339 text, kept back to back and parsed once per batch."""
    rows = RowBuffer(text_times=True)
    rows.add(b"0.a", b"x", 1, b"2026-11-27T10:00:00.123456789Z")
    rows.add(b"1.bb", b"y", 2, b"2026-11-27T10:00:01Z")
    rows.add(b"2.c", b"zz", 3, b"1970-01-01T00:00:00Z")
    batch = rows.to_record_batch("S", partitioned=True, include_headers=False)
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [1_795_773_600_123_456, 1_795_773_601_000_000, 0]
    assert batch.to_pydict()["subject"] == ["a", "bb", "c"] and batch.to_pydict()["seq"] == [1, 2, 3]
    assert batch.to_pydict()["data"] == [b"x", b"y", b"zz"]
