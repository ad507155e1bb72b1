"""Progress marker subjects: written by the exactly-once writer (``sink/atomic.py``), left out by every read.

A marker lives on ``<progressSubject>.sjp-<sink>.<partition>``: the ``sjp-`` token tells any reader of the stream
that the message is the connector's bookkeeping, whatever prefix the user chose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

MARKER_TOKEN = "sjp-"
MARKER_PATTERN = r"(^|\.)sjp-[0-9a-f-]{1,64}\.[0-9]{1,9}$"
"""How a marker subject ends."""


def marker_subject(prefix: str, sink: str, partition: int) -> str:
    """The marker subject of ``sink``'s (a query id, a write id) Spark partition ``partition``."""
    return f"{prefix}.{MARKER_TOKEN}{sink}.{partition}"


def sink_subjects(prefix: str, sink: str) -> str:
    """The filter of every marker subject of ``sink``."""
    return f"{prefix}.{MARKER_TOKEN}{sink}.*"


def sink_of(prefix: str, subject: str) -> str | None:
    """The sink (query or write id) whose marker ``subject`` under ``prefix`` is, or None for another subject."""
    token = subject.removeprefix(f"{prefix}.").split(".")[0]
    return token.removeprefix(MARKER_TOKEN) if token.startswith(MARKER_TOKEN) else None


def is_marker(subjects: pa.Array) -> pa.Array | None:
    """Which of a column of subjects are progress markers, or None when none is (the usual case: one substring
    search per subject, no regex)."""
    import pyarrow.compute as pc  # not at module level: the driver needs no pc

    if not pc.any(pc.match_substring(subjects, "." + MARKER_TOKEN)).as_py():
        return None
    return pc.match_substring_regex(subjects, MARKER_PATTERN)
