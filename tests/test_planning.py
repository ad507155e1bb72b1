"""Read limits -> the end of the next batch, ranges -> Spark partitions (``minPartitions``): pure functions; and the
offset format."""

from __future__ import annotations

import json
import random
from itertools import pairwise

import pytest

from spark_jetstream.errors import OptionError
from spark_jetstream.groups.layout import balanced_mapping
from spark_jetstream.read.direct import spread
from spark_jetstream.read.ranges import SeqRange
from spark_jetstream.streaming.offsets import Watermark
from spark_jetstream.streaming.planning import Limits, batch_end


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


def seq_range(start: int, end: int, subject: str = ">") -> SeqRange:
    return SeqRange(stream="S", filter=subject, start=start, end=end, partitioned=subject != ">")


def bounds(ranges: list[SeqRange]) -> list[tuple[str, int, int]]:
    return [(r.filter, r.start, r.end) for r in ranges]


def test_min_partitions_cuts_one_range_into_contiguous_slices_of_about_equal_width():
    assert bounds(spread([seq_range(0, 400_000)], 8)) == [(">", 50_000 * i, 50_000 * (i + 1)) for i in range(8)]
    assert bounds(spread([seq_range(10, 20)], 3)) == [(">", 10, 13), (">", 13, 16), (">", 16, 20)]


def test_min_partitions_leaves_enough_ranges_alone():
    ranges = [seq_range(0, 100, f"{p}.>") for p in range(4)]
    assert spread(ranges, 4) == spread(ranges, 2) == spread(ranges, None) == ranges
    assert spread([], 8) == []


def test_min_partitions_gives_the_extra_slices_to_the_widest_ranges():
    wide, narrow = seq_range(0, 1000, "0.>"), seq_range(900, 1000, "1.>")
    assert bounds(spread([wide, narrow], 4)) == [
        ("0.>", 0, 333), ("0.>", 333, 666), ("0.>", 666, 1000), ("1.>", 900, 1000)
    ]  # fmt: skip
    # widths 100 and 100: the extra slice goes to the first (a fixed rule, so a replay cuts alike)
    assert bounds(spread([seq_range(0, 100, "a"), seq_range(0, 100, "b")], 3)) == [
        ("a", 0, 50), ("a", 50, 100), ("b", 0, 100)
    ]  # fmt: skip


def test_min_partitions_never_cuts_below_one_seq():
    assert bounds(spread([seq_range(5, 8), seq_range(8, 9, "x")], 10)) == [
        (">", 5, 6), (">", 6, 7), (">", 7, 8), ("x", 8, 9)
    ]  # fmt: skip


@pytest.mark.parametrize("seed", range(20))
def test_min_partitions_keeps_every_seq_once_and_depends_only_on_the_ranges(seed):
    rng = random.Random(seed)
    ranges = []
    for p in range(rng.randrange(1, 6)):
        start = rng.randrange(0, 5000)
        ranges.append(seq_range(start, start + rng.randrange(1, 3000), f"{p}.>"))
    wanted = rng.randrange(1, 40)
    slices = spread(ranges, wanted)
    assert slices == spread(list(ranges), wanted)  # a replay of the batch is cut the same way
    assert len(slices) == max(len(ranges), min(wanted, sum(r.end - r.start for r in ranges)))
    for original in ranges:
        own = [s for s in slices if s.filter == original.filter]
        assert own[0].start == original.start and own[-1].end == original.end
        assert all(a.end == b.start for a, b in pairwise(own))  # contiguous, in seq order
        assert all(s.end > s.start for s in own)
        widths = {s.end - s.start for s in own}
        assert max(widths) - min(widths) <= 1
        assert all(s.stream == "S" and s.partitioned == original.partitioned for s in own)


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
