"""Whether the stream still holds the history a checkpoint knows: a stream that went back is never read past silently.

JetStream acknowledges a write before it syncs it to disk (``sync_interval``, 2 min by default): a power loss of a
server, or of a majority of a replicated stream's servers, loses acknowledged messages, and an operator may restore an
older backup or disk snapshot. The stream keeps its name and creation time, its last seq falls back, and new messages
reuse seqs a checkpoint covers. Every end offset records the stream's last seq and that message's time when its batch
was planned (``BatchEnd.last``, ``last_ts``). No message at or below that seq can be stored after that time, so the
first message stored after it, asked of the stream leader (``STREAM.MSG.GET`` with ``start_time``: a replica may still
hold what its leader lost), tells where the stream's history parted from the checkpoint's, whether or not new messages
have passed the checkpoint since, and whatever retention removed.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_jetstream.client import messages
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.messages import time_ns
from spark_jetstream.read.start import seq_at


@dataclass(frozen=True)
class WentBack:
    """The stream no longer holds what an offset saw: its messages from seq ``first`` on are not those (stored after
    the offset's batch was planned), where the offset covers seqs up to ``covered`` and the stream's last was ``seen``
    (its last now ``last``)."""

    stream: str
    first: int
    covered: int
    seen: int
    last: int

    @property
    def resume_after(self) -> int:
        """Where reading goes on: before the first reused seq the offset covers (the new messages once each)."""
        return min(self.first - 1, self.covered)

    def sentence(self) -> str:
        lost = f"its messages {self.first}..{self.seen} as the checkpoint's batch saw them are gone"
        if self.covered < self.seen:
            lost += f" ({max(self.first, self.covered + 1)}..{self.seen} never read)"
        reused = (
            f", and new messages reuse seqs {self.first}..{self.covered} that the checkpoint covers"
            if self.first <= self.covered
            else ""
        )
        return (
            f"Stream {self.stream!r} went back to an earlier state: when the checkpoint's last batch was planned its "
            f"last message was seq {self.seen}; now its messages from seq {self.first} on were stored after that (its "
            f"last seq is {self.last}). The server lost acknowledged messages: a store restored from an earlier copy, "
            "or writes not yet synced to disk when the server, or a majority of the stream's servers, lost power "
            f"(nats-server syncs every sync_interval, 2 min by default). So {lost}{reused}."
        )


def went_back(
    api: JetStreamApi, stream: str, covered: int, seen: int | None, seen_ts: str | None, last_seq: int, last_ts: str
) -> WentBack | None:
    """Whether ``stream``, whose last message is now seq ``last_seq`` stored at ``last_ts`` (stream info), went back
    from the history an offset saw: the offset covers seqs up to ``covered``, and when its batch was planned the
    stream's last message was seq ``seen``, stored at ``seen_ts`` (None: an offset that did not record them, whose
    covered seqs alone are checked). The leader is asked only when the stream's last message is no longer the one seen.
    """
    if seen is None or seen_ts is None:
        return WentBack(stream, last_seq + 1, covered, covered, last_seq) if last_seq < covered else None
    if seen == 0 or (last_seq == seen and last_ts == seen_ts):
        return None  # nothing then, or nothing since
    first_new = min(seq_at(api, stream, time_ns(seen_ts) + 1, last_seq), last_seq + 1)
    if first_new > seen or (first_new <= last_seq and _still_there(api, stream, seen, seen_ts)):
        return None  # the message seen is still there: an earlier one stamped later by a leader whose clock ran ahead
    return WentBack(stream, first_new, covered, seen, last_seq)


def _still_there(api: JetStreamApi, stream: str, seq: int, stamp: str) -> bool:
    """Whether the leader holds message ``seq`` stored at ``stamp`` (asked only when the stream seems to have gone
    back: a missing message is an API error the server counts)."""
    message = api.conn.run(messages.stored_message_async(api, stream, {"seq": seq}))
    return message is not None and time_ns(message["time"]) == time_ns(stamp)
