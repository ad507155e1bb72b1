"""Read limits -> the end of the next batch (pure functions), and the offset format."""

from __future__ import annotations

import json

import pytest

from spark_jetstream.errors import OptionError
from spark_jetstream.groups.layout import balanced_mapping
from spark_jetstream.stream.offsets import Watermark
from spark_jetstream.stream.planning import Limits, batch_end


def test_no_limit_reads_everything_and_nothing_new_means_no_batch():
    assert batch_end(10, 500, Limits(), 100.0) == 500
    assert batch_end(500, 500, Limits(), 100.0) == 500


def test_max_rows_is_exact_in_seq_width():
    assert batch_end(10, 500, Limits(max_rows=100), 100.0) == 110
    assert batch_end(450, 500, Limits(max_rows=100), 100.0) == 500


def test_max_bytes_uses_the_average_message_size():
    assert batch_end(0, 10_000, Limits(max_bytes=50_000), 100.0) == 500
    assert batch_end(0, 10_000, Limits(max_bytes=10), 100.0) == 1  # always progress
    assert batch_end(0, 10_000, Limits(max_rows=300, max_bytes=50_000), 100.0) == 300  # both apply


def test_min_rows_waits_until_enough_or_the_delay_passed():
    assert batch_end(0, 40, Limits(min_rows=50), 100.0) == 0
    assert batch_end(0, 60, Limits(min_rows=50), 100.0) == 60
    assert batch_end(0, 40, Limits(min_rows=50, min_rows_waited_out=True), 100.0) == 40


def test_available_now_cap():
    assert batch_end(0, 900, Limits(), 1.0, cap=600) == 600
    assert batch_end(600, 900, Limits(), 1.0, cap=600) == 600


def test_offsets_serialize_with_sorted_keys_and_belong_to_one_stream():
    offset = Watermark("orders", 42).to_offset()
    assert json.dumps(offset) == json.dumps(offset, sort_keys=True) == '{"seq": 42, "stream": "orders"}'
    assert Watermark.from_offset({"stream": "orders", "seq": 42}, "orders") == Watermark("orders", 42)
    with pytest.raises(OptionError, match="written for stream 'orders' but the stream option is 'other'"):
        Watermark.from_offset(offset, "other")
    with pytest.raises(OptionError, match="cannot read"):
        Watermark.from_offset({"partition": 3}, "orders")


# Vectors derived by hand from pcgroups' GeneratePartitionFilters (synadia-io/orbit.go): members
# deduplicated and sorted byte-wise, cut to max_members, contiguous blocks of max // n, the
# remainder dealt one each from the first member.
@pytest.mark.parametrize(
    ("max_members", "members", "expected"),
    [
        (4, ["a", "b", "c", "d"], {"a": [0], "b": [1], "c": [2], "d": [3]}),
        (8, ["a", "b", "c"], {"a": [0, 1, 6], "b": [2, 3, 7], "c": [4, 5]}),
        (6, ["m1", "m2", "m3", "m4"], {"m1": [0, 4], "m2": [1, 5], "m3": [2], "m4": [3]}),
        (5, ["x", "y"], {"x": [0, 1, 4], "y": [2, 3]}),
        (3, ["a", "b", "c", "d", "e"], {"a": [0], "b": [1], "c": [2]}),
        (10, ["z", "a", "m"], {"a": [0, 1, 2, 9], "m": [3, 4, 5], "z": [6, 7, 8]}),
        (7, ["b", "a", "b"], {"a": [0, 1, 2, 6], "b": [3, 4, 5]}),
        (12, ["10", "2", "1"], {"1": [0, 1, 2, 3], "10": [4, 5, 6, 7], "2": [8, 9, 10, 11]}),
    ],
)
def test_balanced_mapping_matches_pcgroups(max_members, members, expected):
    assert balanced_mapping(members, max_members) == expected
