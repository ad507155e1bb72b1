"""The driver side of a streaming query: group layout, member consumers, ack floors, ownership.

One ``Coordinator`` lives in the long-lived driver-side Python process of a query run. It is
the only code that moves ack floors: ``commit`` (and the catch-up in ``latest``) RESETs every
member consumer to the committed watermark, so between batches each member's ack floor equals
the last offset in Spark's commit log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .config import SourceConfig
from .connection import Connection, connect
from .errors import (
    ApiError,
    ConsumerNotFoundError,
    DataLossError,
    GroupConfigError,
    OptionError,
)
from .groups import GroupLayout
from .jsapi import JetStreamApi
from .offsets import Watermark
from .options import ACK_POLICIES
from .planning import Limits, batch_end
from .pull import MemberRange
from .resolve import check_data_loss, member_infos, resolve_layout, start_after

log = logging.getLogger(__name__)

STREAM_INFO_INTERVAL = 0.1
"""Seconds between stream-info calls while Spark polls an idle stream (it asks every 10 ms)."""

OWNER_METADATA_KEY = "spark-jetstream.owner"
_WORKQUEUE_OVERLAP = (10099, 10100)  # unfiltered or overlapping consumers on a WorkQueue stream


def fault_point(name: str) -> None:
    """Crash-test hook: with ``SPARK_JETSTREAM_FAULT=<name>:<file>`` the driver announces that it
    reached ``<name>`` by creating ``<file>`` and then hangs, so a test can SIGKILL it exactly
    there. Fires once per marker file; without the variable it costs one dict lookup."""
    point, _, marker = os.environ.get("SPARK_JETSTREAM_FAULT", "").partition(":")
    if point == name and marker and not os.path.exists(marker):
        with open(marker, "w"):
            pass
        time.sleep(600)


@dataclass(frozen=True)
class StreamState:
    """What ``latestOffset`` needs from stream info."""

    first_seq: int
    last_seq: int
    messages: int
    bytes: int
    retention: str

    @property
    def average_size(self) -> float:
        return self.bytes / self.messages if self.messages else 1.0


class Coordinator:
    """Driver-side state of one query run over one group."""

    def __init__(self, config: SourceConfig) -> None:
        self.config = config
        self.conn: Connection = connect(config.connection)
        self.api = JetStreamApi(self.conn)
        self.source_stream = config.stream
        self._source_config = self.api.stream_info(config.stream)["config"]  # fails fast on a missing stream
        self._state: StreamState | None = None
        self._state_at = 0.0
        self._acked_through: int | None = None  # watermark every member consumer was last reset to
        self._available_now_cap: int | None = None
        self._last_batch_at = time.monotonic()
        self.owner = f"{socket.gethostname()}:{os.getpid()} since {datetime.now(UTC).isoformat(timespec='seconds')}"
        self._owner_sid: int | None = None
        self._claim_group()
        self.layout = self.resolve_layout()
        self.stream = self.layout.stream  # the work stream of an elastic group
        self.state(fresh=True)
        self._check_ack_policy()

    # -- stream --------------------------------------------------------------------------------

    def state(self, fresh: bool = False) -> StreamState:
        """Stream info, at most every ``STREAM_INFO_INTERVAL`` unless ``fresh``."""
        now = time.monotonic()
        if fresh or self._state is None or now - self._state_at >= STREAM_INFO_INTERVAL:
            info = self.api.stream_info(self.stream)
            state = info["state"]
            self._state = StreamState(
                first_seq=state["first_seq"],
                last_seq=state["last_seq"],
                messages=state["messages"],
                bytes=state["bytes"],
                retention=info["config"].get("retention", "limits"),
            )
            self._stream_config = info["config"]
            self.created = info.get("created", "")
            self._state_at = now
        return self._state

    # -- ownership -----------------------------------------------------------------------------

    @property
    def _owner_subject(self) -> str:
        return f"_SPARK_JETSTREAM.owner.{self.source_stream}.{self.config.group}"

    def _claim_group(self) -> None:
        """Refuse to run while another live query reads this group; then answer for it ourselves.

        Liveness is a core-NATS responder on the owner subject: it vanishes with its process, so a
        crashed query never blocks its own restart.
        """

        async def claim() -> tuple[int | None, str]:
            try:
                reply = await self.conn.client.request(self._owner_subject, b"", timeout=0.5)
            except Exception:  # no responders or no answer: nobody owns the group
                reply = None
            if reply is not None:
                return None, reply.data.decode(errors="replace")

            async def answer(msg: Any) -> None:
                await msg.respond(self.owner.encode())

            sub = await self.conn.client.subscribe(self._owner_subject, cb=answer)
            return sub._id, ""

        sid, other = self.conn.run(claim())
        if sid is None:
            raise GroupConfigError(
                f"Group {self.config.group!r} on stream {self.source_stream!r} is already read by a running query "
                f"({other}): stop that query first; two queries on one group would steal each other's messages."
            )
        self._owner_sid = sid

    def close(self) -> None:
        if self._owner_sid is not None:
            sid, self._owner_sid = self._owner_sid, None
            sub = self.conn.client._subs.get(sid)
            if sub is not None:
                self.conn.run(sub.unsubscribe(), timeout=5)

    # -- group ---------------------------------------------------------------------------------

    def resolve_layout(self) -> GroupLayout:
        """The group's layout (``resolve.resolve_layout``); an elastic group's work stream is made when missing."""
        return resolve_layout(
            self.api, self._source_config, self.config.group, self.config.members, create_work_stream=True
        )

    def _check_ack_policy(self) -> None:
        """``ackPolicy=none`` makes delivery count as the ack: only a Limits stream then keeps the
        messages of an uncommitted batch for its replay (on a WorkQueue stream the server refuses
        such consumers; on an Interest stream it would drop the messages at delivery)."""
        retention = self.state().retention
        if self.config.ack_policy == "none" and retention != "limits":
            where = f"stream {self.stream!r}"
            if self.layout.kind == "elastic":
                where = f"the work stream {self.stream!r} of elastic group {self.config.group!r}"
            raise OptionError(
                f"ackPolicy=none needs a stream with Limits retention, but {where} has {retention} retention, "
                "where a message delivered to an ack-none consumer counts as acked before Spark commits it. "
                "Remove the ackPolicy option."
            )

    def ensure_consumers(self) -> None:
        """Make the member consumers match the layout: create, update, and delete those of members
        that left (only consumers this connector made, or any group consumer in the way on a
        WorkQueue stream, where two consumers may not share subjects even for a moment)."""
        layout = self.layout
        metadata = {OWNER_METADATA_KEY: self.owner}
        wanted = {layout.consumer(m): layout.filter_subjects(m) for m in layout.member_names}
        existing = {name: self.api.consumer_info(self.stream, name)["config"] for name in self._group_consumers()}
        self._check_existing_ack_policy({name: config for name, config in existing.items() if name in wanted})
        workqueue = self.state().retention == "workqueue"
        stale = [
            name
            for name, config in existing.items()
            if (name not in wanted and OWNER_METADATA_KEY in (config.get("metadata") or {}))
            or (workqueue and config.get("filter_subjects", [config.get("filter_subject")]) != wanted.get(name))
        ]
        if workqueue:  # free the subjects before another member takes them
            for name in stale:
                self._delete_consumer(name)
        for member in layout.member_names:
            config = layout.consumer_config(member, self.config.ack_wait, metadata, self.config.ack_policy)
            try:
                self.api.create_consumer(self.stream, config)
            except ApiError as exc:
                raise self._consumer_error(layout.consumer(member), exc) from None
        if not workqueue:  # on other streams the new consumers hold the interest before the old go
            for name in stale:
                self._delete_consumer(name)

    def _check_existing_ack_policy(self, existing: dict[str, dict[str, Any]]) -> None:
        """An ack policy cannot be changed on a consumer: say so before the server refuses the update."""
        wanted = self.config.ack_policy
        other = sorted(name for name, config in existing.items() if config.get("ack_policy") != wanted)
        if other:
            policy = existing[other[0]].get("ack_policy")
            remake = (
                f"delete the member consumers {', '.join(other)} and let the query make them again: it resumes from "
                "its checkpoint (a new query starts at startingPosition, default earliest)."
            )
            if policy not in ACK_POLICIES:  # made by hand with a policy the connector never uses (AckAll)
                raise GroupConfigError(
                    f"Member consumer {other[0]!r} on stream {self.stream!r} has ack policy {policy!r}, which "
                    f"spark-jetstream does not read with (ackPolicy is one of {', '.join(ACK_POLICIES)}), and a "
                    f"consumer's ack policy cannot change: {remake}"
                )
            raise GroupConfigError(
                f"Member consumer {other[0]!r} on stream {self.stream!r} has ack policy {policy!r}, but this query "
                f"reads with ackPolicy={wanted}, and a consumer's ack policy cannot change. Set "
                f".option('ackPolicy', '{policy}'), or {remake}"
            )

    def _group_consumers(self) -> list[str]:
        """Consumers on the read stream that belong to this group."""
        names = self.api.consumer_names(self.stream)
        if self.layout.kind == "elastic":
            return names  # the work stream exists for this group alone
        return [name for name in names if name.startswith(f"{self.config.group}-")]

    def _delete_consumer(self, name: str) -> None:
        log.info("Deleting consumer %s of group %s: membership changed", name, self.config.group)
        with contextlib.suppress(ConsumerNotFoundError):
            self.api.delete_consumer(self.stream, name)

    def _consumer_error(self, consumer: str, exc: ApiError) -> GroupConfigError:
        if exc.err_code in _WORKQUEUE_OVERLAP:
            others = [name for name in self.api.consumer_names(self.stream) if name != consumer]
            return GroupConfigError(
                f"Cannot create member consumer {consumer!r}: stream {self.stream!r} is a WorkQueue stream and "
                f"another consumer ({', '.join(others) or 'unknown'}) already takes overlapping subjects. Delete "
                "that consumer, or read the stream through an elastic group."
            )
        return GroupConfigError(
            f"Cannot create or update member consumer {consumer!r} on stream {self.stream!r}: {exc}. If it was "
            "created by other tooling with an incompatible config, delete it or use another group name."
        )

    def _consumer_infos(self) -> dict[str, dict[str, Any] | None]:
        return member_infos(self.api, self.layout)

    # -- ack floors ----------------------------------------------------------------------------

    def _reset_all(self, seq: int) -> None:
        """Move every member consumer's ack floor to ``seq``.

        On a WorkQueue stream a RESET does not remove the messages it skips (measured on 2.15.1;
        Interest streams do drop them), so the group's subjects below ``seq + 1`` are purged too.
        """
        layout = self.layout
        workqueue = self.state().retention == "workqueue"

        async def reset() -> None:
            for index, member in enumerate(layout.member_names):
                await self.api.reset(self.stream, layout.consumer(member), seq + 1)
                if index == 0 and seq > 0:
                    fault_point("commit")  # a crash with only some floors moved
            if workqueue:
                subjects = [s for m in layout.member_names for s in layout.filter_subjects(m)] or [""]
                await asyncio.gather(*(self.api.purge_below(self.stream, seq + 1, s) for s in subjects))

        self.conn.run(reset())
        self._acked_through = seq

    def on_committed(self, committed: Watermark) -> None:
        """Spark committed everything up to ``committed``: make every ack floor equal it.

        The first time in a run this reconciles: a consumer behind is moved forward; one ahead
        (acked data Spark never committed) is an error unless the stream keeps acked messages.
        """
        if self._acked_through is None:
            self._reconcile(committed.seq)
        elif committed.seq > self._acked_through:
            self._reset_all(committed.seq)

    def _removed_after(self, committed: int, floor: int) -> bool:
        """Whether a message with ``committed < seq <= floor`` left the stream."""
        state = self.api.stream_info(self.stream, deleted_details=True)["state"]
        return state["first_seq"] > committed + 1 or any(committed < s <= floor for s in state.get("deleted") or ())

    def _reconcile(self, committed: int) -> None:
        self.ensure_consumers()
        retention = self.state().retention
        for member, info in self._consumer_infos().items():
            floor = info["ack_floor"]["stream_seq"] if info else 0
            # A floor also runs ahead over seqs its filter does not match (other members' messages):
            # that is harmless while every message above the checkpoint is still there.
            ahead = floor > committed and retention != "limits"
            if ahead and self._removed_after(committed, floor):
                raise DataLossError(
                    f"Member consumer {self.layout.consumer(member)!r} has acked up to seq {floor}, past the "
                    f"checkpoint's seq {committed}, and stream {self.stream!r} ({retention} retention) has "
                    f"removed acked messages: seqs {committed + 1}..{floor} cannot be replayed. Was the group read "
                    "by another client, or the checkpoint replaced? Start with a new checkpoint to continue from "
                    "the group's position."
                )
            if floor != committed:
                log.info(
                    "Moving %s's ack floor from %d to the checkpoint %d",
                    self.layout.consumer(member),
                    floor,
                    committed,
                )
        self._reset_all(committed)

    # -- planning ------------------------------------------------------------------------------

    def watermark(self, seq: int) -> Watermark:
        return Watermark(self.stream, seq, self.created)

    def initial(self) -> Watermark:
        """Where a new query starts (no checkpoint yet)."""
        fault_point("initial")  # a new query, nothing in its checkpoint yet
        state = self.state(fresh=True)
        config = self.config
        return self.watermark(
            start_after(
                self.api,
                self.layout,
                self.stream,
                config.starting_position,
                config.starting_timestamp,
                state.first_seq,
                state.last_seq,
            )
        )

    def prepare_available_now(self) -> None:
        self._available_now_cap = self.state(fresh=True).last_seq

    def latest(self, start: Watermark, limits: Limits) -> Watermark:
        """The end of the next batch after ``start`` (``start`` itself: no batch now)."""
        if start.seq > 0:
            fault_point("latest")  # the sink committed the last batch; the source has not acked it yet
        self.on_committed(start)
        state = self.state()
        self._check_data_loss(start, state)
        now = time.monotonic()
        limits = Limits(
            limits.max_rows,
            limits.max_bytes,
            limits.min_rows,
            min_rows_waited_out=now - self._last_batch_at >= self.config.max_trigger_delay,
        )
        end = batch_end(start.seq, state.last_seq, limits, state.average_size, self._available_now_cap)
        if end > start.seq:
            self._last_batch_at = now
        return self.watermark(end)

    def _check_data_loss(self, start: Watermark, state: StreamState) -> None:
        check_data_loss(self.stream, start.seq, state.first_seq, state.last_seq, self.config.fail_on_data_loss)

    def plan(self, start: Watermark, end: Watermark) -> list[MemberRange]:
        """One range per member with messages in ``(start, end]``; membership changes apply here.

        ``start`` is committed (Spark plans batch N after committing N-1), except in the empty
        range ``partitions(latest, latest)`` that Spark sends on a restart, whose end may belong to
        a batch that never finished: that call moves nothing.
        """
        if end.seq <= start.seq:
            return []
        layout = self.resolve_layout()
        if layout.stream != self.stream:
            raise GroupConfigError(
                f"Group {self.config.group!r} now reads stream {layout.stream!r} ({layout.kind}) instead of "
                f"{self.stream!r}: the checkpoint's offsets belong to the old stream. Start with a new checkpoint."
            )
        changed, self.layout = layout != self.layout, layout
        if changed and self._acked_through is not None:
            self.ensure_consumers()
            self._reset_all(start.seq)
        else:
            self.on_committed(start)
        self._check_data_loss(start, self.state(fresh=True))
        fault_point("plan")  # the batch is in the offset log; no task has read it
        members = [
            m for m, busy in zip(self.layout.member_names, self._members_with_data(start, end), strict=True) if busy
        ]
        return [
            MemberRange(
                stream=self.stream,
                consumer=self.layout.consumer(member),
                start=start.seq,
                end=end.seq,
                partitioned=self.layout.partitioned,
                include_headers=self.config.include_headers,
            )
            for member in members
        ]

    def _members_with_data(self, start: Watermark, end: Watermark) -> list[bool]:
        """Whether each member has a message in ``(start, end]``: one Direct Get per filter subject."""

        async def first_seq(subject: str) -> int | None:
            found = await self.api.direct_get_async(self.stream, {"seq": start.seq + 1, "next_by_subj": subject})
            return found.seq if found else None

        async def probe() -> list[bool]:
            results = []
            for member in self.layout.member_names:
                subjects = self.layout.filter_subjects(member) or [">"]
                firsts = await asyncio.gather(*(first_seq(s) for s in subjects))
                results.append(any(seq is not None and seq <= end.seq for seq in firsts))
            return results

        if not self._stream_config.get("allow_direct"):
            return [True] * len(self.layout.member_names)
        return self.conn.run(probe())

    def commit(self, end: Watermark) -> None:
        """Spark committed the batch ending at ``end``: the ack on commit."""
        self.on_committed(end)
