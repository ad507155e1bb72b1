"""Partitioned consumer groups: member consumers and the partitioned stream layout.

A member consumer is the durable pull consumer ``<group>-<member>`` filtered on the member's
partitions (the partition number is the first subject token), with pinned-client priority so
one reader at a time owns it, and nothing acked until Spark commits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from spark_jetstream.client.jsapi import PRIORITY_GROUP
from spark_jetstream.client.subjects import covers
from spark_jetstream.errors import GroupConfigError
from spark_jetstream.options import DEFAULT_PRIORITY_TIMEOUT, default_of

_NS = 1_000_000_000

DEFAULT_ACK_WAIT: float = default_of("ackWait")
"""Seconds. Nothing is acked while Spark works on a batch; redelivery must not kick in meanwhile."""


OWNER_METADATA_KEY = "spark-jetstream.owner"
"""The member consumers' metadata key that names the query that made them last: a consumer that has it is the
connector's."""


def member_consumer_name(group: str, member: str) -> str:
    return f"{group}-{member}"


def partition_filters(partitions: Iterable[int], filters: Sequence[str] = ()) -> list[str]:
    """``"<p>.>"`` per partition, or ``"<p>.<filter>"`` for each of the group's subject filters, in pcgroups'
    order: by filter, then partition in the mapping's order (pcgroups tools re-create a consumer whose
    filter list differs)."""
    return [f"{p}.{f}" for f in (filters or (">",)) for p in partitions]


def partition_transform(subject: str, partitions: int, wildcards: Sequence[int], style: str = "partition") -> str:
    """The transform destination that puts the partition first: ``orders.*`` ->
    ``{{partition(N,1)}}.orders.{{wildcard(1)}}`` (``style`` ``Partition``: pcgroups' capitalised spelling).
    ``wildcards`` are the 1-based ``*`` positions hashed; every ``*`` is kept in place."""
    wildcard = "Wildcard" if style == "Partition" else "wildcard"
    tokens, seen = [], 0
    for token in subject.split("."):
        if token == "*":
            seen += 1
            tokens.append(f"{{{{{wildcard}({seen})}}}}")
        else:
            tokens.append(token)
    args = ",".join(str(i) for i in (partitions, *wildcards))
    return f"{{{{{style}({args})}}}}." + ".".join(tokens)


def member_consumer_config(
    group: str,
    member: str,
    filter_subjects: Sequence[str],
    *,
    ack_wait: float = DEFAULT_ACK_WAIT,
    priority_timeout: float = DEFAULT_PRIORITY_TIMEOUT,
    priority_group: str = PRIORITY_GROUP,
    ack_policy: str = "explicit",
) -> dict[str, Any]:
    """The JetStream config of one member consumer.

    ``ack_policy`` ``none`` (option ``ackPolicy``) leaves out ``max_ack_pending``, which only
    counts explicitly acked messages.
    """
    name = member_consumer_name(group, member)
    config: dict[str, Any] = {
        "durable_name": name,
        "name": name,
        "filter_subjects": list(filter_subjects),
        "ack_policy": ack_policy,
        "deliver_policy": "all",
        "max_deliver": -1,
        "ack_wait": int(ack_wait * _NS),
        "priority_policy": "pinned_client",
        "priority_groups": [priority_group],
        "priority_timeout": int(priority_timeout * _NS),
    }
    if ack_policy == "explicit":
        config["max_ack_pending"] = -1
    return config


def partitioned_stream_config(name: str, subject: str, partitions: int, **extra: Any) -> dict[str, Any]:
    """A stream whose stored subjects start with a partition number: ``subject`` ``orders.*`` is
    stored as ``<p>.orders.<token>`` with ``p = fnv1a(token) % partitions`` (the pcgroups layout).

    Every ``*`` of ``subject`` feeds the hash; ``subject`` must contain at least one ``*``.
    """
    wildcards = subject.split(".").count("*")
    if wildcards == 0:
        raise ValueError(f"subject {subject!r} needs at least one '*' token to partition on")
    dest = partition_transform(subject, partitions, range(1, wildcards + 1))
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


STATIC_BUCKET = "static-consumer-groups"
ELASTIC_BUCKET = "elastic-consumer-groups"
_MEMBER_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def work_stream_name(stream: str, group: str) -> str:
    """The WorkQueue stream an elastic group reads (pcgroups' naming)."""
    return f"{stream}-{group}"


