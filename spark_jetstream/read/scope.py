"""What a read covers: the stream its tasks read, the filter subjects the server selects messages by (a read range
per filter), and whether stored subjects start with a partition number.

A group's scope is its members' filters on the stream they read (``group_scope``); a read without a group covers
the stream's partitions, or the whole stream, narrowed by option ``subjects`` (``stream_scope``). Pure functions of
the stream's config and the options, so the driver and every replay agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spark_jetstream.client.subjects import collide
from spark_jetstream.errors import OptionError
from spark_jetstream.groups.layout import GroupLayout, partition_filters, transform_partitions


@dataclass(frozen=True)
class ReadScope:
    stream: str
    filters: tuple[str, ...]
    partitioned: bool


def group_scope(layout: GroupLayout) -> ReadScope:
    return ReadScope(layout.stream, tuple(layout.read_filters), layout.partitioned)


def stream_partitions(stream_config: dict[str, Any]) -> int | None:
    """N when the stored subjects start with a partition number: the stream's own transform, or the transforms
    through which it sources (an elastic group's work stream)."""
    own = transform_partitions(stream_config)
    if own is not None:
        return own
    counts = {
        transform_partitions({"subject_transform": transform})
        for source in stream_config.get("sources") or []
        for transform in source.get("subject_transforms") or []
    }
    return counts.pop() if len(counts) == 1 and None not in counts else None


def stream_scope(stream_config: dict[str, Any], subjects: Sequence[str] | None) -> ReadScope:
    """A read of the stream without a group: a filter per partition (``<p>.>``, or ``<p>.<filter>`` for each of
    ``subjects``: the filters apply to subjects as the rows show them, without the partition token), or the
    filters themselves (``>`` when none) on a stream without partitions. A filter that matches none of the
    stream's subjects is refused."""
    check_subjects(stream_config, subjects)
    count = stream_partitions(stream_config)
    if count is None:
        return ReadScope(stream_config["name"], tuple(subjects or (">",)), False)
    return ReadScope(stream_config["name"], tuple(partition_filters(range(count), subjects or ())), True)


def row_subjects(stream_config: dict[str, Any]) -> list[str] | None:
    """The patterns of the subjects a read's rows can show (the ``subject`` column), from the stream's config; None
    when the config does not tell (a mirror, or a stream that sources others)."""
    subjects = stream_config.get("subjects") or []
    if not subjects or stream_config.get("sources") or stream_config.get("mirror"):
        return None
    transform = stream_config.get("subject_transform") or {}
    source, destination = transform.get("src"), transform.get("dest")
    if not source or not destination:
        return list(subjects)
    stored = ".".join("*" if "{{" in token else token for token in destination.split("."))
    if transform_partitions(stream_config) is not None:  # rows drop the partition token; others are no rows
        return [stored.partition(".")[2] or ">"]
    return [stored if collide(subject, source) else subject for subject in subjects]


def check_subjects(stream_config: dict[str, Any], subjects: Sequence[str] | None) -> None:
    """Refuse a ``subjects`` filter that matches none of the subjects the stream's rows can have."""
    patterns = row_subjects(stream_config)
    if not subjects or patterns is None:
        return
    for subject in subjects:
        if not any(collide(subject, pattern) for pattern in patterns):
            raise OptionError(
                f"Option 'subjects': filter {subject!r} matches none of the subjects of stream "
                f"{stream_config['name']!r} ({', '.join(patterns)}, as the subject column shows them), so it "
                "would read nothing: fix the filter, or the stream option."
            )
