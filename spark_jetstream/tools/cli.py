"""The ``spark-jetstream`` command line: ``demo``, ``group ...``, ``status``.

The CLI only parses arguments, prints, and calls the library.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from spark_jetstream import __version__
from spark_jetstream.client.connection import connect
from spark_jetstream.client.features import GROUPS
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import JetStreamError, redact
from spark_jetstream.groups.admin import (
    change_members,
    create_group,
    delete_group,
    group_layout,
    load_group,
    status,
    step_down,
)
from spark_jetstream.groups.layout import (
    ELASTIC_BUCKET,
    STATIC_BUCKET,
    GroupConfig,
    PartitioningFilter,
)
from spark_jetstream.options import CONNECTION_OPTIONS, Option, parse_connection_options
from spark_jetstream.options.parsers import parse_duration
from spark_jetstream.sink.markers import forget, forget_progress, markers, progress_markers
from spark_jetstream.tools.rights import read_rights


def demo_command(args: argparse.Namespace) -> int:
    from spark_jetstream.tools import demo

    return demo.run(
        servers=args.servers,
        creds=args.creds,
        messages=args.messages,
        partitions=args.partitions,
        stream=args.stream,
        rate=args.rate,
        batch_limit=args.max_per_batch,
        out=args.out,
        keep=args.keep,
    )


def _flag(option: Option) -> str:
    """``connectTimeout`` -> ``connect-timeout``, ``tls.ca`` -> ``tls-ca``."""
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in option.name.replace(".", "-"))


def _connection_args(parser: argparse.ArgumentParser) -> None:
    for option in CONNECTION_OPTIONS:
        if _from_env(option):  # a secret's text never goes on a command line (ps, shell history)
            parser.add_argument(
                f"--{_flag(option)}-env",
                dest=option.attr,
                metavar="VAR",
                help=f"the environment variable that holds option {option.name}: {option.doc.replace('%', '%%')}",
            )
        else:
            parser.add_argument(f"--{_flag(option)}", dest=option.attr, help=option.doc.replace("%", "%%"))


def _from_env(option: Option) -> bool:
    """A secret (a password, a token, a key's or a seed's text) comes from an environment variable the flag names."""
    return option.secret


def _connection_raw(args: argparse.Namespace) -> dict[str, str]:
    """The connection options given: a secret's text read from the environment variable its flag names."""
    raw = {}
    for option in CONNECTION_OPTIONS:
        value = getattr(args, option.attr, None)
        if value is not None and _from_env(option):
            if value not in os.environ:
                raise JetStreamError(
                    f"--{_flag(option)}-env names the environment variable {value!r}, which is not set: export it "
                    f"with the text of option {option.name}."
                )
            value = os.environ[value]
        if value is not None:
            raw[option.name] = value
    return raw


def _secrets(args: argparse.Namespace) -> tuple[str | None, ...]:
    try:
        raw = _connection_raw(args)
    except JetStreamError:
        raw = {}
    return tuple(raw.get(option.name) for option in CONNECTION_OPTIONS if option.secret)


def _members_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--members",
        type=int,
        help="a group without a pcgroups config: the query's members option (default: as many as it made consumers)",
    )


def _api(args: argparse.Namespace) -> JetStreamApi:
    return JetStreamApi(connect(parse_connection_options(_connection_raw(args))))


