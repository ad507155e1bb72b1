"""What a read costs the server, counted by the server itself (``/varz`` ``out_msgs``): messages it sends per message
read. Real nats-server; the reads of one streaming micro-batch's tasks, in this process."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.read.direct import read_range
from spark_jetstream.read.ranges import SeqRange
from spark_jetstream.testing import EmbeddedServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(name="cost") as made:
        yield made


def sent(server: EmbeddedServer) -> int:
    with urllib.request.urlopen(f"{server.monitor}/varz") as answer:
        return int(json.load(answer)["out_msgs"])


@pytest.mark.parametrize("batch", [10_000, 1_000])
def test_a_partitions_range_asks_for_what_it_holds(server: EmbeddedServer, batch: int):
    """8 partitions of 1,024 subjects, 24,000 messages; the batch ``(0, 12000]`` read a range per partition (as a
    streaming batch's tasks read it) sends about one message per message read, whatever ``directGetBatch``: asked for
    the range's width, each Direct Get batch made the server send the partition's messages after the range too (1.49
    a message read in a multi-batch read)."""
    options = ConnectionOptions(servers=(server.url,))
    conn = connect(options)
    name = f"COST{batch}"
    try:
        api = JetStreamApi(conn)
        api.create_stream({**partitioned_stream_config(name, f"{name.lower()}.*", 8), "allow_direct": True})
        publish_all(conn, ((f"{name.lower()}.k{i % 1024}", b"x" * 100, None) for i in range(24_000)))
        before = sent(server)
        read = 0
        for partition in range(8):
            seq_range = SeqRange(name, f"{partition}.>", 0, 12_000, True, direct_batch=batch)
            read += sum(record_batch.num_rows for record_batch in read_range(conn, seq_range))
        cost = sent(server) - before
    finally:
        disconnect(options)
    assert read == 12_000
    print(f"\n{cost} messages sent for {read} read (directGetBatch {batch})")
    assert cost <= 1.05 * read, f"{cost} messages sent for {read} read"
