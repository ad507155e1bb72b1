"""How a micro-batch is cut into Spark partitions, decided once when the batch is planned and recorded in its end
offset, so that a replay is cut the same way whatever changed meanwhile (decision 0042).

Exactly-once sinks name a row by its batch, Spark partition and position: the jetstream sink's msg ids
(``<query>:<batch>:<partition>:<row>``), its progress markers (rows of a partition stored so far), a user's sink that
deduplicates by ``(partitionId, epochId)``. A replayed batch must therefore hand each Spark partition the same rows in
the same order. What the cut depends on and can change between an attempt and its replay (the stream's average
message size, which decides whether the batch is one task; the stream's config, which decides whether it is read as
one unfiltered range; which filters have messages in the range; the group's layout; ``readMode=auto``'s choice) is
therefore decided in ``latestOffset`` and written into the end offset as ``cut``; ``partitions()`` carries it out.

JSON, in the end offset::

    "cut": {"members": [[member, [partitions], [filters]], ...],   # with a group: the layout it was planned with
            "tasks": [[range, ...], ...]}                          # a Spark partition each, its ranges in order
    "cut": {"members": [...], "pull": true}                        # a task per member, pulled from its consumer

A range is ``[filter, low, high]`` (the messages of ``filter`` with ``low < seq <= high``), or just the filter when it
spans the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spark_jetstream.errors import OptionError
from spark_jetstream.groups.layout import Member
from spark_jetstream.read.ranges import SeqRange, SmallBatch

Range = tuple[str, int, int]
"""A filter and the seqs ``(low, high]`` of it a task reads."""


@dataclass(frozen=True)
class Cut:
    """The Spark partitions of one batch: ``tasks`` (each a sequence of ranges read one after the other), or with
    ``pull`` one task per member of ``members``; ``members``: the group's layout the batch was planned with (None
    without a group)."""

    tasks: tuple[tuple[Range, ...], ...] = ()
    pull: bool = False
    members: tuple[Member, ...] | None = None

    @classmethod
    def of(cls, partitions: Sequence[SeqRange | SmallBatch], members: tuple[Member, ...] | None) -> Cut:
        """The cut of a plan's range tasks."""
        tasks = tuple(
            tuple((r.filter, r.start, r.end) for r in (p.ranges if isinstance(p, SmallBatch) else (p,)))
            for p in partitions
        )
        return cls(tasks, False, members)

    def to_json(self, start: int, end: int) -> dict[str, Any]:
        """The cut as the end offset of the batch ``(start, end]`` carries it (module doc)."""
        data: dict[str, Any] = {}
        if self.members is not None:
            data["members"] = [[m.name, list(m.partitions), list(m.filter_subjects)] for m in self.members]
        if self.pull:
            data["pull"] = True
        else:
            data["tasks"] = [
                [f if (low, high) == (start, end) else [f, low, high] for f, low, high in task] for task in self.tasks
            ]
        return data

    @classmethod
    def from_json(cls, data: Any, start: int, end: int) -> Cut:
        """The cut an end offset carries; one this source cannot read is refused, naming the offset."""
        try:
            members = data.get("members")
            return cls(
                tasks=tuple(
                    tuple((r, start, end) if isinstance(r, str) else (str(r[0]), int(r[1]), int(r[2])) for r in task)
                    for task in data.get("tasks") or ()
                ),
                pull=bool(data.get("pull")),
                members=None if members is None else tuple(_member(m) for m in members),
            )
        except (AttributeError, IndexError, TypeError, ValueError):
            raise OptionError(
                f"The checkpoint's offset for the batch ({start}, {end}] holds a cut this source cannot read "
                f"({data!r}): was it written by a newer spark-jetstream? Use that version or a new checkpoint location."
            ) from None


def _member(data: Sequence[Any]) -> Member:
    name, partitions, filters = data
    return Member(str(name), tuple(int(p) for p in partitions), tuple(str(f) for f in filters))
