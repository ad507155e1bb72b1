"""Managing consumer groups: their configs in KV, elastic membership, step-down and status.

The same operations as pcgroups' ``cg`` tool, on the same KV buckets and JSON, so groups made
here can be used by pcgroups applications and the other way round. The ``spark-jetstream group``
and ``status`` commands are thin wrappers over these functions.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

from spark_jetstream.client.jsapi import PRIORITY_GROUP, JetStreamApi, pin_holder
from spark_jetstream.client.kv import WRONG_LAST_SEQUENCE, key_value, write_entry
from spark_jetstream.errors import ApiError, ConsumerNotFoundError, GroupConfigError, StreamNotFoundError
from spark_jetstream.groups.layout import (
    ELASTIC_BUCKET,
    OWNER_METADATA_KEY,
    GroupConfig,
    GroupLayout,
    member_consumer_name,
    work_stream_name,
)
from spark_jetstream.groups.resolve import (
    check_static_stream,
    derived_member_count,
    find_group,
    group_key,
    no_group_error,
    resolve_layout,
)


def load_group(api: JetStreamApi, stream: str, group: str) -> tuple[GroupConfig, int]:
    """The group's config and its KV revision; ``GroupConfigError`` when there is none."""
    found = find_group(api, stream, group)
    if found is None:
        raise no_group_error(stream, group)
    return found


def create_group(api: JetStreamApi, stream: str, group: str, config: GroupConfig) -> GroupConfig:
    """Store a new group config (refusing to overwrite one) and, for an elastic group, its work stream."""
    config.validate(f"group config {group_key(stream, group)}")
    source = api.stream_info(stream)["config"]
    if config.kind == "static":
        check_static_stream(source, group, config.max_members)

    async def store() -> None:
        await key_value(api, config.bucket, create=True, replicas=source.get("num_replicas", 1))
        try:
            await write_entry(api, config.bucket, group_key(stream, group), json.dumps(config.to_json()).encode(), 0)
        except ApiError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise
            raise GroupConfigError(
                f"Group {group!r} on stream {stream!r} already exists: delete it first or change it with add/drop/map."
            ) from None

    api.conn.run(store())
    if config.kind == "elastic":
        try:
            api.stream_info(work_stream_name(stream, group))
        except StreamNotFoundError:
            api.create_stream(config.work_stream_config(source, group))
    return config


def delete_group(api: JetStreamApi, stream: str, group: str) -> list[str]:
    """Remove the config, then the static group's member consumers or the elastic group's work stream; of a group
    derived from the stream's partition transform (no config), the member consumers a query made (they carry its
    owner metadata). Returns what was removed, by name."""
    found = find_group(api, stream, group)
    if found is None:
        return _delete_derived(api, stream, group)
    config = found[0]

    async def forget() -> None:
        await write_entry(api, config.bucket, group_key(stream, group), None)

    api.conn.run(forget())
    removed = [f"the group config {group_key(stream, group)} in KV bucket {config.bucket}"]
    if config.kind == "elastic":
        with contextlib.suppress(StreamNotFoundError):
            api.delete_stream(work_stream_name(stream, group))
            removed.append(f"the work stream {work_stream_name(stream, group)}")
        return removed
    for member in config.mapping():
        with contextlib.suppress(ConsumerNotFoundError, StreamNotFoundError):
            api.delete_consumer(stream, member_consumer_name(group, member))
            removed.append(f"the member consumer {member_consumer_name(group, member)}")
    return removed


def _delete_derived(api: JetStreamApi, stream: str, group: str) -> list[str]:
    names = [name for name in api.consumer_names(stream) if name.startswith(f"{group}-")]
    infos = api.conn.run(api.consumer_infos_async(stream, names))
    made = [
        name
        for name, info in infos.items()
        if info is not None and OWNER_METADATA_KEY in (info["config"].get("metadata") or {})
    ]
    if not made:
        raise no_group_error(stream, group)
    for name in sorted(made):
        with contextlib.suppress(ConsumerNotFoundError):
            api.delete_consumer(stream, name)
    return [f"the member consumer {name}" for name in sorted(made)]


def change_members(
    api: JetStreamApi,
    stream: str,
    group: str,
    *,
    add: tuple[str, ...] = (),
    drop: tuple[str, ...] = (),
    mappings: tuple[tuple[str, tuple[int, ...]], ...] | None = None,
) -> GroupConfig:
    """Change an elastic group's membership (compare-and-set on its KV revision). Readers pick
    the change up at their next batch boundary."""
    config, revision = load_group(api, stream, group)
    if config.kind != "elastic":
        raise GroupConfigError(
            f"Group {group!r} is static: its membership is fixed. Delete and re-create it, or use an elastic group."
        )
    if mappings is not None:
        changed = GroupConfig(**{**config.__dict__, "members": (), "member_mappings": mappings})
    else:
        if config.member_mappings:
            raise GroupConfigError(f"Group {group!r} uses member mappings: change them with `group map`, not add/drop.")
        members = [m for m in dict.fromkeys((*config.members, *add)) if m not in drop]
        changed = GroupConfig(**{**config.__dict__, "members": tuple(members)})
    changed.validate(f"new config of group {group_key(stream, group)}")

    async def update() -> None:
        try:
            await write_entry(
                api, ELASTIC_BUCKET, group_key(stream, group), json.dumps(changed.to_json()).encode(), revision
            )
        except ApiError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise
            raise GroupConfigError(f"Group {group!r} changed while it was being updated: try again.") from None

    api.conn.run(update())
    return changed


def group_layout(api: JetStreamApi, stream: str, group: str, members: int | None = None) -> GroupLayout:
    """The layout a query reads (``groups.resolve.resolve_layout``). A group derived from the stream's partition
    transform has the members the query was given: ``members``, else as many as it made member consumers."""
    source = api.stream_info(stream)["config"]
    if members is None and find_group(api, stream, group) is None:
        members = derived_member_count(api, source, group)
    return resolve_layout(api, source, group, members)


def step_down(api: JetStreamApi, stream: str, group: str, member: str, members: int | None = None) -> None:
    """Unpin a member's consumer: its current reader loses the pin (a standby may take over)."""
    layout = group_layout(api, stream, group, members)
    if member not in layout.member_names:
        raise GroupConfigError(f"{member!r} is not a member of group {group!r}: members are {layout.member_names}.")
    api.conn.run(api.unpin(layout.stream, layout.consumer(member), PRIORITY_GROUP))


@dataclass(frozen=True)
class MemberStatus:
    """One row of ``spark-jetstream status``."""

    member: str
    consumer: str
    partitions: tuple[int, ...]
    pinned: str
    ack_floor: int
    pending: int
    lag: int


def status(api: JetStreamApi, stream: str, group: str, members: int | None = None) -> list[MemberStatus]:
    """Per member: partitions, pin holder, ack floor, pending messages, and lag behind the stream's last seq."""
    layout = group_layout(api, stream, group, members)
    last_seq = api.stream_info(layout.stream)["state"]["last_seq"]
    rows = []
    for member in layout.members:
        name = layout.consumer(member.name)
        try:
            info = api.consumer_info(layout.stream, name)
        except ConsumerNotFoundError:
            rows.append(MemberStatus(member.name, name, member.partitions, "(no consumer)", 0, 0, last_seq))
            continue
        pin = pin_holder(info, group=None)
        floor = info["ack_floor"]["stream_seq"]
        pending = info["num_pending"] + info["num_ack_pending"]
        rows.append(MemberStatus(member.name, name, member.partitions, pin or "-", floor, pending, last_seq - floor))
    return rows
