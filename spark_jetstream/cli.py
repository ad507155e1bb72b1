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
from .groups import member_consumer_config, member_consumer_name, partition_filters, partitioned_stream_config
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