def _mappings(texts: Sequence[str]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``["a:0,1", "b:2"]`` -> ``(("a", (0, 1)), ("b", (2,)))``."""
    mappings = []
    for text in texts:
        member, sep, parts = text.partition(":")
        try:
            mappings.append((member, tuple(int(p) for p in parts.split(",") if p)))
        except ValueError:
            raise JetStreamError(f"Mapping {text!r} is not member:partition,partition,...") from None
        if not sep:
            raise JetStreamError(f"Mapping {text!r} is not member:partition,partition,...")
    return tuple(mappings)


def _partitioning_filters(texts: Sequence[str]) -> tuple[PartitioningFilter, ...]:
    """``["orders.*.*:1,2"]`` -> filters with the ``*`` positions to hash (default: all of them)."""
    filters = []
    for text in texts:
        subject, _, indexes = text.partition(":")
        stars = subject.split(".").count("*")
        wildcards = tuple(int(i) for i in indexes.split(",") if i) if indexes else tuple(range(1, stars + 1))
        filters.append(PartitioningFilter(subject, wildcards))
    return tuple(filters)


def _print_group(api: JetStreamApi, stream: str, group: str) -> None:
    config, revision = load_group(api, stream, group)
    layout = group_layout(api, stream, group)
    print(f"{config.kind} group {group!r} on stream {stream!r} (reads {layout.stream!r}, revision {revision})")
    print(f"  config: {json.dumps(config.to_json())}")
    for member in layout.members:
        partitions = ",".join(map(str, member.partitions))
        print(f"  {member.name:<16} partitions {partitions:<20} {' '.join(member.filter_subjects)}")


def group_command(args: argparse.Namespace) -> int:
    api = _api(args)
    action = args.action
    if action == "list":
        found: list[Command] = []
        for name in api.stream_names():
            if name.startswith("KV_") and name[3:] in (STATIC_BUCKET, ELASTIC_BUCKET):
                prefix = f"$KV.{name[3:]}.{args.stream}."
                found += [(name[3:], subject[len(prefix) :]) for subject in api.subjects(name, prefix + "*")]
        for bucket, group in sorted(found):
            print(f"{group:<24} {'static' if bucket == STATIC_BUCKET else 'elastic'}")
        if not found:
            print(f"no groups on stream {args.stream!r}")
        return 0
    if action == "create":
        config = GroupConfig(
            kind=args.kind,
            max_members=args.max_members,
            members=tuple(args.members or ()),
            member_mappings=_mappings(args.map or ()),
            filters=tuple(args.filter or ()) if args.kind == "static" else (),
            partitioning_filters=_partitioning_filters(args.filter or ()) if args.kind == "elastic" else (),
            max_buffered_msgs=args.max_buffered_msgs or 0,
            max_buffered_bytes=args.max_buffered_bytes or 0,
        )
        create_group(api, args.stream, args.group, config)
    elif action == "delete":
        for removed in delete_group(api, args.stream, args.group):
            print(f"deleted {removed}")
        print(f"deleted group {args.group!r} on stream {args.stream!r}")
        return 0
    elif action in ("add", "drop"):
        members = tuple(args.members or ())
        change_members(api, args.stream, args.group, **{action: members})
    elif action == "map":
        change_members(api, args.stream, args.group, mappings=_mappings(args.map or ()))
    elif action == "step-down":
        api.conn.require(GROUPS)
        step_down(api, args.stream, args.group, args.member, args.members)
        print(f"unpinned member {args.member!r}: its reader lost the pin")
        return 0
    _print_group(api, args.stream, args.group)
    return 0


def commits_command(args: argparse.Namespace) -> int:
    conn, prefix, bucket = _api(args).conn, args.progress_subject, args.bucket
    if prefix:
        found, drop = progress_markers(conn, prefix), lambda query_id: forget_progress(conn, prefix, query_id)
    else:
        found, drop = markers(conn, bucket), lambda query_id: forget(conn, bucket, query_id)
    if args.action == "list":
        print(f"{'query id':<40}{'batch':>10}  last written")
        for marker in found:
            print(f"{marker.query_id:<40}{marker.batch_id:>10}  {marker.written.isoformat(timespec='seconds')}")
        return 0
    if args.query_id:
        gone = [marker for marker in found if marker.query_id in set(args.query_id)]
    else:
        since = datetime.now(UTC) - timedelta(seconds=parse_duration(args.older_than))
        gone = [marker for marker in found if marker.written < since]
    for marker in gone:
        drop(marker.query_id)
        print(
            f"forgot query {marker.query_id} (batch {marker.batch_id}, {marker.written.isoformat(timespec='seconds')})"
        )
    return 0


def rights_command(args: argparse.Namespace) -> int:
    if args.group and not args.consumers and not args.batch:
        print("--group needs --consumers: the member consumers' names (`spark-jetstream status` lists them)")
        return 2
    needed = read_rights(
        args.stream,
        consumers=args.consumers,
        group=args.group,
        direct=not args.pull,
        streaming=not args.batch,
        workqueue=args.workqueue,
        create=not args.no_create,
        api_prefix=args.api_prefix,
        inbox_prefix=args.inbox_prefix,
        subjects=args.subjects,
    )
    print(needed.conf())
    return 0


def status_command(args: argparse.Namespace) -> int:
    api = _api(args)
    rows = status(api, args.stream, args.group, args.members)
    header = (
        f"{'member':<12}{'consumer':<24}{'partitions':<16}{'pinned':<26}{'ack floor':>10}{'pending':>10}{'lag':>10}"
    )
    print(header)
    for row in rows:
        parts = ",".join(map(str, row.partitions)) or "all"
        print(
            f"{row.member:<12}{row.consumer:<24}{parts:<16}{row.pinned:<26}{row.ack_floor:>10}{row.pending:>10}{row.lag:>10}"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spark-jetstream", description=__doc__)
    parser.add_argument("--version", action="version", version=f"spark-jetstream {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "demo", help="stream order events from JetStream through Spark into parquet, with live progress, and check them"
    )
    run.add_argument("--messages", type=int, default=200_000, help="orders to publish (default 200000)")
    run.add_argument("--rate", type=int, default=20_000, help="orders per second (default 20000; 0: flat out)")
    run.add_argument("--max-per-batch", type=int, default=25_000, help="maxMessagesPerTrigger (default 25000)")
    run.add_argument("--partitions", type=int, default=4, help="stream partitions = Spark partitions (default 4)")
    run.add_argument("--stream", default="demo_orders", help="stream name (default demo_orders)")
    run.add_argument("--servers", help="use this NATS server (URLs) instead of starting an embedded one")
    run.add_argument("--creds", help="NATS credentials file for --servers")
    run.add_argument("--out", help="directory for the parquet output, checkpoint and plot (default: a new temp dir)")
    run.add_argument("--keep", action="store_true", help="keep the stream afterwards")
    run.set_defaults(func=demo_command)

    group = commands.add_parser("group", help="create, inspect and change consumer groups (pcgroups-compatible)")
    actions = group.add_subparsers(dest="action", required=True)
    for action, text in (
        ("create", "create a static or elastic group"),
        ("info", "show a group's config and member partitions"),
        ("list", "list the groups of a stream"),
        ("delete", "delete a group: its config and member consumers or work stream (derived: the member consumers)"),
        ("add", "add members to an elastic group"),
        ("drop", "drop members from an elastic group"),
        ("map", "set an elastic group's member mappings"),
        ("step-down", "unpin a member's consumer"),
    ):
        sub = actions.add_parser(action, help=text)
        _connection_args(sub)
        sub.add_argument("--stream", required=True, help="the stream")
        if action != "list":
            sub.add_argument("--group", required=True, help="the group's name")
        if action == "create":
            sub.add_argument("--kind", choices=("static", "elastic"), default="static", help="the group's kind")
            sub.add_argument("--max-members", type=int, required=True, help="the number of partitions")
            sub.add_argument(
                "--filter", action="append", help="subject filter (elastic: 'orders.*:1' hashes wildcard 1)"
            )
            sub.add_argument("--max-buffered-msgs", type=int, help="elastic: the work stream's max_msgs")
            sub.add_argument("--max-buffered-bytes", type=int, help="elastic: the work stream's max_bytes")
        if action in ("create", "add", "drop"):
            sub.add_argument("--members", nargs="+", help="member names")
        if action in ("create", "map"):
            sub.add_argument("--map", nargs="+", help="explicit mappings, e.g. alice:0,1 bob:2,3")
        if action == "step-down":
            sub.add_argument("--member", required=True)
            _members_arg(sub)
        sub.set_defaults(func=group_command)

    commits = commands.add_parser(
        "commits", help="list or remove writers' commit markers (commitBucket, or progressSubject's progress markers)"
    )
    verbs = commits.add_subparsers(dest="action", required=True)
    for action, text in (
        ("list", "each query's last committed batch, oldest first"),
        ("forget", "remove the markers of queries that will not run again (their keys go too)"),
    ):
        sub = verbs.add_parser(action, help=text)
        _connection_args(sub)
        where = sub.add_mutually_exclusive_group()
        where.add_argument("--bucket", default="spark-jetstream-commits", help="the commitBucket option's value")
        where.add_argument(
            "--progress-subject", help="the progressSubject option's value: the progress markers in the target stream"
        )
        if action == "forget":
            which = sub.add_mutually_exclusive_group(required=True)
            which.add_argument("--query-id", nargs="+", help="the queries' (or batch writes') ids, as listed")
            which.add_argument("--older-than", help="every marker not written for this long, e.g. 30d")
        sub.set_defaults(func=commits_command)

    rights = commands.add_parser("rights", help="print the NATS permissions a read needs, and nothing more")
    rights.add_argument("--stream", required=True, help="the stream")
    rights.add_argument("--group", help="the group a streaming read holds")
    rights.add_argument(
        "--consumers", nargs="+", default=(), help="the group's member consumers (e.g. spark-orders-0 spark-orders-1)"
    )
    rights.add_argument("--pull", action="store_true", help="readMode=pull (no Direct Get)")
    rights.add_argument("--batch", action="store_true", help="a batch read (spark.read), not a streaming one")
    rights.add_argument("--workqueue", action="store_true", help="the stream has WorkQueue retention")
    rights.add_argument(
        "--no-create", action="store_true", help="the member consumers are made by another user: read them as they are"
    )
    rights.add_argument("--inbox-prefix", default="_INBOX", help="the inboxPrefix option (default _INBOX)")
    rights.add_argument("--api-prefix", default="$JS.API", help="$JS.<domain>.API, or an imported API's prefix")
    rights.add_argument("--subjects", nargs="+", default=(), help="the stream's subjects, for an idle query to wait on")
    rights.set_defaults(func=rights_command)

    show = commands.add_parser("status", help="per member: partitions, pin holder, ack floor, pending and lag")
    _connection_args(show)
    show.add_argument("--stream", required=True, help="the stream")
    show.add_argument("--group", required=True, help="the group's name")
    _members_arg(show)
    show.set_defaults(func=status_command)
    return parser


def cli_markdown() -> str:
    """The command line's reference page (docs/reference/cli.md, between its markers), from ``build_parser()``:
    one section per command, a table of its flags; the connection flags, the same on every command, once."""
    connection = {option.attr for option in CONNECTION_OPTIONS}
    lines = ["## Connection flags", "", "`group ...` and `status` take these (as the options of the same name):", ""]
    status_flags = {action.dest for action in _sub(build_parser(), "status")._actions}
    lines += _flags_table(_sub(build_parser(), "status"), status_flags - connection)
    for name, command in _commands(build_parser()):
        text = _help_of(command[1])
        lines += ["", f"## `spark-jetstream {name}`", "", text[:1].upper() + text[1:] + ".", ""]
        takes = connection <= {action.dest for action in command[0]._actions}
        if takes:
            lines += ["The connection flags, and:", ""]
        lines += _flags_table(command[0], connection if takes else set())
    return "\n".join(lines)


def _sub(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (choices,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return choices.choices[name]


Command = tuple[str, tuple[argparse.ArgumentParser, str]]


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[Command]:
    """(``group create``, (its parser, its help)) for every leaf command, in the parser's order."""
    found: list[Command] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                inner = _commands(sub, f"{prefix}{name} ")
                found += inner or [(f"{prefix}{name}", (sub, helps[name]))]
    return found


def _help_of(text: str) -> str:
    return text.replace("%%", "%")


def _flags_table(parser: argparse.ArgumentParser, skip: set[str]) -> list[str]:
    """A table of ``parser``'s flags but those whose ``dest`` is in ``skip``."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help" or action.dest in skip:
            continue
        flag = max(action.option_strings, key=len)
        if action.nargs == "+":
            flag += f" {(action.metavar or action.dest).upper()} ..."
        elif action.metavar:
            flag += f" {action.metavar}"
        if action.choices:
            flag += " {" + ",".join(action.choices) + "}"
        default = "required" if action.required else "-" if action.default in (None, False, ()) else str(action.default)
        meaning = _help_of(action.help or "").replace("|", "\\|")
        rows.append(f"| `{flag}` | {default} | {meaning} |")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except JetStreamError as exc:
        print(f"error: {redact(str(exc), _secrets(args))}", file=sys.stderr)  # belt and braces
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
