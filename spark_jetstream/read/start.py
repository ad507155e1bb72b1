"""Where a read starts and what was lost before it, answered once for streaming and batch reads: a
``startingPosition`` or ``startingTimestamp`` means the same seq, and removed messages are detected by one rule.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

from spark_jetstream.client import messages
from spark_jetstream.client.connection import Connection
from spark_jetstream.client.features import MESSAGE_BY_TIME
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import DataLossError, GroupConfigError
from spark_jetstream.groups.layout import GroupLayout
from spark_jetstream.read.ranges import MemberRange, SeqRange, SmallBatch

log = logging.getLogger(__name__)


def seq_at(api: JetStreamApi, stream: str, when: datetime | int, last_seq: int) -> int:
    """The seq of the first message stored at or after ``when`` (a time, or ns since the epoch; ``last_seq + 1`` if
    none), asked of the stream leader: every read mode answers a timestamp alike, with or without Direct Get.
    nats-server 2.10 ignores ``start_time`` in ``STREAM.MSG.GET`` (it answers the first message): there the leader's
    messages are searched by seq, their times growing with it (``_seq_at_by_search``), and so they are where an answer
    is stored before ``when`` (a 2.10 leader behind a newer server during a rolling upgrade)."""
    wanted = when if isinstance(when, int) else (when - _EPOCH) // timedelta(microseconds=1) * 1000
    if not api.conn.supports(MESSAGE_BY_TIME):
        return api.conn.run(_seq_at_by_search(api, stream, wanted, last_seq))
    request = {"start_time": messages.time_text(wanted), "next_by_subj": ">"}
    found = api.conn.run(messages.stored_message_async(api, stream, request))
    if found is not None and messages.time_ns(found["time"]) < wanted:  # the leader ignored start_time
        return api.conn.run(_seq_at_by_search(api, stream, wanted, last_seq))
    return int(found["seq"]) if found is not None else last_seq + 1


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


async def _seq_at_by_search(api: JetStreamApi, stream: str, wanted: int, last_seq: int) -> int:
    """``seq_at`` by bisection over seqs on the stream leader: about log2(last_seq) ``STREAM.MSG.GET`` requests, each
    for the first message at or after a seq (interior deletes skipped)."""

    async def first_from(seq: int) -> dict[str, Any] | None:
        return await messages.stored_message_async(api, stream, {"seq": seq, "next_by_subj": ">"})

    low, high = 1, last_seq + 1  # the smallest seq from which the next message is stored at or after ``wanted``
    while low < high:
        middle = (low + high) // 2
        message = await first_from(middle)
        if message is None or messages.time_ns(message["time"]) >= wanted:
            high = middle
        else:
            low = middle + 1
    message = await first_from(low) if low <= last_seq else None
    return int(message["seq"]) if message is not None else last_seq + 1


async def member_infos_async(api: JetStreamApi, layout: GroupLayout) -> dict[str, dict[str, Any] | None]:
    """Consumer info of every member consumer (None where it does not exist), asked all at once."""
    infos = await api.consumer_infos_async(layout.stream, [layout.consumer(m) for m in layout.member_names])
    return dict(zip(layout.member_names, infos.values(), strict=True))


def member_infos(api: JetStreamApi, layout: GroupLayout) -> dict[str, dict[str, Any] | None]:
    """``member_infos_async`` from sync code."""
    return api.conn.run(member_infos_async(api, layout))


def start_after(
    api: JetStreamApi,
    layout: GroupLayout | None,
    stream: str,
    position: str | int | None,
    timestamp: datetime | None,
    first_seq: int,
    last_seq: int,
    made: Collection[str] = (),
) -> int:
    """The seq after which a new read starts (``startingPosition`` or ``startingTimestamp``).

    Without either: ``group`` when every member consumer exists (only with a ``layout``), else
    ``earliest``. ``group`` is the lowest ack floor of the member consumers, which must all exist;
    those in ``made`` (created by this run of the query) count as missing.
    """
    if timestamp is not None:
        return seq_at(api, stream, timestamp, last_seq) - 1
    infos = member_infos(api, layout) if layout is not None and position in (None, "group") else {}
    infos = {member: None if layout and layout.consumer(member) in made else info for member, info in infos.items()}
    if position is None:
        position = "group" if infos and all(infos.values()) else "earliest"
    if position == "earliest":
        return max(first_seq, 1) - 1  # a stream that never held a message reports first_seq 0
    if position == "latest":
        return last_seq
    if position == "group":
        assert layout is not None, "startingPosition=group needs a group"
        missing = [layout.consumer(m) for m, info in infos.items() if info is None]
        if missing:
            raise GroupConfigError(
                f"startingPosition=group, but group {layout.group!r} has no member consumer "
                f"{', '.join(missing)} on stream {stream!r}: create the group or start from earliest, latest or "
                "a sequence."
            )
        return min(info["ack_floor"]["stream_seq"] for info in infos.values() if info is not None)
    return int(position) - 1


# -- data loss -------------------------------------------------------------------------------------


def check_data_loss(stream: str, start: int, first_seq: int, last_seq: int, fail: bool) -> int:
    """The seq a read that was at ``start`` goes on after: ``start``, or the last of the messages after it that left
    the stream before they were read (``first_seq > start + 1`` while the stream has messages after ``start``), which
    raise with ``failOnDataLoss`` and are otherwise skipped in one step, whatever the read's limits, as Kafka's source
    skips to the earliest offset (the caller says so once: ``warn_skipped``)."""
    if first_seq <= start + 1 or last_seq <= start:
        return start
    if fail:
        raise DataLossError(
            f"Messages seqs {start + 1}..{first_seq - 1} of stream {stream!r} were removed (retention limits or a "
            "purge) before they were read: set failOnDataLoss=false to skip them, start later, or raise the stream's "
            "limits."
        )
    return first_seq - 1


REMOVED_CHECK_WAIT = 0.5
"""Seconds a task waits for its stream's first seq before it reads without the check: stream info needs the stream's
leader, whose election takes seconds, while the replicas serve the read meanwhile (decision 0020)."""


def check_removed(conn: Connection, task: SeqRange | SmallBatch | MemberRange, fail: bool) -> None:
    """Data loss seen where it happens: messages of ``task``'s ranges that retention or a purge removed after the batch
    was planned (the plan checked the stream then) and before this task reads them, found by ``check_data_loss``'s
    rule from the stream's first seq now. Raises with ``failOnDataLoss`` (``fail``), else says in the task's log what
    it skips. A bucket's ranges are left out: its removed revisions are compaction (decision 0023)."""
    ranges = task.ranges if isinstance(task, SmallBatch) else (task,)
    if not ranges or any(isinstance(r, SeqRange) and r.kv is not None for r in ranges):
        return
    stream = ranges[0].stream
    try:
        info = conn.run(JetStreamApi(conn).stream_info_async(stream), timeout=REMOVED_CHECK_WAIT)
    except TimeoutError:
        log.info("Stream %r did not answer within %gs: this task reads without its check", stream, REMOVED_CHECK_WAIT)
        return
    first, last = info["state"]["first_seq"], info["state"]["last_seq"]
    removed = [(r.start + 1, min(first - 1, r.end)) for r in ranges if first - 1 > r.start and last > r.start]
    if not removed:
        return
    what = (
        f"Messages seqs {min(low for low, _ in removed)}..{max(high for _, high in removed)} of stream {stream!r} were "
        "removed (retention limits or a purge) after their micro-batch was planned, before its task read them"
    )
    if fail:
        raise DataLossError(f"{what}: set failOnDataLoss=false to skip them, or raise the stream's limits.")
    log.warning("%s: skipping them (failOnDataLoss=false)", what)


def warn_skipped(stream: str, start: int, after: int) -> None:
    """Say that messages ``start + 1 .. after`` were skipped (``check_data_loss``)."""
    log.warning(
        "Skipping messages seqs %d..%d of stream %s: removed (retention limits or a purge) before they were read "
        "(failOnDataLoss=false)",
        start + 1,
        after,
        stream,
    )
