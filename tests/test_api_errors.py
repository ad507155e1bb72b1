"""A query in steady state causes no JetStream API errors: the server counts each one (``$JS.API.INFO``'s
``api.errors``, ``/jsz``), and operators alert on that counter."""

from __future__ import annotations

import json

from helpers import fnv1a_32, wait_for

from spark_jetstream.client.connection import connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.messages import next_on_leader
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.options import parse_connection_options
from spark_jetstream.testing import EmbeddedServer

ROUNDS = 8


def test_no_read_mode_causes_api_errors_batch_after_batch_and_a_config_made_later_is_taken_up(spark):
    """Four queries at once, each read mode with a group and without, over batches where most partitions get
    nothing new (so planning and the readers ask the stream leader whether a partition has more): not one API error.
    Before, each batch of a group without a pcgroups config asked both config buckets that did not exist (2 errors),
    and a partition with nothing new cost one ("no message found"): 49 errors over these 7 rounds. A static config
    written later is read at the next batch boundary all the same. (A partition that never held a message costs one
    error at each process's first look: ``test_a_partition_that_never_held_a_message_is_asked_without_an_error``.)"""
    with EmbeddedServer(name="api-errors") as server:
        conn = connect(parse_connection_options({"servers": server.url}))
        api = JetStreamApi(conn)
        api.create_stream({**partitioned_stream_config("P", "ev.*", 4), "allow_direct": True})
        api.create_stream({"name": "PLAIN", "subjects": ["plain.>"]})  # a client's defaults: no Direct Get

        def publish(round_: int) -> None:  # one key each time: one partition of P gets messages
            publish_all(conn, [(f"ev.k{round_}", f"{round_}-{i}".encode(), None) for i in range(5)])
            publish_all(conn, [(f"plain.s{round_ % 3}", f"{round_}-{i}".encode(), None) for i in range(5)])

        publish_all(conn, [(f"ev.k{i}", b"first", None) for i in range(40)])  # every partition holds messages
        publish_all(conn, [(f"plain.s{i}", b"first", None) for i in range(40)])
        first = 40

        def query(name: str, stream: str, **options: str):
            reader = spark.readStream.format("jetstream").option("servers", server.url).option("stream", stream)
            df = reader.options(**options).load()
            return df.writeStream.format("memory").queryName(name).trigger(processingTime="100 milliseconds").start()

        publish(0)
        queries = [
            query("group_direct", "P", group="gd", readMode="direct"),
            query("group_pull", "P", group="gp", readMode="pull"),
            query("plain_direct", "P"),
            query("plain_pull", "PLAIN"),
        ]
        try:
            for q in queries:
                q.processAllAvailable()
            errors = api.account_info()["api"]["errors"]
            for round_ in range(1, ROUNDS):
                publish(round_)
                for q in queries:
                    q.processAllAvailable()
            new_errors = api.account_info()["api"]["errors"] - errors
            assert new_errors == 0, f"{new_errors} API errors over {ROUNDS - 1} rounds of batches"
            for q in queries:
                rows = spark.table(q.name).select("seq").collect()
                assert sorted(r.seq for r in rows) == list(range(1, first + ROUNDS * 5 + 1)), q.name

            # A pcgroups static config for group gd, written while the query runs: the next batch reads by it.
            js = conn.client.jetstream()

            async def write_config() -> None:
                kv = await js.create_key_value(bucket="static-consumer-groups")
                mappings = [{"member": "alice", "partitions": [0, 1]}, {"member": "bob", "partitions": [2, 3]}]
                await kv.put("P.gd", json.dumps({"max_members": 4, "member_mappings": mappings}).encode())

            conn.run(write_config())
            publish(ROUNDS)
            queries[0].processAllAvailable()
            last = api.stream_info("P")["state"]["last_seq"]

            def floors() -> dict[str, int]:
                names = set(api.consumer_names("P"))  # the new members' consumers come with the next batch
                members = [c for c in ("gd-alice", "gd-bob") if c in names]
                return {c: api.consumer_info("P", c)["ack_floor"]["stream_seq"] for c in members}

            wait_for(
                lambda: floors() == {"gd-alice": last, "gd-bob": last}, 30, lambda: f"floors at {last}: {floors()}"
            )
            errors = api.account_info()["api"]["errors"]  # the new members' consumers were made: not steady state
            for round_ in range(ROUNDS + 1, ROUNDS + 4):
                publish(round_)
                for q in queries:
                    q.processAllAvailable()
            wait_for(lambda: set(floors().values()) == {last + 15}, 10, lambda: f"floors at {last + 15}: {floors()}")
            assert api.account_info()["api"]["errors"] == errors
        finally:
            for q in queries:
                q.stop()
            disconnect(conn)


def test_a_filters_next_message_is_found_when_the_streams_last_seq_was_removed(api, conn):
    """The server answers the last message of ``>`` by loading the stream's last seq, which a delete or a purge may
    have removed: "no message found" though the stream holds messages. Believed, a batch read of a stream whose tail
    was purged found nothing to read; the count of matching subjects is asked before the answer is."""
    api.create_stream({"name": "TAIL", "subjects": ["tail.>"]})
    try:
        publish_all(conn, [(f"tail.{'ab'[i % 2]}", b"x", None) for i in range(10)])
        conn.run(conn.client.request("$JS.API.STREAM.MSG.DELETE.TAIL", json.dumps({"seq": 10}).encode()))
        assert conn.run(next_on_leader(api, "TAIL", ">", 0)) == 1
        assert conn.run(next_on_leader(api, "TAIL", "tail.>", 3)) == 4
        assert conn.run(next_on_leader(api, "TAIL", "tail.a", 8)) == 9
        assert conn.run(next_on_leader(api, "TAIL", "tail.b", 8)) is None  # its last, seq 10, is gone
        assert conn.run(next_on_leader(api, "TAIL", "tail.c", 0)) is None  # never held one
    finally:
        api.delete_stream("TAIL")


def test_a_partition_that_never_held_a_message_is_asked_without_an_error(api, conn):
    """Its last message cannot be asked without "no message found": the first look costs that one error, and from then
    on the process asks how many subjects match (none: no error) until one does."""
    from spark_jetstream.client.messages import _HELD_NOTHING

    api.create_stream(partitioned_stream_config("SPARSE", "sparse.*", 4))
    try:
        publish_all(conn, [("sparse.k1", b"x", None)] * 3)  # one partition of four
        empty = next(f"{p}.>" for p in range(4) if conn.run(next_on_leader(api, "SPARSE", f"{p}.>", 0)) is None)
        assert ("SPARSE", empty) in _HELD_NOTHING
        errors = api.account_info()["api"]["errors"]
        for _ in range(5):
            assert conn.run(next_on_leader(api, "SPARSE", empty, 0)) is None
        assert api.account_info()["api"]["errors"] == errors
        key = next(f"k{i}" for i in range(100) if f"{fnv1a_32(f'k{i}'.encode()) % 4}.>" == empty)
        publish_all(conn, [(f"sparse.{key}", b"x", None)])  # seq 4
        assert conn.run(next_on_leader(api, "SPARSE", empty, 0)) == 4
        assert ("SPARSE", empty) not in _HELD_NOTHING and api.account_info()["api"]["errors"] == errors
    finally:
        api.delete_stream("SPARSE")
