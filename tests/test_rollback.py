"""A stream that went back (its store put back to an earlier copy: a restored backup, or writes lost before
``sync_interval`` synced them) is never read past silently. A real nats-server stopped, its store folder replaced by a
copy taken earlier, started again; the stream reader's driver-side methods called as Spark calls them, and its tasks
read in this process (as ``test_replays.py``)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from helpers import query_run as run
from helpers import spark_json, wait_for

from spark_jetstream.client.connection import connect
from spark_jetstream.client.connection_options import ConnectionOptions
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import DataLossError
from spark_jetstream.groups.layout import partitioned_stream_config
from spark_jetstream.source import JetStreamStreamReader
from spark_jetstream.testing import EmbeddedServer

pytestmark = pytest.mark.slow


class Store:
    """One server whose store can be copied and put back."""

    def __init__(self, root: Path) -> None:
        (root / "server").mkdir()
        self.server = EmbeddedServer(name="rollback", store_dir=str(root / "server")).start()
        self.js = Path(self.server.dir, "js")
        self.copy = root / "copy"

    def publish(self, subject: str, texts: list[str]) -> None:
        publish(self.server.url, subject, texts)

    def keep(self) -> None:
        """Copy the store as it is now (the server stopped for it, then started again)."""
        self.server.stop()
        shutil.copytree(self.js, self.copy)
        self.server.start()

    def put_back(self) -> None:
        """Replace the store by the copy: the server comes back with the stream as it was then."""
        self.server.stop()
        shutil.rmtree(self.js)
        shutil.copytree(self.copy, self.js)
        self.server.start()


def publish(url: str, subject: str, texts: list[str]) -> None:
    """One message per text, each awaited for its PubAck."""

    async def send() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        for text in texts:
            await js.publish(subject, text.encode())
        await nc.close()

    asyncio.run(send())


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    made = Store(tmp_path)
    yield made
    made.server.stop()


def batch(reader: JetStreamStreamReader, start: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[int, bytes]]]:
    """One micro-batch from ``start``: its end offset and its rows (seq, data), read as Spark would (asking again while
    there is no batch: a stream that went back is believed after ``WENT_BACK_CONFIRM``)."""
    deadline = time.monotonic() + 15
    while (end := spark_json(reader.latestOffset(start, None))) == start and time.monotonic() < deadline:
        time.sleep(0.1)
    rows = [
        (row["seq"], row["data"])
        for part in reader.partitions(start, end)
        for record_batch in reader.read(part)
        for row in record_batch.to_pylist()
    ]
    return end, sorted(rows)


def data_loss(call: Callable[[], object]) -> DataLossError:
    """The ``DataLossError`` ``call`` raises, asked again every 0.1 s for up to 15 s (the stream's word that it went
    back is believed after ``WENT_BACK_CONFIRM``)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            call()
        except DataLossError as exc:
            return exc
        time.sleep(0.1)
    raise AssertionError("no DataLossError within 15 s")


def texts(prefix: str, first: int, last: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(first, last + 1)]


@pytest.mark.parametrize("new", [40, 10])
def test_a_stream_put_back_under_the_checkpoint_fails_or_reads_the_new_messages_once(store: Store, new, caplog):
    """Read to seq 40, the store put back to seq 20, then ``new`` messages published (seqs 21..20+new: 40 pass the
    checkpoint, 10 do not). By default the query fails saying what happened; with ``failOnDataLoss=false`` it reads
    every new message once, from seq 21, and says so once."""
    api = JetStreamApi(connect(ConnectionOptions(servers=(store.server.url,))))
    api.create_stream({"name": "RB", "subjects": ["rb.>"]})
    store.publish("rb.a", texts("old", 1, 20))
    store.keep()
    store.publish("rb.a", texts("old", 21, 40))
    options = {"servers": store.server.url, "stream": "RB"}
    with run(options) as first:
        start = spark_json(first.initialOffset())
        checkpoint, rows = batch(first, start)
        first.commit(checkpoint)
    assert [seq for seq, _ in rows] == list(range(1, 41))

    store.put_back()
    assert api.stream_info("RB")["state"]["last_seq"] == 20
    store.publish("rb.a", texts("new", 21, 20 + new))
    with run(options) as strict:
        failed = data_loss(lambda: strict.latestOffset(checkpoint, None))
    reused = "21..40 that the checkpoint covers"
    assert str(failed) == (
        "Stream 'RB' went back to an earlier state: when the checkpoint's last batch was planned its last message was "
        f"seq 40; now its messages from seq 21 on were stored after that (its last seq is {20 + new}). The server "
        "lost acknowledged messages: a store restored from an earlier copy, or writes not yet synced to disk when the "
        "server, or a majority of the stream's servers, lost power (nats-server syncs every sync_interval, 2 min by "
        f"default). So its messages 21..40 as the checkpoint's batch saw them are gone, and new messages reuse seqs "
        f"{reused}. Set failOnDataLoss=false to read on from seq 21 (the new messages once each), or use a new "
        "checkpoint location."
    )
    with run({**options, "failOnDataLoss": "false"}) as lenient, caplog.at_level(logging.WARNING):
        end, rows = batch(lenient, checkpoint)
        lenient.commit(end)
        assert lenient.latestOffset(end, None) == end  # nothing more
    assert rows == [(seq, f"new{seq}".encode()) for seq in range(21, 21 + new)]
    assert (end["seq"], end["start"]) == (20 + new, 20)
    warned = [r.getMessage() for r in caplog.records if "went back" in r.getMessage()]
    assert len(warned) == 1 and warned[0].endswith("Reading on from seq 21 (failOnDataLoss=false).")


