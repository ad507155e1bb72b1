"""The pull window: which pull requests the pinned pull reader sends, and when.

It paces the read and bounds its memory: one request until the pin id is known, then a few in
flight, none while record batches wait for the caller, never more messages than the last RESET
said match. Pure bookkeeping, no I/O: ``pull._PinnedPull`` sends what it returns and reports
what arrived.
"""

from __future__ import annotations

import json
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jetstream.streaming.config import PullSettings

_NS = 1_000_000_000


class PullWindow:
    """The pull requests in flight and the messages still to ask for: the read's pacing and memory bound.

    One request until the pin id is known, then up to ``in_flight`` still owed messages; none while about two
    record batches wait for the caller. ``budget`` is what matched at the last RESET, less what arrived.
    """

    def __init__(self, settings: PullSettings, group: str) -> None:
        self.settings = settings
        self.group = group
        self.requests: deque[int] = deque()  # messages still owed by each outstanding pull, oldest first
        self.budget = 0
        self.taken = 0  # messages delivered since the consumer's last RESET (``reset``)
        self.oversize = False  # the next pull must fit a message larger than max_bytes

    def reset(self, budget: int) -> None:
        """The consumer was RESET: ``budget`` matching messages from there, none of them taken yet."""
        self.restart(budget)
        self.taken = 0

    def restart(self, budget: int | None = None) -> None:
        """Forget the pulls in flight (their replies no longer count), and take a new budget if given."""
        self.requests.clear()
        if budget is not None:
            self.budget = budget

    def next_requests(
        self, pin_id: str | None, buffered: tuple[int, int], max_payload: int, in_range: int
    ) -> list[bytes]:
        """The pull requests to send now, already counted as in flight; ``in_range``: about how many messages the
        range still holds (the budget counts the member's messages up to the stream's end, and what a pull brings
        past the range is dropped and sent again with the next batch)."""
        settings, requests = self.settings, self.requests
        wanting = min(self.budget, in_range)
        rows, nbytes = buffered
        limit = 1 if pin_id is None else settings.in_flight
        serving = sum(1 for owed in requests if owed)  # a filled pull is done at the server, its status may lag
        out = []
        while (
            serving < limit
            and rows < 2 * settings.record_batch_size
            and nbytes < 2 * settings.record_batch_bytes
            and (wanted := min(settings.batch, wanting - self.owed())) > 0
        ):
            request: dict[str, Any] = {
                "batch": wanted,
                "expires": int(settings.expires * _NS),
                "idle_heartbeat": int(settings.idle_heartbeat * _NS),
                "group": self.group,
                # With max_bytes every pull ends with a status, and bytes in flight stay bounded; a
                # message larger than that gets one pull sized by the server's max_payload.
                "max_bytes": 2 * max_payload + 65536 if self.oversize else settings.max_bytes,
            }
            self.oversize = False
            if pin_id is not None:
                request["id"] = pin_id
            requests.append(wanted)
            serving += 1
            out.append(json.dumps(request).encode())
        return out

    def owed(self) -> int:
        """Messages the pulls in flight may still bring."""
        return sum(self.requests)

    def delivered(self, count: int) -> None:
        """``count`` messages arrived: they come off the budget and off the oldest pulls still owed any."""
        self.budget -= count
        self.taken += count
        requests = self.requests
        for index, owed in enumerate(requests):  # a full pull stays listed until its status
            if not count:
                break
            if owed > 0:
                used = min(owed, count)
                requests[index] = owed - used
                count -= used

    def ended(self, completed: bool = False, oversize: bool = False) -> None:
        """A pull ended (its status arrived); ``completed``: it got all it asked for, ``oversize``: the next message
        needs a pull of its own. The oldest listed pull goes. A completed pull may be a later one (the server need not
        fill a consumer's pulls in the order they came; the pin-less first one often went last): what the oldest
        still owes stays owed, to the next one listed. Otherwise (expired, stopped at ``max_bytes``) it is owed no
        more."""
        if self.requests:
            rest = self.requests.popleft()
            if completed and rest and self.requests:
                self.requests[0] += rest
        self.oversize = oversize
