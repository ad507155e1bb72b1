"""The pull window's pacing, without a server: which pull requests go out, and when none may."""

from __future__ import annotations

import json

from spark_jetstream.streaming.pull import PullSettings
from spark_jetstream.streaming.pull_window import PullWindow

SETTINGS = PullSettings(batch=100, in_flight=3, expires=2.0, idle_heartbeat=1.0, record_batch_size=1000, max_bytes=4096)
UNBOUNDED = 1 << 40  # a range that holds more than any budget
NOTHING_BUFFERED = (0, 0)


def _batches(requests: list[bytes]) -> list[int]:
    return [json.loads(request)["batch"] for request in requests]


def test_one_pull_until_the_pin_id_is_known_then_in_flight_pulls_within_the_budget():
    window = PullWindow(SETTINGS, "g")
    window.restart(budget=250)
    first = window.next_requests(None, NOTHING_BUFFERED, max_payload=1 << 20, in_range=UNBOUNDED)
    assert _batches(first) == [100]
    assert "id" not in json.loads(first[0])
    pinned = window.next_requests("pin-1", NOTHING_BUFFERED, max_payload=1 << 20, in_range=UNBOUNDED)
    assert _batches(pinned) == [100, 50]  # three in flight at most, never more than the budget
    assert all(json.loads(request)["id"] == "pin-1" for request in pinned)
    assert window.next_requests("pin-1", NOTHING_BUFFERED, max_payload=1 << 20, in_range=UNBOUNDED) == []


def test_no_pull_while_two_record_batches_wait():
    window = PullWindow(SETTINGS, "g")
    window.restart(budget=1000)
    assert (
        window.next_requests("pin", (2 * SETTINGS.record_batch_size, 0), max_payload=1 << 20, in_range=UNBOUNDED) == []
    )
    assert (
        window.next_requests("pin", (0, 2 * SETTINGS.record_batch_bytes), max_payload=1 << 20, in_range=UNBOUNDED) == []
    )


def test_deliveries_come_off_the_oldest_pulls_and_the_budget():
    window = PullWindow(SETTINGS, "g")
    window.restart(budget=300)
    window.next_requests("pin", NOTHING_BUFFERED, max_payload=1 << 20, in_range=UNBOUNDED)
    window.delivered(130)
    assert window.budget == 170
    assert list(window.requests) == [0, 70, 100]  # a full pull stays listed until its status
    window.ended()
    assert list(window.requests) == [70, 100]
    assert (
        window.next_requests("pin", NOTHING_BUFFERED, max_payload=1 << 20, in_range=UNBOUNDED) == []
    )  # 170 already asked for


def test_a_message_over_max_bytes_gets_one_pull_sized_by_max_payload():
    window = PullWindow(SETTINGS, "g")
    window.restart(budget=10)
    window.next_requests("pin", NOTHING_BUFFERED, max_payload=1 << 20, in_range=UNBOUNDED)
    window.ended(oversize=True)
    big, *_ = window.next_requests("pin", NOTHING_BUFFERED, max_payload=1 << 20, in_range=UNBOUNDED)
    assert json.loads(big)["max_bytes"] == 2 * (1 << 20) + 65536
    window.ended()
    normal, *_ = window.next_requests("pin", NOTHING_BUFFERED, max_payload=1 << 20, in_range=UNBOUNDED)
    assert json.loads(normal)["max_bytes"] == SETTINGS.max_bytes


def test_a_filled_pull_makes_room_for_the_next_before_its_status():
    """The server may send a filled pull's status late: the next pull goes out when the pull is filled, so
    ``in_flight`` pulls stay served (the filled one stays listed until its status, which pops it)."""
    window = PullWindow(SETTINGS, "g")
    window.restart(budget=1000)
    assert _batches(window.next_requests("pin", NOTHING_BUFFERED, max_payload=1 << 20, in_range=UNBOUNDED)) == [
        100,
        100,
        100,
    ]
    window.delivered(100)
    assert _batches(window.next_requests("pin", NOTHING_BUFFERED, max_payload=1 << 20, in_range=UNBOUNDED)) == [100]
    assert list(window.requests) == [0, 100, 100, 100]
    assert window.owed() == 300
    window.ended()
    assert list(window.requests) == [100, 100, 100]
    assert window.next_requests("pin", NOTHING_BUFFERED, max_payload=1 << 20, in_range=UNBOUNDED) == []


def test_a_later_pull_completed_first_leaves_what_the_oldest_owes_owed():
    """The server may fill a later pull before the oldest (the pin-less first pull often went last): its "Batch
    Completed" pops the oldest listed, whose rest stays owed, or the next pulls asked for it again (a streaming read
    in 8 batches had the server send 1.10-1.15 messages per message read)."""
    window = PullWindow(PullSettings(batch=1000, in_flight=4), "g")
    window.restart(50_000)
    window.next_requests(None, NOTHING_BUFFERED, max_payload=1 << 20, in_range=1000)  # the pin-less first pull
    assert _batches(window.next_requests("pin", NOTHING_BUFFERED, max_payload=1 << 20, in_range=1091)) == [91]
    window.delivered(91)  # the second pull's: its status comes next
    window.ended(completed=True)
    assert window.owed() == 1000
    assert window.next_requests("pin", NOTHING_BUFFERED, max_payload=1 << 20, in_range=1000) == []
    window.ended()  # expired: what it still owed is owed no more
    assert window.owed() == 0


def test_pulls_ask_no_more_than_the_range_still_holds():
    """The budget counts the member's messages up to the stream's end: near a range's end the pulls ask for what the
    range holds (``in_range``), or they would bring the next batch's messages, dropped and sent again."""
    window = PullWindow(PullSettings(batch=1000, in_flight=4), "g")
    window.restart(50_000)
    asked = [json.loads(r)["batch"] for r in window.next_requests("pin", (0, 0), 1 << 20, in_range=2500)]
    assert asked == [1000, 1000, 500]
    window.delivered(2000)
    assert window.taken == 2000
    assert [json.loads(r)["batch"] for r in window.next_requests("pin", (0, 0), 1 << 20, in_range=600)] == [100]
    window.restart(48_000)  # a progress check's new budget: the count since the RESET goes on
    assert window.taken == 2000
    unbounded = [json.loads(r)["batch"] for r in window.next_requests("pin", (0, 0), 1 << 20, UNBOUNDED)]
    assert unbounded == [1000, 1000, 1000, 1000]
