"""The source's offsets: one stream-wide watermark sequence, and what a batch's end carries for its replay.

``{"seq": W, "stream": name}`` means every message of the group with ``seq <= W`` belongs to a batch planned at or
before this offset. Spark compares offsets as JSON strings and PySpark serializes the dict as given, so the keys are
always emitted in sorted order.

A batch's end offset (``BatchEnd``) also carries what replaying the batch needs and no offset can give (decision
0042): ``cut``, how the batch is cut into Spark partitions (``streaming.cuts``); ``start``, where the batch begins
when not at the offset before it: batch 0's start, which Spark never logs (it asks ``initialOffset`` again on a
restart), or where a stream that went back is read on from; ``last``, the stream's last seq when the batch was planned,
from which a listener tells the lag where Spark reports no latest offset of its own (PySpark 4.0/4.1), and
``last_ts``, that message's time, which tells whether the stream later went back (``streaming.history``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_jetstream.errors import OptionError

INITIAL = -1
"""The seq of a new query's initial offset: where the query starts is worked out at its first ``latestOffset`` and
written into batch 0's end offset (``BatchEnd.start``), so that a restart in batch 0 replays it from there, whatever
``startingPosition`` would say by then."""


@dataclass(frozen=True, order=True)
class Watermark:
    """A position in one stream: every message with ``seq <= self.seq`` is behind it."""

    stream: str
    seq: int
    created: str = ""  # the stream's creation time: a stream deleted and made again is another stream

    @property
    def initial(self) -> bool:
        """The offset of a query that has not started yet (``INITIAL``)."""
        return self.seq == INITIAL

    def to_offset(self) -> dict[str, Any]:
        offset: dict[str, Any] = {"created": self.created} if self.created else {}
        offset.update(seq=self.seq, stream=self.stream)  # sorted keys: Spark compares offsets as JSON text
        return offset

    @classmethod
    def from_offset(cls, offset: dict[str, Any], stream: str) -> Watermark:
        """Parse an offset from the checkpoint; it must belong to ``stream`` (whether to the stream as created now is
        ``Coordinator.position``'s question)."""
        try:
            found, seq = offset["stream"], int(offset["seq"])
        except (KeyError, TypeError, ValueError):
            raise OptionError(
                f"The checkpoint holds an offset this source cannot read ({offset!r}): was it written by "
                "another source? Use a new checkpoint location."
            ) from None
        if found != stream:
            raise OptionError(
                f"The checkpoint was written for stream {found!r} but the stream option is {stream!r}: "
                "use a new checkpoint location for a different stream."
            )
        return cls(stream, seq, offset.get("created", ""))


@dataclass(frozen=True)
class BatchEnd:
    """A batch's end offset: its watermark and what its replay needs (module doc). An offset written before these
    fields existed has none of them: its batch is cut as the stream is now."""

    mark: Watermark
    cut: dict[str, Any] | None = None
    start: int | None = None
    last: int | None = None
    last_ts: str | None = None

    @property
    def seq(self) -> int:
        return self.mark.seq

    def to_offset(self) -> dict[str, Any]:
        offset = self.mark.to_offset()
        extra = {"cut": self.cut, "last": self.last, "last_ts": self.last_ts, "start": self.start}
        offset.update((key, value) for key, value in extra.items() if value is not None)
        return dict(sorted(offset.items()))  # Spark compares offsets as JSON text

    @classmethod
    def from_offset(cls, offset: dict[str, Any], mark: Watermark) -> BatchEnd:
        """``offset`` (whose watermark is ``mark``) with what it carries for its replay. What it saw of the stream
        (``last``, ``last_ts``) is dropped when the stream was deleted and created again since (``mark`` is the new
        one's): that was another stream's history."""
        start, last = offset.get("start"), offset.get("last")
        same = offset.get("created", "") in ("", mark.created)
        return cls(
            mark,
            offset.get("cut"),
            None if start is None else int(start),
            None if last is None or not same else int(last),
            offset.get("last_ts") if same else None,
        )


def _batch_ids(root: Path, log: str) -> list[int]:
    return [int(p.name) for p in (root / log).glob("*") if p.name.isdigit()]


def _offset(root: Path, batch_id: int, source: int) -> dict[str, Any]:
    lines = (root / "offsets" / str(batch_id)).read_text().splitlines()
    return json.loads(lines[2 + source])


def committed_offset(checkpoint: str | Path, source: int = 0) -> dict[str, Any] | None:
    """The offset of ``source`` (its position among the query's sources) in the last batch Spark
    committed to ``checkpoint``, or None before the first commit.

    Reads Spark's checkpoint layout: ``commits/<id>`` marks batch ``id`` done and ``offsets/<id>``
    holds a version line, a metadata line, then one JSON offset per source. After the query has
    planned its next batch (or sat idle), the member consumers' ack floors equal this offset's seq.
    """
    root = Path(checkpoint)
    done = _batch_ids(root, "commits")
    return _offset(root, max(done), source) if done else None


def planned_offset(checkpoint: str | Path, source: int = 0) -> tuple[int, dict[str, Any]] | None:
    """The id and end offset of the last batch Spark planned (committed or not), or None before the first."""
    root = Path(checkpoint)
    planned = _batch_ids(root, "offsets")
    return (max(planned), _offset(root, max(planned), source)) if planned else None