def test_a_running_query_sees_the_stream_go_back(store: Store):
    """The same under one running reader: the stream put back to seq 20 while the query sits at 40, then 30 new
    messages: the next batch fails instead of reading 41..50 only."""
    api = JetStreamApi(connect(ConnectionOptions(servers=(store.server.url,))))
    api.create_stream({"name": "RB", "subjects": ["rb.>"]})
    store.publish("rb.a", texts("old", 1, 20))
    store.keep()
    store.publish("rb.a", texts("old", 21, 40))
    with run({"servers": store.server.url, "stream": "RB"}) as reader:
        checkpoint, _ = batch(reader, spark_json(reader.initialOffset()))
        reader.commit(checkpoint)
        assert reader.latestOffset(checkpoint, None) == checkpoint
        store.put_back()
        store.publish("rb.a", texts("new", 21, 50))
        assert "went back to an earlier state" in str(data_loss(lambda: reader.latestOffset(checkpoint, None)))


def test_a_groups_floors_never_pass_what_the_stream_holds(store: Store):
    """A WorkQueue stream read through a group to seq 40 (floors at 40, 1..40 removed), put back to seq 20 (floors and
    messages as they were then), 40 new messages: the query fails before it moves a floor, and no new message is
    removed; with failOnDataLoss=false it reads the 40 new ones once and the floors end at 60."""
    api = JetStreamApi(connect(ConnectionOptions(servers=(store.server.url,))))
    api.create_stream(partitioned_stream_config("WQ", "wq.*", 2, retention="workqueue", allow_direct=True))
    for i in range(1, 21):
        store.publish(f"wq.k{i % 5}", [f"old{i}"])
    options = {"servers": store.server.url, "stream": "WQ", "group": "g"}
    with run(options) as first:  # the group's member consumers are made, their floors at 0
        start = spark_json(first.initialOffset())
        early, _ = batch(first, start)
        first.commit(early)
    store.keep()
    for i in range(21, 41):
        store.publish(f"wq.k{i % 5}", [f"old{i}"])
    with run(options) as second:
        checkpoint, rows = batch(second, early)
        second.commit(checkpoint)
        assert second.latestOffset(checkpoint, None) == checkpoint  # the floors move to 40
    assert [seq for seq, _ in rows] == list(range(21, 41))
    assert api.stream_info("WQ")["state"]["messages"] == 0

    store.put_back()
    for i in range(21, 61):
        store.publish(f"wq.k{i % 5}", [f"new{i}"])

    def floors() -> list[int]:
        return [api.consumer_info("WQ", name)["ack_floor"]["stream_seq"] for name in ("g-0", "g-1")]

    with run(options) as strict, pytest.raises(DataLossError, match="went back to an earlier state"):
        strict.commit(checkpoint)  # a restarted run's reconciliation, before its first latestOffset
    assert max(floors()) <= 20
    with run(options) as strict:
        assert "went back to an earlier state" in str(data_loss(lambda: strict.latestOffset(checkpoint, None)))
    assert max(floors()) <= 20
    assert api.stream_info("WQ")["state"]["messages"] == 40
    with run({**options, "failOnDataLoss": "false"}) as lenient:
        end, rows = batch(lenient, checkpoint)
        lenient.commit(end)
        assert lenient.latestOffset(end, None) == end
    assert rows == [(seq, f"new{seq}".encode()) for seq in range(21, 61)]
    assert floors() == [60, 60]


