"""The pin keeper (``streaming/pins.py``) on a real server: it takes each member consumer's pin with one delivery and
RESETs that delivery away, so an ack-none member's floor stays at the checkpoint."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats
import pytest
from helpers import wait_for

from spark_jetstream.client.jsapi import PRIORITY_GROUP, JetStreamApi, pin_holder
from spark_jetstream.errors import ApiError, GroupConfigError
from spark_jetstream.groups.admin import group_layout
from spark_jetstream.groups.layout import OWNER_METADATA_KEY
from spark_jetstream.streaming.member_consumers import MemberConsumers
from spark_jetstream.streaming.pins import SWEEP_EVERY, PinKeeper

pytestmark = pytest.mark.slow


def test_a_reset_that_fails_after_a_pin_was_taken_is_tried_again_with_the_pin_kept(
    api: JetStreamApi, make_stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load the RESET after a pin's taking delivery can fail (an API timeout). The keeper keeps that pin and
    resets again next round, and keeps the pins the same round took: it used to unpin every member again after a
    failed first round and take each pin anew, a delivery each that moves an ack-none floor until its RESET."""
    stream = make_stream(30, partitions=3, consumers="none")
    members, consumers = held_members(api, stream, "none")
    failed: list[str] = []
    reset = api.reset

    async def failing_once(name: str, consumer: str, seq: int) -> dict[str, Any]:
        if not failed:
            failed.append(consumer)
            raise ApiError(f"Resetting consumer {consumer!r} to seq {seq} timed out (the test's)")
        return await reset(name, consumer, seq)

    monkeypatch.setattr(api, "reset", failing_once)
    keeper = PinKeeper(members)
    keeper.start()
    try:

        def others_held() -> dict[str, str] | None:
            others = {c: keeper.pins.get(c) for c in consumers if c not in failed}
            return others if failed and None not in others.values() and not keeper.undoing - set(failed) else None

        first_pins = wait_for(others_held, 15, lambda: f"the other pins taken (pins {sorted(keeper.pins)})")
        wait_for(
            lambda: not keeper.undoing and sorted(keeper.pins) == sorted(consumers),
            15,
            lambda: f"every pin held and reset (failed {failed}, pins {sorted(keeper.pins)}, undoing {keeper.undoing})",
        )
        # the round that failed took the other pins too: they are kept, not released and taken again (a delivery each)
        assert {c: keeper.pins[c] for c in first_pins} == first_pins
        for consumer in consumers:
            info = api.consumer_info(stream.name, consumer)
            assert (pin_holder(info), info["ack_floor"]["stream_seq"], info["delivered"]["consumer_seq"]) == (
                keeper.pins[consumer],
                0,
                0,
            ), consumer
        keeper.raise_error()  # no other client was seen
    finally:
        keeper.stop()


def held_members(api: JetStreamApi, stream: Any, consumers: str) -> tuple[MemberConsumers, list[str]]:
    """A group's member consumers made as the query makes them, floors at 0 (the keeper checks nobody changed them)."""
    members = MemberConsumers(api, group_layout(api, stream.name, stream.group), 30.0, consumers, "test")
    members.acked_through = 0
    layout, metadata = members.layout, {OWNER_METADATA_KEY: "test"}
    for member in layout.member_names:
        api.create_consumer(
            stream.name, layout.consumer_config(member, 30.0, metadata, consumers, members.priority_timeout)
        )
    return members, [layout.consumer(member) for member in layout.member_names]


def pull_one(url: str, api: JetStreamApi, stream: str, consumer: str, pin: str | None = None) -> bytes:
    """Another client's pull of one message (with ``pin``: presenting that pin id), on a connection of its own."""
    request = {"batch": 1, "expires": 2_000_000_000, "group": PRIORITY_GROUP, **({"id": pin} if pin else {})}
    subject = api.subject("CONSUMER", "MSG", "NEXT", stream, consumer)

    async def pull() -> bytes:  # a subscription of its own: deliveries keep the stream's subjects
        client = await nats.connect(url)
        try:
            inbox = client.new_inbox()
            delivery = await client.subscribe(inbox)
            await client.publish(subject, json.dumps(request).encode(), reply=inbox)
            return (await delivery.next_msg(timeout=5)).data
        finally:
            await client.close()

    return asyncio.run(pull())


def test_a_taking_whose_reply_was_lost_is_reset_away_before_the_first_batch(
    api: JetStreamApi, nats_server, make_stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pin's taking delivery whose reply the keeper never saw (lost under load: seen once in CI, an ack-none floor
    left at the delivered seq through a whole batch) still counts on the consumer. The round's check finds that one
    delivery and resets it away, and ``settle`` (before a batch goes to Spark) waits for the first round: every floor
    is the checkpoint's when it returns."""
    stream = make_stream(30, partitions=3, consumers="none")
    members, consumers = held_members(api, stream, "none")
    keeper = PinKeeper(members)
    lost: list[str] = []
    pull = keeper._pull

    async def losing_once(consumer: str, request: dict[str, Any]) -> tuple[str, str | None]:
        status, pin = await pull(consumer, request)
        if not lost and "id" not in request:
            lost.append(consumer)
            return "timeout", None  # delivered, pinned, and the keeper never knew
        return status, pin

    monkeypatch.setattr(keeper, "_pull", losing_once)
    keeper.start()
    try:
        keeper.settle(15)
        assert lost and keeper.rounds >= 1
        infos = {c: api.consumer_info(stream.name, c) for c in consumers}
        assert {c: (i["ack_floor"]["stream_seq"], i["delivered"]["consumer_seq"]) for c, i in infos.items()} == {
            c: (0, 0) for c in consumers
        }
        assert sorted(keeper.pins) == sorted(set(consumers) - set(lost))
        lost_pin = pin_holder(infos[lost[0]])
        assert lost_pin is not None  # the lost taking's pin, which nobody presents
        keeper.raise_error()  # one delivery is a taking's trace, not another client

        # one trace per taking: a client that presents that pin and pulls one message is another client
        assert pull_one(nats_server.url, api, stream.name, lost[0], lost_pin)  # served: it presented the pin id
        wait_for(lambda: keeper.error is not None, 2 * SWEEP_EVERY + 5, "the keeper to find the other client")
        with pytest.raises(GroupConfigError, match=rf"member consumer {lost[0]!r} .*\(1 delivery since the query"):
            keeper.raise_error()
    finally:
        keeper.stop()


def test_a_trace_being_reset_is_not_taken_for_another_client_by_a_commits_check(
    api: JetStreamApi, nats_server, make_stream
) -> None:
    """A commit's RESET checks its consumer first (``before_reset``) and may do so between the round's check that
    found a trace and that trace's RESET: the delivery is still the trace, not another client's. Once that RESET is
    done, a delivery is another client's."""
    stream = make_stream(30, partitions=3, consumers="none")
    members, consumers = held_members(api, stream, "none")
    keeper, consumer = PinKeeper(members), consumers[0]
    assert pull_one(nats_server.url, api, stream.name, consumer)  # one delivery on the consumer
    keeper.traced.add(consumer)
    keeper.undoing.add(consumer)  # the round found the trace; its RESET waits for the commit's lock
    assert api.conn.run(keeper.check(consumer)) == []
    keeper.undoing.discard(consumer)  # reset: a delivery now is another client's
    with pytest.raises(GroupConfigError, match=rf"member consumer {consumer!r} .*\(1 delivery since the query"):
        api.conn.run(keeper.check(consumer))
