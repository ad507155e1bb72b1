"""The ``spark-jetstream`` command line: ``demo`` (more subcommands join as features land).

The CLI only parses arguments, prints, and calls the library.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack

from . import __version__
from .connection import ConnectionOptions, close_all, connect
from .embedded import EmbeddedServer
from .errors import JetStreamError, StreamNotFoundError
from .group_admin import change_members, create_group, delete_group, group_layout, load_group, status, step_down
from .groups import (
    ELASTIC_BUCKET,
    STATIC_BUCKET,
    GroupConfig,
    PartitioningFilter,
    member_consumer_config,
    member_consumer_name,
    partition_filters,
    partitioned_stream_config,
)
from .jsapi import JetStreamApi
from .publish import Message, publish_all
from .pull import MemberRange, PullSettings, read_member


class Progress:
    """One status line, redrawn in place on a terminal and printed every few seconds otherwise."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total = label, total
        self.started = self.last_print = time.monotonic()
        self.tty = sys.stdout.isatty()

    def update(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last_print < (0.2 if self.tty else 5.0):
            return
        self.last_print = now
        rate = done / max(now - self.started, 1e-9)
        line = f"  {self.label}: {done:>10,} / {self.total:,}  ({rate:,.0f} msg/s)"
        if self.tty:
            print("\r" + line, end="\n" if final else "", flush=True)
        else:
            print(line, flush=True)


def _orders(count: int, subject_prefix: str, seed: int = 1) -> Iterator[Message]:
    """Realistic order events: JSON payloads, one subject per customer, a few headers."""
    rng = random.Random(seed)
    for index in range(count):
        customer = f"c{rng.randrange(5000):04d}"
        order = {
            "order_id": index,
            "customer": customer,
            "sku": f"sku-{rng.randrange(300)}",
            "quantity": rng.randrange(1, 5),
            "price": round(rng.uniform(1, 200), 2),
        }
        headers = {"content-type": "application/json", "source": "demo"}
        yield f"{subject_prefix}.{customer}", json.dumps(order).encode(), headers


def demo(args: argparse.Namespace) -> int:
    """Start (or use) a server, publish orders to a partitioned stream, read every member back."""
    with ExitStack() as stack:
        if args.servers:
            servers = args.servers
        else:
            print("Starting an embedded nats-server with a temporary store ...")
            server = stack.enter_context(EmbeddedServer(name="demo"))
            servers = server.url
            print(f"  nats-server {server.url} (pid {server.pid})")
        stack.callback(close_all)
        conn = connect(ConnectionOptions.parse({"servers": servers}))
        api = JetStreamApi(conn)
        stream, group, partitions = args.stream, "demo", args.partitions
        print(f"Creating stream {stream!r} with {partitions} partitions and group {group!r} ...")
        try:
            api.stream_info(stream)
        except StreamNotFoundError:
            pass
        else:
            raise JetStreamError(f"Stream {stream!r} already exists on {conn.server_url}: pick another with --stream.")
        api.create_stream(partitioned_stream_config(stream, "orders.*", partitions))
        for p in range(partitions):
            api.create_consumer(stream, member_consumer_config(group, str(p), partition_filters([p])))

        progress = Progress("published", args.messages)
        published = 0

        def counted() -> Iterator[Message]:
            nonlocal published
            for message in _orders(args.messages, "orders"):
                published += 1
                if published % 1000 == 0:
                    progress.update(published)
                yield message

        result = publish_all(conn, counted())
        progress.update(result.count, final=True)
        last_seq = api.stream_info(stream)["state"]["last_seq"]

        print(f"Reading every member through the pinned pull reader, range (0, {last_seq}] ...")
        progress = Progress("read", result.count)
        read, per_member = 0, {}
        for p in range(partitions):
            member = MemberRange(stream, member_consumer_name(group, str(p)), 0, last_seq)
            rows = 0
            for batch in read_member(conn, member, PullSettings()):
                rows += batch.num_rows
                progress.update(read + rows)
            per_member[p] = rows
            read += rows
        progress.update(read, final=True)

        print(f"\n  {'member consumer':<18}{'rows':>10}{'ack floor':>11}")
        floors_untouched = True
        for p, rows in per_member.items():
            name = member_consumer_name(group, str(p))
            floor = api.consumer_info(stream, name)["ack_floor"]["stream_seq"]
            floors_untouched &= floor == 0
            print(f"  {name:<18}{rows:>10,}{floor:>11}")
        ok = read == result.count and floors_untouched
        print(f"  {'total':<18}{read:>10,}")
        print(
            f"\n{'OK' if ok else 'MISMATCH'}: published {result.count:,}, read {read:,}; "
            f"reading acked nothing (ack floors {'all 0' if floors_untouched else 'moved!'})."
        )
        if not args.keep:
            api.delete_stream(stream)
        return 0 if ok else 1


def _connection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--servers", default="nats://127.0.0.1:4222", help="NATS server URLs, comma-separated")
    for name in ("creds", "nkey", "token", "user", "password", "tls-ca", "tls-cert", "tls-key", "domain"):
        parser.add_argument(f"--{name}", help=f"the {name.replace('-', '.')} connection option")


def _api(args: argparse.Namespace) -> JetStreamApi:
    raw = {"servers": args.servers}
    for name in ("creds", "nkey", "token", "user", "password", "tls_ca", "tls_cert", "tls_key", "domain"):
        if getattr(args, name, None):
            raw[name.replace("_", ".")] = getattr(args, name)
    return JetStreamApi(connect(ConnectionOptions.parse(raw)))


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
        found = []
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
        delete_group(api, args.stream, args.group)
        print(f"deleted group {args.group!r} on stream {args.stream!r}")
        return 0
    elif action in ("add", "drop"):
        members = tuple(args.members or ())
        change_members(api, args.stream, args.group, **{action: members})
    elif action == "map":
        change_members(api, args.stream, args.group, mappings=_mappings(args.map or ()))
    elif action == "step-down":
        step_down(api, args.stream, args.group, args.member)
        print(f"unpinned member {args.member!r}: its reader lost the pin")
        return 0
    _print_group(api, args.stream, args.group)
    return 0


def status_command(args: argparse.Namespace) -> int:
    api = _api(args)
    rows = status(api, args.stream, args.group)
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
    run = commands.add_parser("demo", help="publish a data set to a partitioned stream and read it back")
    run.add_argument("--messages", type=int, default=200_000, help="orders to publish (default 200000)")
    run.add_argument("--partitions", type=int, default=4, help="partitions and members (default 4)")
    run.add_argument("--stream", default="demo_orders", help="stream name (default demo_orders)")
    run.add_argument("--servers", help="use this NATS server instead of starting an embedded one")
    run.add_argument("--keep", action="store_true", help="keep the stream afterwards")
    run.set_defaults(func=demo)

    group = commands.add_parser("group", help="create, inspect and change consumer groups (pcgroups-compatible)")
    actions = group.add_subparsers(dest="action", required=True)
    for action, text in (
        ("create", "create a static or elastic group"),
        ("info", "show a group's config and member partitions"),
        ("list", "list the groups of a stream"),
        ("delete", "delete a group (and its member consumers or work stream)"),
        ("add", "add members to an elastic group"),
        ("drop", "drop members from an elastic group"),
        ("map", "set an elastic group's member mappings"),
        ("step-down", "unpin a member's consumer"),
    ):
        sub = actions.add_parser(action, help=text)
        _connection_args(sub)
        sub.add_argument("--stream", required=True)
        if action != "list":
            sub.add_argument("--group", required=True)
        if action == "create":
            sub.add_argument("--kind", choices=("static", "elastic"), default="static")
            sub.add_argument("--max-members", type=int, required=True, help="the number of partitions")
            sub.add_argument(
                "--filter", action="append", help="subject filter (elastic: 'orders.*:1' hashes wildcard 1)"
            )
            sub.add_argument("--max-buffered-msgs", type=int)
            sub.add_argument("--max-buffered-bytes", type=int)
        if action in ("create", "add", "drop"):
            sub.add_argument("--members", nargs="+", help="member names")
        if action in ("create", "map"):
            sub.add_argument("--map", nargs="+", help="explicit mappings, e.g. alice:0,1 bob:2,3")
        if action == "step-down":
            sub.add_argument("--member", required=True)
        sub.set_defaults(func=group_command)

    show = commands.add_parser("status", help="per member: partitions, pin holder, ack floor, pending and lag")
    _connection_args(show)
    show.add_argument("--stream", required=True)
    show.add_argument("--group", required=True)
    show.set_defaults(func=status_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except JetStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