def test_a_member_consumer_put_back_with_the_store_is_named_so(store: Store):
    """A running group query whose server's store is put back: its member consumers carry an earlier run's owner
    again, which the query names as what it is, not as another client's change."""
    from spark_jetstream.errors import GroupConfigError

    api = JetStreamApi(connect(ConnectionOptions(servers=(store.server.url,))))
    api.create_stream(partitioned_stream_config("GB", "gb.*", 2))
    for i in range(20):
        store.publish(f"gb.k{i % 5}", [f"old{i}"])
    options = {"servers": store.server.url, "stream": "GB", "group": "g"}
    with run(options) as first:  # makes the member consumers, its owner in their metadata
        early, _ = batch(first, spark_json(first.initialOffset()))
        first.commit(early)
    store.keep()
    with run(options) as second:
        checkpoint, _ = batch(second, early)
        second.commit(checkpoint)
        store.put_back()
        keeper = second.coordinator.group.pins  # type: ignore[union-attr]
        assert keeper is not None
        with pytest.raises(
            GroupConfigError, match="went back to how an earlier run of a spark-jetstream query left it"
        ):
            second.coordinator.conn.run(keeper.check())


def test_a_replicated_stream_whose_majority_went_back_fails_the_query_through_any_server():
    """R3: two replicas' stores put back to seq 20 under a checkpoint at 40, the three servers stopped, those two
    started first (they elect a leader at seq 20), then the third, which keeps its longer log and may answer Direct
    Gets with the old messages. The check asks the leader, so a query connected to the third server fails too."""
    from spark_jetstream.testing import EmbeddedCluster

    cluster = EmbeddedCluster(3, name="rb3").start()
    copies: list[Path] = []
    try:
        api = JetStreamApi(connect(ConnectionOptions(servers=(cluster.servers[0].url,))))
        api.create_stream({"name": "R3", "subjects": ["r3.>"], "num_replicas": 3})

        def publish_r3(prefix: str, first: int, last: int) -> None:
            publish(cluster.servers[0].url, "r3.a", texts(prefix, first, last))

        def restart(first: list[int], then: list[int]) -> None:
            for server in cluster.servers:
                server.stop()
            for index in first:
                cluster.servers[index].launch()
            for index in first:
                cluster.servers[index].wait_ready()
            wait_for(lambda: _last_seq(cluster.servers[first[0]].url) is not None, 30, "the stream to have a leader")
            for index in then:
                cluster.servers[index].start()

        publish_r3("old", 1, 20)
        for server in cluster.servers:
            server.stop()
        for index in (0, 1):
            copies.append(Path(cluster.servers[index].dir, "copy"))
            shutil.copytree(Path(cluster.servers[index].dir, "js"), copies[-1])
        restart([0, 1, 2], [])
        wait_for(lambda: _last_seq(cluster.servers[0].url) == 20, 30, "the stream back at seq 20")
        publish_r3("old", 21, 40)
        options = {"servers": cluster.servers[2].url, "stream": "R3"}
        with run(options) as first:
            checkpoint, rows = batch(first, spark_json(first.initialOffset()))
            first.commit(checkpoint)
        assert [seq for seq, _ in rows] == list(range(1, 41))

        for server in cluster.servers:
            server.stop()
        for index in (0, 1):
            shutil.rmtree(Path(cluster.servers[index].dir, "js"))
            shutil.copytree(copies[index], Path(cluster.servers[index].dir, "js"))
        restart([0, 1], [2])
        wait_for(lambda: _last_seq(cluster.servers[0].url) == 20, 30, "the stream's leader at seq 20")
        publish_r3("new", 21, 60)
        with run(options) as strict:
            failed = data_loss(lambda: strict.latestOffset(checkpoint, None))
        assert "its messages 21..40 as the checkpoint's" in str(failed)
    finally:
        cluster.close()


def _last_seq(url: str) -> int | None:
    async def ask() -> int | None:
        nc = await nats.connect(url)
        try:
            return (await nc.jetstream().stream_info("R3")).state.last_seq
        except Exception:
            return None
        finally:
            await nc.close()

    return asyncio.run(ask())