@dataclass(frozen=True)
class PartitioningFilter:
    """An elastic group's subject filter and the 1-based ``*`` positions hashed into the partition."""

    filter: str
    wildcards: tuple[int, ...] = ()

    def transform(self, partitions: int) -> dict[str, str]:
        """The work stream's subject transform: ``foo.*`` -> ``{{Partition(N,1)}}.foo.{{Wildcard(1)}}``."""
        return {"src": self.filter, "dest": partition_transform(self.filter, partitions, self.wildcards, "Partition")}


@dataclass(frozen=True)
class GroupConfig:
    """A group config as pcgroups stores it in KV (``static-consumer-groups`` or
    ``elastic-consumer-groups``, key ``<stream>.<group>``), wire-compatible in both directions."""

    kind: str  # "static" or "elastic"
    max_members: int
    members: tuple[str, ...] = ()
    member_mappings: tuple[tuple[str, tuple[int, ...]], ...] = ()
    filters: tuple[str, ...] = ()  # static groups
    partitioning_filters: tuple[PartitioningFilter, ...] = ()  # elastic groups
    max_buffered_msgs: int = 0
    max_buffered_bytes: int = 0

    @property
    def bucket(self) -> str:
        return STATIC_BUCKET if self.kind == "static" else ELASTIC_BUCKET

    @classmethod
    def from_json(cls, kind: str, raw: bytes | str | dict[str, Any], where: str) -> GroupConfig:
        """Parse and validate; every problem is a ``GroupConfigError`` naming ``where``."""
        try:
            data = raw if isinstance(raw, dict) else json.loads(raw)
            config = cls(
                kind=kind,
                max_members=int(data["max_members"]),
                members=tuple(str(m) for m in data.get("members") or ()),
                member_mappings=tuple(
                    (str(m["member"]), tuple(int(p) for p in m.get("partitions") or ()))
                    for m in data.get("member_mappings") or ()
                ),
                filters=tuple(data.get("filters") or ()),
                partitioning_filters=tuple(
                    PartitioningFilter(f["filter"], tuple(int(i) for i in f.get("partitioning_wildcards") or ()))
                    for f in data.get("partitioning_filters") or ()
                ),
                max_buffered_msgs=int(data.get("max_buffered_msg") or 0),
                max_buffered_bytes=int(data.get("max_buffered_bytes") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GroupConfigError(
                f"The {where} is not a valid {kind} group config ({exc}): fix or delete it."
            ) from None
        config.validate(where)
        return config

    def to_json(self) -> dict[str, Any]:
        """pcgroups' JSON: ``max_members`` always; ``members``/``member_mappings``/``filters`` only when set;
        ``partitioning_filters`` always for elastic groups (null when empty)."""
        data: dict[str, Any] = {"max_members": self.max_members}
        if self.kind == "static" and self.filters:
            data["filters"] = list(self.filters)
        if self.kind == "elastic":
            data["partitioning_filters"] = [
                {"filter": f.filter, "partitioning_wildcards": list(f.wildcards)} for f in self.partitioning_filters
            ] or None
            if self.max_buffered_msgs:
                data["max_buffered_msg"] = self.max_buffered_msgs
            if self.max_buffered_bytes:
                data["max_buffered_bytes"] = self.max_buffered_bytes
        if self.members:
            data["members"] = list(self.members)
        if self.member_mappings:
            data["member_mappings"] = [{"member": m, "partitions": list(p)} for m, p in self.member_mappings]
        return data

    def validate(self, where: str) -> None:
        """pcgroups' rules, plus member names that are valid consumer names."""

        def fail(problem: str) -> None:
            raise GroupConfigError(f"The {where} is invalid: {problem}.")

        if self.max_members < 1:
            fail("max_members must be at least 1")
        if self.members and self.member_mappings:
            fail("give either members or member_mappings, not both")
        for member in [*self.members, *(m for m, _ in self.member_mappings)]:
            if not _MEMBER_NAME.match(member):
                fail(f"member name {member!r} may use only letters, digits, '-' and '_'")
        if self.member_mappings:
            names = [m for m, _ in self.member_mappings]
            if not 1 <= len(names) <= self.max_members:
                fail(f"there must be between 1 and max_members ({self.max_members}) member mappings")
            if len(set(names)) != len(names):
                fail("member names in member_mappings must be unique")
            seen: dict[int, str] = {}
            for member, partitions in self.member_mappings:
                for p in partitions:
                    if not 0 <= p < self.max_members:
                        fail(f"partition {p} of member {member!r} is outside 0..{self.max_members - 1}")
                    if p in seen:
                        fail(f"partition {p} is mapped to both {seen[p]!r} and {member!r}")
                    seen[p] = member
            missing = sorted(set(range(self.max_members)) - set(seen))
            if missing:
                fail(f"partitions {missing} are mapped to no member")
        for f in self.partitioning_filters:
            stars = f.filter.split(".").count("*")
            if not f.filter:
                fail("a partitioning filter must not be empty")
            if stars == 0 and not f.filter.endswith(">"):
                fail(f"partitioning filter {f.filter!r} needs a '*' wildcard or must end with '>'")
            if len(set(f.wildcards)) != len(f.wildcards) or any(not 1 <= i <= stars for i in f.wildcards):
                fail(f"the partitioning wildcards of {f.filter!r} must be distinct positions in 1..{stars}")

    def mapping(self) -> dict[str, list[int]]:
        """Member -> partitions: explicit mappings in their own order (which pcgroups keeps in the
        filter subjects), or the balanced mapping of ``members``."""
        if self.member_mappings:
            return {member: list(partitions) for member, partitions in self.member_mappings}
        return balanced_mapping(self.members, self.max_members)

    def member_filters(self, partitions: Sequence[int]) -> list[str]:
        """Filter subjects of a member owning ``partitions``, in pcgroups' order (by filter, then
        partition). Like pcgroups, explicit mappings ignore the filters."""
        if self.member_mappings:
            return partition_filters(partitions)
        filters = self.filters if self.kind == "static" else tuple(f.filter for f in self.partitioning_filters)
        return partition_filters(partitions, filters)

    def work_stream_config(self, source: dict[str, Any], group: str) -> dict[str, Any]:
        """The elastic group's WorkQueue stream, sourcing ``source`` through the partition transform."""
        transforms = [f.transform(self.max_members) for f in self.partitioning_filters] or [
            {"src": ">", "dest": f"{{{{Partition({self.max_members})}}}}.>"}
        ]
        config: dict[str, Any] = {
            "name": work_stream_name(source["name"], group),
            "retention": "workqueue",
            "discard": "new",
            "allow_direct": True,
            "num_replicas": source.get("num_replicas", 1),
            "storage": source.get("storage", "file"),
            "sources": [{"name": source["name"], "subject_transforms": transforms}],
        }
        if self.max_buffered_msgs:
            config["max_msgs"] = self.max_buffered_msgs
        if self.max_buffered_bytes:
            config["max_bytes"] = self.max_buffered_bytes
        return config


@dataclass(frozen=True)
class Member:
    """One member: its partitions and the filter subjects of its consumer."""

    name: str
    partitions: tuple[int, ...]
    filter_subjects: tuple[str, ...]


@dataclass(frozen=True)
class GroupLayout:
    """Who reads what: the stream the members read, and each member's partitions and filters."""

    stream: str  # the work stream for elastic groups
    group: str
    members: tuple[Member, ...]
    kind: str  # "static", "elastic", "partition transform" or "whole stream"

    @property
    def partitioned(self) -> bool:
        return self.kind != "whole stream"

    @property
    def member_names(self) -> list[str]:
        return [member.name for member in self.members]

    def member(self, name: str) -> Member:
        return next(member for member in self.members if member.name == name)

    def consumer(self, member: str) -> str:
        """pcgroups' names: the bare member on an elastic work stream, else ``<group>-<member>``."""
        return member if self.kind == "elastic" else member_consumer_name(self.group, member)

    def filter_subjects(self, member: str) -> list[str]:
        return list(self.member(member).filter_subjects)

    @property
    def read_filters(self) -> list[str]:
        """What a read of the whole group covers: every member's filters (``">"`` for a layout without members'
        filters, the whole stream)."""
        return [f for member in self.members for f in member.filter_subjects] or [">"]

    def consumer_config(
        self,
        member: str,
        ack_wait: float,
        metadata: dict[str, str],
        ack_policy: str,
        priority_timeout: float = DEFAULT_PRIORITY_TIMEOUT,
    ) -> dict[str, Any]:
        config = member_consumer_config(
            self.group,
            member,
            self.filter_subjects(member),
            ack_wait=ack_wait,
            ack_policy=ack_policy,
            priority_timeout=priority_timeout,
        )
        config["name"] = config["durable_name"] = self.consumer(member)
        config["metadata"] = metadata
        return config


_PARTITION_DEST = re.compile(r"^\{\{\s*partition\s*\(\s*(\d+)\s*(?:,[^)]*)?\)\s*\}\}\.", re.IGNORECASE)


def transform_partitions(stream_config: dict[str, Any]) -> int | None:
    """N when the stream's subject transform puts ``{{partition(N, ...)}}`` first, else None."""
    dest = (stream_config.get("subject_transform") or {}).get("dest", "")
    match = _PARTITION_DEST.match(dest)
    return int(match.group(1)) if match else None


def reads_whole_stream(stream_config: dict[str, Any], filters: Sequence[str]) -> bool:
    """Whether ``filters`` together select every message the stream can hold: every pattern it stores subjects as
    (``stored_patterns``) is taken by one of them. Such a read may use the one filter ``">"``: the server's Direct Get
    of a wildcard filter that is not ``>`` costs it 3-8x more per message (decision 0017)."""
    stored = [">"] if ">" in filters else stored_patterns(stream_config)
    return stored is not None and all(any(covers(f, pattern) for f in filters) for pattern in stored)


_WILDCARD = re.compile(r"\{\{\s*wildcard\s*\(\s*\d+\s*\)\s*\}\}", re.IGNORECASE)


def stored_patterns(stream_config: dict[str, Any]) -> list[str] | None:
    """``<p>.<pattern>`` for each of N partitions when every message the stream stores comes through a transform to
    ``{{partition(N,...)}}.<pattern>``: the stream's own, which all its subjects go through, or those of each of its
    sources (an elastic group's work stream, whose source takes only what they match), ``<pattern>`` ``>`` where the
    rest is not a filter's; else None. A stream without a transform gets None too: its subjects may have been edited
    since older messages were stored."""
    own = stream_config.get("subject_transform")
    subjects = stream_config.get("subjects") or []
    sources = stream_config.get("sources") or []
    if stream_config.get("mirror"):
        return None
    if own and subjects and not sources and all(subject == own.get("src") for subject in subjects):
        transforms = [own]
    elif sources and not subjects and all(source.get("subject_transforms") for source in sources):
        transforms = [transform for source in sources for transform in source["subject_transforms"]]
    else:
        return None
    counts, stored = set(), []
    for transform in transforms:
        dest = transform.get("dest") or ""
        match = _PARTITION_DEST.match(dest)
        if match is None:
            return None
        pattern = _WILDCARD.sub("*", dest[match.end() :])
        if any("{" in token or ("*" in token and token != "*") for token in pattern.split(".")):
            pattern = ">"  # another transform function, or a wildcard inside a token: only the partition token is known
        counts.add(int(match.group(1)))
        stored.append(pattern)
    return [f"{p}.{pattern}" for p in range(counts.pop()) for pattern in stored] if len(counts) == 1 else None


def layout_from_config(stream: str, group: str, config: GroupConfig) -> GroupLayout:
    """The layout of a static or elastic group config (``stream`` is the one the members read)."""
    members = tuple(
        Member(name, tuple(parts), tuple(config.member_filters(parts)))
        for name, parts in sorted(config.mapping().items())
        if parts
    )
    return GroupLayout(stream, group, members, config.kind)


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
        return GroupLayout(stream, group, (Member("0", (), ()),), "whole stream")
    count = member_count or partitions
    if count > partitions:
        raise GroupConfigError(
            f"members={count} is more than the {partitions} partitions of stream {stream!r}: use at most {partitions}."
        )
    mapping = balanced_mapping([str(m) for m in range(count)], partitions)
    members = tuple(
        Member(name, tuple(parts), tuple(partition_filters(parts)))
        for name, parts in sorted(mapping.items(), key=lambda item: int(item[0]))
    )
    return GroupLayout(stream, group, members, "partition transform")
