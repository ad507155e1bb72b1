"""Which layout a group read uses, answered once: the group's config found, checked against the stream, resolved.

Streaming reads (``stream.coordinator``), batch reads (``read.batch``) and the command line
(``groups.admin``) all ask here, so they cannot disagree: a group resolves to the same members and filters.
"""

from __future__ import annotations

import logging
from typing import Any

from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.kv import get_entry_async
from spark_jetstream.client.messages import subjects_matching
from spark_jetstream.errors import GroupConfigError, StreamNotFoundError
from spark_jetstream.groups.layout import (
    ELASTIC_BUCKET,
    STATIC_BUCKET,
    GroupConfig,
    GroupLayout,
    derived_layout,
    layout_from_config,
    member_consumer_name,
    transform_partitions,
    work_stream_name,
)

log = logging.getLogger(__name__)


def group_key(stream: str, group: str) -> str:
    """The KV key of a group config (pcgroups' naming)."""
    return f"{stream}.{group}"


def find_group(api: JetStreamApi, stream: str, group: str) -> tuple[GroupConfig, int] | None:
    """The group's pcgroups config (static bucket first, then elastic) and its KV revision, or None."""
    return api.conn.run(find_group_async(api, stream, group))


async def find_group_async(api: JetStreamApi, stream: str, group: str) -> tuple[GroupConfig, int] | None:
    """``find_group`` on the connection's loop. Asked every batch, so asked without an API error whatever is missing
    (the server counts each in the JetStream API error counter operators alert on): which config buckets exist
    (``STREAM.NAMES``, the meta leader), whether one holds the key (``STREAM.INFO`` with the key as its subjects
    filter, the bucket's leader), and only then the entry (``STREAM.MSG.GET``, the leader: a config just written is
    seen)."""
    key = group_key(stream, group)
    buckets = set(await api.stream_names_async(f"$KV.*.{key}"))
    for bucket, kind in ((STATIC_BUCKET, "static"), (ELASTIC_BUCKET, "elastic")):
        if f"KV_{bucket}" not in buckets or not await _holds(api, bucket, key):
            continue
        entry = await get_entry_async(api, bucket, key)
        if entry is not None:
            return GroupConfig.from_json(kind, entry.data, f"group config {key} in KV bucket {bucket}"), entry.seq
    return None


async def _holds(api: JetStreamApi, bucket: str, key: str) -> bool:
    """Whether KV bucket ``bucket`` holds anything under ``key`` (a value, or the marker of its deletion)."""
    try:
        return await subjects_matching(api, f"KV_{bucket}", f"$KV.{bucket}.{key}") > 0
    except StreamNotFoundError:  # deleted since it was listed
        return False


def no_group_error(stream: str, group: str) -> GroupConfigError:
    return GroupConfigError(
        f"There is no group {group!r} on stream {stream!r}: create it with "
        f"`spark-jetstream group create --stream {stream} --group {group} ...`."
    )


def check_static_stream(stream_config: dict[str, Any], group: str, max_members: int) -> None:
    """A static group reads partition numbers from the stream's subjects: the stream must put them there."""
    partitions = transform_partitions(stream_config)
    if partitions == max_members:
        return
    now = "it has no partition transform" if partitions is None else f"it makes {partitions} partitions"
    raise GroupConfigError(
        f"Stream {stream_config['name']!r} does not put a partition number 0..{max_members - 1} first in its "
        f"subjects ({now}), but static group {group!r} has max_members={max_members} and reads partitions from "
        "the subject: give the stream a transform, e.g. nats stream edit STREAM --transform-source 'orders.*' "
        f"--transform-destination '{{{{partition({max_members},1)}}}}.orders.{{{{wildcard(1)}}}}', or use an "
        "elastic group."
    )


def ensure_work_stream(api: JetStreamApi, source_config: dict[str, Any], group: str, config: GroupConfig) -> str:
    """The elastic group's WorkQueue stream, created from the group config when missing."""
    wanted = config.work_stream_config(source_config, group)
    try:
        info = api.stream_info(wanted["name"])
    except StreamNotFoundError:
        log.info("Creating the work stream %s of elastic group %s", wanted["name"], group)
        api.create_stream(wanted)
        return wanted["name"]
    if info["config"].get("retention") != "workqueue":
        raise GroupConfigError(
            f"Stream {wanted['name']!r} exists but is not a WorkQueue stream, so it cannot be the work stream "
            f"of elastic group {group!r}: delete it or rename the group."
        )
    return wanted["name"]


def resolve_layout(
    api: JetStreamApi,
    source_config: dict[str, Any],
    group: str,
    members: int | None,
    *,
    create_work_stream: bool = False,
) -> GroupLayout:
    """The group's layout: its pcgroups config in KV (static, then elastic) if there is one, else
    derived from the stream's partition transform with ``members`` members (default: one per partition).

    Only a streaming query creates an elastic group's missing work stream; batch reads and the command
    line never change the server.
    """
    found = find_group(api, source_config["name"], group)
    return layout_of(api, source_config, group, members, found, create_work_stream)


def layout_of(
    api: JetStreamApi,
    source_config: dict[str, Any],
    group: str,
    members: int | None,
    found: tuple[GroupConfig, int] | None,
    create_work_stream: bool = False,
) -> GroupLayout:
    """``resolve_layout`` with the group's config already looked up (``find_group``)."""
    stream = source_config["name"]
    if found is None:
        return derived_layout(source_config, group, members)
    config = found[0]
    if config.kind == "static":
        check_static_stream(source_config, group, config.max_members)
        return layout_from_config(stream, group, config)
    read = ensure_work_stream(api, source_config, group, config) if create_work_stream else None
    return layout_from_config(read or work_stream_name(stream, group), group, config)


def derived_member_count(api: JetStreamApi, stream_config: dict[str, Any], group: str) -> int:
    """How many members a query gave a group derived from the stream's transform (for the command line,
    which is not told the query's ``members`` option): its member consumers ``<group>-0..M-1``, each
    checked against the filters the layout of M members gives it, so a leftover consumer is not counted
    into a layout no query reads."""
    stream = stream_config["name"]
    configs = []
    names = set(api.consumer_names(stream))
    while member_consumer_name(group, str(len(configs))) in names:
        configs.append(api.consumer_info(stream, member_consumer_name(group, str(len(configs))))["config"])
    if not configs:
        raise no_group_error(stream, group)
    layout = derived_layout(stream_config, group, len(configs))
    for member, config in zip(layout.member_names, configs, strict=True):
        have = config.get("filter_subjects") or [config.get("filter_subject") or ""]
        if layout.filter_subjects(member) and have != layout.filter_subjects(member):
            raise GroupConfigError(
                f"Member consumer {layout.consumer(member)!r} filters {have}, not the {layout.filter_subjects(member)} "
                f"of {len(configs)} members over the stream's partitions: pass --members with the query's members "
                "option."
            )
    return len(configs)
