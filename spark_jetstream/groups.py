"""Partitioned consumer groups: member consumers and the partitioned stream layout.

A member consumer is the durable pull consumer ``<group>-<member>`` filtered on the member's
partitions (the partition number is the first subject token), with pinned-client priority so
one reader at a time owns it, and nothing acked until Spark commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

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
