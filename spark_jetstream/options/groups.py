"""The options of a read through a consumer group: the group, and how its member consumers are configured and
pulled from (refused without ``group``, except ``group`` itself)."""

from __future__ import annotations

from spark_jetstream.options.option import READ, STREAM, Option
from spark_jetstream.options.parsers import (
    DEFAULT_PRIORITY_TIMEOUT,
    parse_ack_policy,
    parse_duration,
    parse_int,
    parse_name,
    parse_positive_int,
)

GROUPS: tuple[Option, ...] = (
    Option(
        "group",
        parse_name,
        None,
        "A partitioned consumer group (pcgroups) whose member consumers `<group>-<member>` hold the query's "
        "position as their ack floors, with pins that keep other clients out; made when missing. Without it the "
        "position lives in the checkpoint alone, and the query creates and changes nothing on the server.",
        READ,
        "read",
        batch_doc="Read what this group reads (its work stream, its members' filter subjects), without touching its "
        "consumers. Default: the whole stream.",
    ),
    Option(
        "members",
        parse_positive_int,
        None,
        "Members of a group derived from the stream's partition transform (default: one per partition).",
        READ,
        "read",
        batch_doc="With `group`: as for streaming reads.",
        group_only=True,
    ),
    Option(
        "pullsInFlight",
        parse_int,
        4,
        "Pull requests kept outstanding per member.",
        frozenset({STREAM}),
        "pull",
        attr="in_flight",
        minimum=1,
        group_only=True,
    ),
    Option(
        "pullExpires",
        parse_duration,
        5.0,
        "How long one pull request may wait at the server: under half of `priorityTimeout` (the default drops to a "
        "quarter of a `priorityTimeout` under 10s).",
        frozenset({STREAM}),
        "pull",
        attr="expires",
        minimum=0.1,
        group_only=True,
    ),
    Option(
        "pullIdleHeartbeat",
        parse_duration,
        1.0,
        "Server heartbeat interval while a pull waits; at most half of `pullExpires` (the default drops to half "
        "of a `pullExpires` under 2s).",
        frozenset({STREAM}),
        "pull",
        attr="idle_heartbeat",
        minimum=0.05,
        group_only=True,
    ),
    Option(
        "ackWait",
        parse_duration,
        3600.0,
        "The member consumers' ack_wait: how long a delivered, uncommitted message waits before the "
        "server may redeliver it.",
        frozenset({STREAM}),
        "read",
        minimum=1,
        group_only=True,
    ),
    Option(
        "priorityTimeout",
        parse_duration,
        DEFAULT_PRIORITY_TIMEOUT,
        "The member consumers' priority_timeout: how long a pin survives without a pull that carries its id. "
        "The query renews its pins every 5 s, or a quarter of this if shorter (Direct Get), or with every pull "
        "(`readMode=pull`, where an idle query's pins lapse after it).",
        frozenset({STREAM}),
        "pull",
        minimum=5,
        group_only=True,
    ),
    Option(
        "ackPolicy",
        parse_ack_policy,
        "explicit",
        "The member consumers' ack policy. `none` (Limits-retention streams only) spares the server tracking "
        "every delivered message until the commit, for about 1.3x faster pulled reads (`readMode=pull`) from "
        "file-backed streams; the commit still sets every ack floor to the checkpoint, but while a batch is read "
        "the floor runs ahead of it (docs: Concepts, guarantees).",
        frozenset({STREAM}),
        "read",
        group_only=True,
    ),
)
