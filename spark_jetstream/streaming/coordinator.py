"""The driver side of a streaming query: planning batches and committing them.

One ``Coordinator`` lives in the long-lived driver-side Python process of a query run. It plans (limits -> the
batch's end; the read's scope -> input partitions read with Direct Get or through consumers, as ``readMode`` chose
when the run started). With option ``group`` it holds the group (``held_group.HeldGroup``: member consumers whose
ack floors equal the last offset in Spark's commit log between batches, pins, the claim); without, the position
lives in Spark's checkpoint alone and the query creates and changes nothing on the server: each task reads its
range with Direct Get, or through an ephemeral consumer of its own that it deletes when done.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from spark_jetstream.client.connection import Connection, connect
from spark_jetstream.client.features import GROUPS
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import DataLossError, OptionError
from spark_jetstream.groups.layout import reads_whole_stream
from spark_jetstream.read.consumer import check_consumer_reads
from spark_jetstream.read.direct import first_seqs, split, spread
from spark_jetstream.read.kv import KvView, table_view
from spark_jetstream.read.kv_latest import LAST_PER_KEY
from spark_jetstream.read.mode import DIRECT, PULL, choose_read_mode
from spark_jetstream.read.ranges import MemberRange, SeqRange, SmallBatch
from spark_jetstream.read.scope import ReadScope, group_scope, stream_scope
from spark_jetstream.read.start import check_data_loss, start_after, warn_skipped
from spark_jetstream.streaming.config import SourceConfig
from spark_jetstream.streaming.cuts import Cut
from spark_jetstream.streaming.faults import fault_point
from spark_jetstream.streaming.held_group import HeldGroup
from spark_jetstream.streaming.history import WentBack, went_back
from spark_jetstream.streaming.offsets import BatchEnd, Watermark
from spark_jetstream.streaming.planning import Limits, batch_end
from spark_jetstream.streaming.waker import IDLE_AFTER, Waker

log = logging.getLogger(__name__)

STREAM_INFO_INTERVAL = 0.1
"""Seconds between stream-info calls while Spark polls a stream that changes (it asks every 10 ms); an idle one is
waited for instead (``streaming.waker``)."""
STREAM_INFO_WAIT = 0.5
"""Seconds a stream-info call may take before planning goes on with the last stream state read: stream info needs
the stream's leader, and a new one takes 4-9 s to elect after its server died, while what is stored up to the last
seq read can still be read from the replicas (Direct Get, or a consumer on any of them)."""
STREAM_INFO_RETRY = 0.75
"""Seconds after a stream-info call went unanswered during which planning asks no more and uses the last state read:
``latestOffset`` asks once a trigger, and the batch it plans goes on without asking again."""
WENT_BACK_CONFIRM = 5.0
"""Seconds a stream that says it went back (``streaming.history``) is asked again before the query believes it: a
leader that was frozen, then thawed, answers stream info with its state from before the freeze until it hears the new
leader (a query through a 20 s freeze was failed so, its checkpoint at seq 8,320, the stale answer 2,592)."""
ONE_TASK_MESSAGES = 4096
"""A micro-batch of at most this many messages (and at most one record batch's bytes, estimated) is read by one task
(one ``>`` range on a stream that is all the read's, else a ``SmallBatch``): at 5,000 msg/s, 4 tasks per batch made
the batch cycle 1.38x a one-task source's and one task 1.00x (decisions 0016, 0017)."""


@dataclass(frozen=True)
class StreamState:
    """What ``latestOffset`` needs from stream info."""

    first_seq: int
    last_seq: int
    messages: int
    bytes: int
    retention: str
    last_ts: str = ""  # the last message's time (RFC 3339), which end offsets record (``streaming.history``)

    @property
    def average_size(self) -> float:
        return self.bytes / self.messages if self.messages else 1.0


class Coordinator:
    """Driver-side state of one query run over one stream (and its group, with option ``group``)."""

    def __init__(self, config: SourceConfig) -> None:
        self.config = config
        self.group: HeldGroup | None = None  # close() works from here on, whatever fails below
        self.conn: Connection = connect(config.connection)
        self.api = JetStreamApi(self.conn)
        source_info = self.api.stream_info(config.stream)  # fails fast on a missing stream
        self._state: StreamState | None = None
        self._state_at = 0.0
        self._unanswered: tuple[float, float] | None = None  # stream info unanswered since, and last given up at
        self._available_now_cap: int | None = None
        self._last_batch_at = float("-inf")  # minMessagesPerTrigger: the run's first trigger has waited
        self._skipped_to = 0  # the last seq of the removed messages the log said were skipped
        self._recreated: set[str] = set()  # creation times of streams deleted since, that the log said were left
        self._initial: int | None = None  # where this new query starts, once worked out (``_begin``)
        self._changed_at = time.monotonic()  # when the stream's last seq last moved (``_interval``)
        self._waker = Waker(self.conn, list(source_info["config"].get("subjects") or ()))
        self._history: tuple[tuple[Any, ...], WentBack | None] | None = None  # the last check of an offset's history
        self._went_back: set[int] = set()  # offsets whose stream went back, that the log said were read on from
        self.scope: ReadScope | None = None  # a read without a group: fixed for the run
        if config.group is not None:
            self.conn.require(GROUPS, ", or read without the group option (the checkpoint alone holds the position)")
            self.group = HeldGroup(self.api, config, source_info["config"])
            self.stream = self.group.stream  # the work stream of an elastic group
        else:
            self.scope = stream_scope(source_info["config"], config.subjects)
            self.stream = config.stream
        # the info just read, unless the group is elastic: its members read its work stream
        self._take_state(source_info if self.stream == config.stream else self.api.stream_info(self.stream))
        what = f"query on group {config.group!r}" if config.group else "query"
        self.direct = choose_read_mode(self.api, self.stream, self._stream_config, config.read_mode, what) == DIRECT
        # A group read through consumers without minPartitions pulls from its member consumers, a task each (4.2),
        # unless it need not keep a partition's messages together; every other read has its tasks read ranges, with
        # Direct Get or through consumers of their own.
        in_partitions = config.min_partitions is None and config.preserve_order
        self.pulls_members = self.group is not None and not self.direct and in_partitions
        scope = group_scope(self.group.layout) if self.group is not None else self.scope
        assert scope is not None
        self._check_unordered(scope.filters)
        if not self.direct and not self.pulls_members:
            check_consumer_reads(self.stream, self._stream_config, grouped=self.group is not None)
        if self.group is not None:
            self.group.hold(self.pulls_members, self.state().retention)  # last: a refused query holds nothing

    def close(self) -> None:
        """Give up the group, if any, and the idle subscription (safe on a half-built coordinator, and twice)."""
        if getattr(self, "_waker", None) is not None:
            self._waker.disarm()
        if self.group is not None:
            self.group.close()

    # -- stream --------------------------------------------------------------------------------

    def state(self, fresh: bool = False) -> StreamState:
        """Stream info, at most every ``STREAM_INFO_INTERVAL`` unless ``fresh`` (``idleInterval`` while the stream is
        idle and no message woke the query: ``_interval``).

        Once the query has a state, a call unanswered within ``STREAM_INFO_WAIT`` (the stream's leader is being
        elected) gives the last state read, and so does every call for ``STREAM_INFO_RETRY`` after it: batches go on
        up to its last seq, which the replicas hold. An outage longer than the API deadline is waited out with the
        retry layer, which then says what was happening, as before."""
        now = time.monotonic()
        if self._state is not None and not fresh and now - self._state_at < self._interval(now):
            return self._state
        since, asked = self._unanswered or (now, 0.0)
        if self._state is None or now - since >= self.conn.options.request_timeout:
            self._take_state(self.api.stream_info(self.stream))
        elif now - asked < STREAM_INFO_RETRY:
            return self._state
        else:
            try:
                self._take_state(self.conn.run(self.api.stream_info_async(self.stream), timeout=STREAM_INFO_WAIT))
            except TimeoutError:
                if self._unanswered is None:
                    log.info(
                        "Stream %r does not answer (its leader is being elected?): reading on up to seq %d, the last "
                        "one it reported",
                        self.stream,
                        self._state.last_seq,
                    )
                self._unanswered = (since, time.monotonic())
                return self._state
        self._unanswered = None
        assert self._state is not None
        return self._state

    def _interval(self, now: float) -> float:
        """How long stream info read ``now - _state_at`` ago stays good: ``STREAM_INFO_INTERVAL`` while the stream
        changes; once it is idle, ``idleInterval`` with the waker's subscription armed, and none once a message woke
        it (the stream is then asked often again for ``IDLE_AFTER`` s)."""
        waker = self._waker
        if now - self._changed_at < IDLE_AFTER or waker.refused:
            return STREAM_INFO_INTERVAL
        if waker.woken:
            waker.disarm()
            waker.woken = False
            self._changed_at = now
            return 0.0
        waker.arm()
        waker.check()
        return STREAM_INFO_INTERVAL if waker.refused else self.config.idle_interval

    def _take_state(self, info: dict[str, Any]) -> None:
        """Keep the stream info ``info`` of the read stream, read just now."""
        state = info["state"]
        if self._state is not None and state["last_seq"] != self._state.last_seq:
            self._changed_at = time.monotonic()
            self._waker.disarm()
        self._state = StreamState(
            first_seq=state["first_seq"],
            last_seq=state["last_seq"],
            messages=state["messages"],
            bytes=state["bytes"],
            retention=info["config"].get("retention", "limits"),
            last_ts=state.get("last_ts", ""),
        )
        self._stream_config = info["config"]
        self.created = info.get("created", "")
        self._state_at = time.monotonic()

    def _acknowledge(self, committed: int, settle: bool = False) -> None:
        """The ack on commit: a group's floors move to ``committed`` (``settle``: wait until every floor moved);
        without a group there is nothing to move. The callers check first that the stream did not go back
        (``_resume``): on a WorkQueue stream a floor move removes what it passes."""
        if self.group is not None:
            self.group.acknowledge(committed, self.state().retention, settle=settle)

    def _floors_move(self, seq: int) -> bool:
        """Whether acknowledging ``seq`` moves a member consumer's floor (the run's first, or a later commit)."""
        return self.group is not None and self.group.members.acked_through != seq

    # -- planning ------------------------------------------------------------------------------

    def watermark(self, seq: int) -> Watermark:
        return Watermark(self.stream, seq, self.created)

    def position(self, offset: dict[str, Any]) -> Watermark:
        """An offset Spark holds, as a watermark of the stream as it is now. One written before the stream was deleted
        and created again names other messages: refused, or with ``failOnDataLoss=false`` the new stream is read from
        its first message (as Kafka's source reads a topic created again), said once."""
        mark = Watermark.from_offset(offset, self.stream)
        if not (mark.created and self.created) or mark.created == self.created:
            return self.watermark(mark.seq)
        recreated = (
            f"Stream {self.stream!r} was deleted and created again since the checkpoint was written (the checkpoint "
            f"knows the stream created at {mark.created}, the server has one created at {self.created}): its sequence "
            "numbers mean other messages now."
        )
        if self.config.fail_on_data_loss:
            raise DataLossError(
                f"{recreated} Use a new checkpoint location, or set failOnDataLoss=false to read the new stream from "
                "its first message."
            )
        if mark.created not in self._recreated:
            log.warning("%s Reading the new stream from its first message (failOnDataLoss=false).", recreated)
            self._recreated.add(mark.created)
        return self.watermark(0)

    def initial(self) -> Watermark:
        """Where a new query starts (no checkpoint yet), by ``startingPosition`` or ``startingTimestamp``."""
        fault_point("initial")  # a new query, nothing in its checkpoint yet
        if self.snapshot:
            return self.watermark(0)  # the first batch, (0, last], is the bucket's latest values
        state = self.state()  # read at most STREAM_INFO_INTERVAL ago: made with the coordinator, just now
        config = self.config
        return self.watermark(
            start_after(
                self.api,
                self.group.layout if self.group is not None else None,
                self.stream,
                config.starting_position,
                config.starting_timestamp,
                state.first_seq,
                state.last_seq,
                self.group.members.made if self.group is not None else (),
            )
        )

    def _begin(self, start: Watermark, end: BatchEnd | None = None) -> int:
        """The seq after which the batch from ``start`` begins: where its end says it began (batch 0, or after the
        stream went back), else ``start``'s, or for a new query's ``INITIAL`` offset where the query starts (worked out
        once per run: ``latestOffset`` may be asked twice for one batch)."""
        if end is not None and end.start is not None:
            return end.start
        if not start.initial:
            return start.seq
        if self._initial is None:
            self._initial = self.initial().seq
        return self._initial

    def prepare_available_now(self) -> None:
        self._available_now_cap = self.state(fresh=True).last_seq

    def latest(self, start: BatchEnd | Watermark, limits: Limits) -> BatchEnd | None:
        """The end of the next batch after ``start`` (None: no batch now), with the batch's cut and, for
        batch 0 (``start`` is ``INITIAL``) or after the stream went back, where it begins: a replay needs both and can
        derive neither."""
        start = start if isinstance(start, BatchEnd) else BatchEnd(start)
        mark = start.mark
        begin = self._begin(mark)
        if begin > 0 and not mark.initial:
            fault_point("latest")  # the sink committed the last batch; the source has not acked it yet
        state = self.state()
        if not mark.initial:  # the stream still holds what ``start`` saw (asked of the leader before floors move)
            begin = self._resume(start, state, ask=self._floors_move(begin))
        # `start` is in the commit log: the catch-up on an idle stream. At the end of an availableNow run (Spark asks
        # once more after its last batch, then stops the process) every floor is waited for: none lags behind.
        capped = self._available_now_cap is not None
        self._acknowledge(begin, settle=capped and begin >= (self._available_now_cap or 0))
        end = self._end(begin, state, limits, capped)
        if end > begin and not mark.initial and (resumed := self._resume(start, state)) != begin:
            begin = resumed  # the stream went back since ``start`` was planned (failOnDataLoss=false)
            end = self._end(begin, state, limits, capped)
        if end <= (mark.seq if mark.initial else begin):
            return None
        self._last_batch_at = time.monotonic()
        cut = (
            self._cut(begin, end, self._after_data_loss(self.watermark(begin), state)).to_json(begin, end)
            if end > begin
            else None
        )
        moved = begin if mark.initial or begin != mark.seq else None
        return BatchEnd(self.watermark(end), cut, moved, state.last_seq, state.last_ts or None)

    def _end(self, begin: int, state: StreamState, limits: Limits, capped: bool) -> int:
        """The end of a batch after ``begin``, as the limits and ``minMessagesPerTrigger``'s wait allow."""
        after = self._after_data_loss(self.watermark(begin), state)
        # minMessagesPerTrigger waits at most maxTriggerDelay from the last batch or the run's first trigger (as Kafka's
        # source: so the one batch of an availableNow run on PySpark < 4.2 reads what is there); an availableNow run
        # reads everything there was, the tail below the minimum too (PySpark leaves that to the source).
        now = time.monotonic()
        waited = capped or now - self._last_batch_at >= self.config.max_trigger_delay
        if waited:
            self._last_batch_at = now
        limits = Limits(limits.max_rows, limits.max_bytes, limits.min_rows, min_rows_waited_out=waited)
        end = batch_end(after, state.last_seq, limits, state.average_size, self._available_now_cap)
        if self.snapshot and begin == 0:
            end = state.last_seq  # the latest values are one batch, whatever the limits: a batch is a point in time
        return end

    def _resume(self, offset: BatchEnd, state: StreamState, ask: bool = True) -> int:
        """Where reading goes on after ``offset``: its seq, unless the stream went back from the history the offset saw
        (``streaming.history``), which fails the query, or with ``failOnDataLoss=false`` reads on before the first
        seq reused, said once. The stream's word is believed once it still says so after ``WENT_BACK_CONFIRM`` s of
        asking again: a leader frozen and thawed answers with its old state until it hears the new one."""
        went = self._went(offset, state, ask)
        deadline = time.monotonic() + WENT_BACK_CONFIRM
        while went is not None and time.monotonic() < deadline:
            time.sleep(0.5)
            went = self._went(offset, self.state(fresh=True), True)
        if went is None:
            return offset.seq
        if self.config.fail_on_data_loss:
            raise DataLossError(
                f"{went.sentence()} Set failOnDataLoss=false to read on from seq {went.resume_after + 1} (the new "
                "messages once each), or use a new checkpoint location."
            )
        if offset.seq not in self._went_back:
            self._went_back.add(offset.seq)
            log.warning("%s Reading on from seq %d (failOnDataLoss=false).", went.sentence(), went.resume_after + 1)
        return went.resume_after

    def _went(self, offset: BatchEnd, state: StreamState, ask: bool) -> WentBack | None:
        """``went_back`` for ``offset`` and ``state``, the last answer kept; ``ask=False``: only what stream info tells
        (its last seq below the offset's)."""
        key = (offset.seq, offset.last, offset.last_ts, state.last_seq, state.last_ts)
        if self._history is not None and self._history[0] == key:
            return self._history[1]
        if not ask and state.last_seq >= max(offset.seq, offset.last or 0):
            return None
        went = went_back(self.api, self.stream, offset.seq, offset.last, offset.last_ts, state.last_seq, state.last_ts)
        self._history = (key, went)
        return went

    @property
    def snapshot(self) -> bool:
        """``startingPosition=snapshot`` of a bucket: the batch from seq 0 is its latest values (``read.kv``)."""
        return self.config.starting_position == "snapshot"

    def _after_data_loss(self, start: Watermark, state: StreamState) -> int:
        """Where the batch after ``start`` begins: past the messages removed before they were read, which fail the
        query unless ``failOnDataLoss=false`` (``check_data_loss``); each skip is logged once per run."""
        if self.config.bucket:
            return start.seq  # a bucket's revisions that its history or a purge removed are compaction (decision 0023)
        after = check_data_loss(self.stream, start.seq, state.first_seq, state.last_seq, self.config.fail_on_data_loss)
        if after > max(start.seq, self._skipped_to):
            warn_skipped(self.stream, start.seq, after)
            self._skipped_to = after
        return after

    def _cut(self, begin: int, end: int, after: int | None = None) -> Cut:
        """How the batch ``(begin, end]`` is cut into Spark partitions (``streaming.cuts``): a range per filter of the
        read's scope with messages in it (a small batch one task, ``minPartitions`` slices, a batch cut by seq of a
        stream that is all the read's ``>``), or with a group that pulls, one task per member. ``after``: no message is
        left up to it (removed, ``failOnDataLoss=false``)."""
        group = self.group
        members = None
        if group is not None:
            layout = group.next_layout()
            members = layout.members
            if self.pulls_members:
                return Cut(pull=True, members=members)
            filters = list(group_scope(layout).filters)
        else:
            assert self.scope is not None
            filters = list(self.scope.filters)
        self._check_unordered(filters)  # a group's members may have changed
        config, state = self.config, self.state()
        width = end - begin
        small = width <= ONE_TASK_MESSAGES and width * state.average_size <= config.pull.record_batch_bytes
        # No task per partition: order is by seq, and a read of the whole stream is one unfiltered range.
        cut_by_seq = config.min_partitions is not None or small or not config.preserve_order
        read = [">"] if cut_by_seq and reads_whole_stream(self._stream_config, filters) else filters
        # Which filters have messages (no empty task). One filter's range is the task whether or not it has any: the
        # cut of a batch read as one range (small, or of a stream that is all the read's) asks the server nothing.
        low = begin if after is None else after
        firsts = [low + 1] if len(read) == 1 else first_seqs(self.conn, self.stream, read, begin, end, not self.direct)
        template = SeqRange(stream=self.stream, filter="", start=begin, end=end, partitioned=True)
        ranges = split(template, firsts, read, width)
        kv = self._kv_view(begin, end)
        if kv is not None and kv.per_key:  # a snapshot through a last_per_subject consumer per key filter, uncut
            return Cut.of(ranges, members)
        if config.min_partitions is not None:
            return Cut.of(spread(ranges, config.min_partitions), members)
        if small:
            return Cut.of([SmallBatch(tuple(ranges))] if ranges else [], members)
        return Cut.of(ranges if config.preserve_order else spread(ranges, len(filters)), members)

    def plan(self, start: Watermark, end: BatchEnd | Watermark) -> list[SeqRange | SmallBatch] | list[MemberRange]:
        """The batch ``(start, end]``'s reads, cut as its end offset says (an end without a cut, written before
        offsets carried one, is cut as ``latest`` would cut it now).

        ``start`` is committed (Spark plans batch N after committing N-1), except in the empty
        range ``partitions(latest, latest)`` that Spark sends on a restart, whose end may belong to
        a batch that never finished: that call moves nothing.
        """
        if isinstance(end, Watermark):
            end = BatchEnd(end)
        begin = self._begin(start, end)
        if end.seq <= begin:
            return []
        cut = self._cut(begin, end.seq) if end.cut is None else Cut.from_json(end.cut, begin, end.seq)
        self._check_replayable(cut, begin, end.seq)
        group = self.group
        if group is not None:  # the layout the batch was planned with (a group added since: the group's now)
            members = cut.members if cut.members is not None else group.next_layout().members
            group.before_batch(begin, self.state().retention, members)
        state = self.state(fresh=True)
        self._after_data_loss(self.watermark(begin), state)
        fault_point("plan")  # the batch is in the offset log; no task has read it
        if group is not None and cut.pull:
            return group.member_ranges(begin, end.seq)
        config = self.config
        template = SeqRange(
            stream=self.stream,
            filter="",
            start=begin,
            end=end.seq,
            partitioned=self.partitioned,
            include_headers=config.include_headers,
            direct_batch=config.direct_batch,
            direct_max_bytes=config.direct_max_bytes,
            record_batch_size=config.pull.record_batch_size,
            record_batch_bytes=config.pull.record_batch_bytes,
            read_mode=DIRECT if self.direct else PULL,
            pull_batch=config.pull.batch,
            pull_max_bytes=config.pull.max_bytes,
            kv=self._kv_view(begin, end.seq),
        )
        if template.kv is not None and template.kv.per_key:
            template = replace(template, read_mode=LAST_PER_KEY)  # a snapshot through a consumer per key filter
        if group is not None:
            group.settle()
        tasks = [
            tuple(replace(template, filter=f, start=low, end=high) for f, low, high in ranges) for ranges in cut.tasks
        ]
        return [task[0] if len(task) == 1 else SmallBatch(task) for task in tasks]

    @property
    def partitioned(self) -> bool:
        """Whether the read stream's subjects carry a partition token (the rows' ``partition`` column)."""
        if self.group is not None:
            return self.group.layout.partitioned
        assert self.scope is not None
        return self.scope.partitioned

    def _check_replayable(self, cut: Cut, begin: int, end: int) -> None:
        """Refuse a batch whose cut this run cannot carry out, saying why: it was planned to be pulled from the group's
        member consumers and this run reads ranges, or planned with Direct Get and this run could only read its ranges
        through consumers of its own on a WorkQueue stream. Cutting it another way would hand the sink other rows per
        Spark partition (decision 0042)."""
        what = f"The batch ({begin}, {end}] of stream {self.stream!r}, planned before the query stopped,"
        if cut.pull and not self.pulls_members:
            how = "with Direct Get" if self.direct else "by seq ranges through consumers of its own"
            raise OptionError(
                f"{what} was cut into a task per member of its group, pulled from the member consumers, but this run "
                f"reads {how} (the group, readMode, minPartitions or preservePartitionOrder changed, or readMode=auto "
                "now finds Direct Get): its replay must be cut as planned. Restart with the group it had, "
                "readMode=pull, no minPartitions and preservePartitionOrder=true until that batch is committed."
            )
        if not cut.pull and not self.direct and self._stream_config.get("retention") == "workqueue":
            raise OptionError(
                f"{what} was cut to be read with Direct Get, which this run cannot use, and a WorkQueue stream cannot "
                f"be read through consumers of the read's own: allow Direct Get again (`nats stream edit {self.stream} "
                "--allow-direct`, and readMode=auto or direct) until that batch is committed."
            )

    def _check_unordered(self, filters: tuple[str, ...] | list[str]) -> None:
        """``preservePartitionOrder=false`` reads a batch as seq ranges of one filter: refuse a read of several
        filters that do not make up the whole stream (each would still be read filtered, at the same cost)."""
        if self.config.preserve_order or len(filters) == 1 or reads_whole_stream(self._stream_config, filters):
            return
        what = f"group {self.config.group!r}'s members read" if self.config.group else "this read covers"
        raise OptionError(
            f"Option 'preservePartitionOrder' is false, which reads each micro-batch as seq ranges of all of stream "
            f"{self.stream!r} through one unfiltered read, but {what} only part of it ({', '.join(filters)}): "
            "drop the option (or the `subjects` option), or read a stream whose partition transform every subject "
            "goes through."
        )

    def _kv_view(self, begin: int, end: int) -> KvView | None:
        """A bucket's batch: every change, or with ``snapshot`` the batch from seq 0 as the latest values up to its
        end."""
        bucket = self.config.bucket
        if bucket is None:
            return None
        if self.snapshot and begin == 0:
            return table_view(self.conn, bucket, self._stream_config, end)
        return KvView(bucket)

    def commit(self, end: BatchEnd | Watermark) -> None:
        """Spark committed the batch ending at ``end``: the ack on commit, up to where the stream still holds what the
        batch saw."""
        end = end if isinstance(end, BatchEnd) else BatchEnd(end)
        if self._floors_move(end.seq):
            self._acknowledge(self._resume(end, self.state(fresh=True)))
