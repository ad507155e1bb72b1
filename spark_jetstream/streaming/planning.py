"""How far a micro-batch reaches: read limits -> the batch's end watermark. Pure functions.

A batch is the seq range ``(start, end]``. A range of width n holds at most n messages of the
group, so a row limit is exact as ``end = min(last_seq, start + n)``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """The limits in force for one ``latestOffset`` call (None: no such limit)."""

    max_rows: int | None = None
    max_bytes: int | None = None
    min_rows: int | None = None
    min_rows_waited_out: bool = False  # maxTriggerDelay has passed since the last batch


def batch_end(start: int, last_seq: int, limits: Limits, average_size: float, cap: int | None = None) -> int:
    """The end watermark of the next batch; ``start`` itself means "no batch now"."""
    end = last_seq if cap is None else min(last_seq, cap)
    if end <= start:
        return start
    if limits.min_rows is not None and end - start < limits.min_rows and not limits.min_rows_waited_out:
        return start
    if limits.max_rows is not None:
        end = min(end, start + limits.max_rows)
    if limits.max_bytes is not None:
        end = min(end, start + max(1, int(limits.max_bytes // max(average_size, 1.0))))
    return end
