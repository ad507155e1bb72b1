"""Partitioned consumer groups: member consumers and the partitioned stream layout.

A member consumer is the durable pull consumer ``<group>-<member>`` filtered on the member's
partitions (the partition number is the first subject token), with pinned-client priority so
one reader at a time owns it, and nothing acked until Spark commits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import GroupConfigError
from .jsapi import PRIORITY_GROUP

_NS = 1_000_000_000

DEFAULT_ACK_WAIT = 3600.0
"""Seconds. Nothing is acked while Spark works on a batch; redelivery must not kick in meanwhile."""

DEFAULT_PRIORITY_TIMEOUT = 120.0
"""Seconds a pin survives without a pull that carries its id (the server's default)."""


def member_consumer_name(group: str, member: str) -> str:
    return f"{group}-{member}"


def partition_filters(partitions: Iterable[int], filters: Sequence[str] = ()) -> list[str]:
    """``["<p>.>"]`` per partition, or ``"<p>.<filter>"`` for each of the group's subject filters."""
    return [f"{p}.{f}" for p in sorted(partitions) for f in (filters or [">"])]


def member_consumer_config(
    group: str,
    member: str,
    filter_subjects: Sequence[str],
    *,
    ack_wait: float = DEFAULT_ACK_WAIT,
    priority_timeout: float = DEFAULT_PRIORITY_TIMEOUT,
    priority_group: str = PRIORITY_GROUP,
) -> dict[str, Any]:
    """The JetStream config of one member consumer."""
    name = member_consumer_name(group, member)
    return {
        "durable_name": name,
        "name": name,
        "filter_subjects": list(filter_subjects),
        "ack_policy": "explicit",
        "deliver_policy": "all",
        "max_ack_pending": -1,
        "max_deliver": -1,
        "ack_wait": int(ack_wait * _NS),
        "priority_policy": "pinned_client",
        "priority_groups": [priority_group],
        "priority_timeout": int(priority_timeout * _NS),
    }


def partitioned_stream_config(name: str, subject: str, partitions: int, **extra: Any) -> dict[str, Any]:
    """A stream whose stored subjects start with a partition number: ``subject`` ``orders.*`` is
    stored as ``<p>.orders.<token>`` with ``p = fnv1a(token) % partitions`` (the pcgroups layout).

    Every ``*`` of ``subject`` feeds the hash; ``subject`` must contain at least one ``*``.
    """
    wildcards = subject.split(".").count("*")
    if wildcards == 0:
        raise ValueError(f"subject {subject!r} needs at least one '*' token to partition on")
    indexes = ",".join(str(i) for i in range(1, wildcards + 1))
    dest_tokens, seen = [], 0
    for token in subject.split("."):
        if token == "*":
            seen += 1
            dest_tokens.append(f"{{{{wildcard({seen})}}}}")
        else:
            dest_tokens.append(token)
    dest = f"{{{{partition({partitions},{indexes})}}}}." + ".".join(dest_tokens)
    return {
        "name": name,
        "subjects": [subject],
        "subject_transform": {"src": subject, "dest": dest},
        "allow_direct": True,
        **extra,
    }


def balanced_mapping(members: Sequence[str], max_members: int) -> dict[str, list[int]]:
    """pcgroups' balanced member -> partitions mapping.

    Members are deduplicated, sorted and cut to ``max_members``; partitions are dealt out in
    contiguous blocks of ``max_members // len(members)``, and the remainder round-robin from the
    first member, so that few partitions move when membership changes.
    """
    ordered = sorted(set(members))[:max_members]
    if not ordered:
        return {}
    mapping: dict[str, list[int]] = {member: [] for member in ordered}
    count = len(ordered)
    per_member = max_members // count
    for partition in range(max_members):
        if partition < count * per_member:
            owner = ordered[(partition // per_member) % count]
        else:
            owner = ordered[(partition - count * per_member) % count]
        mapping[owner].append(partition)
    return mapping


@dataclass(frozen=True)
class GroupLayout:
    """Who reads what: the group's members, their partitions and subject filters.

    ``partitions`` is None for an unpartitioned stream read by a single member.
    """

    stream: str
    group: str
    members: tuple[tuple[str, tuple[int, ...]], ...]
    partitioned: bool = True
    filters: tuple[str, ...] = ()
    source: str = "partition transform"

    @property
    def member_names(self) -> list[str]:
        return [member for member, _ in self.members]

    def consumer(self, member: str) -> str:
        return member_consumer_name(self.group, member)

    def filter_subjects(self, member: str) -> list[str]:
        partitions = dict(self.members)[member]
        if not self.partitioned:
            return list(self.filters)
        return partition_filters(partitions, self.filters)

    def consumer_config(self, member: str, ack_wait: float, metadata: dict[str, str]) -> dict[str, Any]:
        config = member_consumer_config(self.group, member, self.filter_subjects(member), ack_wait=ack_wait)
        config["metadata"] = metadata
        return config


_PARTITION_DEST = re.compile(r"^\{\{\s*partition\s*\(\s*(\d+)\s*(?:,[^)]*)?\)\s*\}\}\.", re.IGNORECASE)


def transform_partitions(stream_config: dict[str, Any]) -> int | None:
    """N when the stream's subject transform puts ``{{partition(N, ...)}}`` first, else None."""
    dest = (stream_config.get("subject_transform") or {}).get("dest", "")
    match = _PARTITION_DEST.match(dest)
    return int(match.group(1)) if match else None


def layout_from_config(stream: str, group: str, config: dict[str, Any], source: str) -> GroupLayout:
    """A layout from a pcgroups group config (``max_members`` + ``members`` or ``member_mappings``)."""
    where = f"group config {stream}.{group} in {source}"
    try:
        max_members = int(config["max_members"])
    except (KeyError, TypeError, ValueError):
        raise GroupConfigError(f"The {where} has no valid max_members.") from None
    filters = config.get("filters") or ([config["filter"]] if config.get("filter") else [])
    if config.get("members"):
        mapping = balanced_mapping([str(m) for m in config["members"]], max_members)
    elif config.get("member_mappings"):
        mapping = {str(m["member"]): sorted(int(p) for p in m["partitions"]) for m in config["member_mappings"]}
    else:
        raise GroupConfigError(f"The {where} names no members and no member_mappings.")
    members = tuple((member, tuple(parts)) for member, parts in sorted(mapping.items()) if parts)
    return GroupLayout(stream, group, members, True, tuple(filters), source)


def derived_layout(stream_config: dict[str, Any], group: str, member_count: int | None) -> GroupLayout:
    """The layout when no group config exists: members 0..M-1 over the transform's N partitions,
    or one member over the whole stream when it is not partitioned."""
    stream = stream_config["name"]
    partitions = transform_partitions(stream_config)
    if partitions is None:
        if member_count not in (None, 1):
            raise GroupConfigError(
                f"Stream {stream!r} is not partitioned (its subject transform does not start with "
                "{{partition(N,...)}}), so it is read by one member: remove the members option."
            )
        return GroupLayout(stream, group, (("0", ()),), False, (), "whole stream")
    count = member_count or partitions
    if count > partitions:
        raise GroupConfigError(
            f"members={count} is more than the {partitions} partitions of stream {stream!r}: use at most {partitions}."
        )
    mapping = balanced_mapping([str(m) for m in range(count)], partitions)
    members = tuple((member, tuple(parts)) for member, parts in sorted(mapping.items(), key=lambda i: int(i[0])))
    return GroupLayout(stream, group, members, True, (), "partition transform")
