"""Where nats-server spends its CPU in a multi-batch streaming read, against the raw Direct Get loop of the same
shape: a CPU profile of the server (its ``prof_port``) through each read, read here without Go's tools.

``--messages`` x 100 B on an 8-partition stream of 1,024 subjects; each read is a ``trigger(availableNow=True)``
streaming query into ``noop`` in ``--batches`` micro-batches (``maxMessagesPerTrigger``), or a raw loop
(``raw_direct``, 2 processes). For each: the server's CPU seconds in the profile, the share spent counting pending
messages (``fileStore.NumPending``, by caller: a batched Direct Get, a consumer RESET), and the top functions.

    python bench/server_profile.py [--messages 200000] [--batches 8] [--top 8]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import re
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

from raw_direct import run_direct_parallel

from spark_jetstream.client.connection import ConnectionOptions, connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.publish import publish_all
from spark_jetstream.groups.layout import partition_filters, partitioned_stream_config
from spark_jetstream.testing import EmbeddedServer

PARTITIONS = 8
PROFILE_SECONDS = 40
"""Each read's profile lasts this long (the slowest read here takes about 25 s on 2 cores)."""


def _profile(port: int, seconds: int, into: list[bytes]) -> None:
    url = f"http://127.0.0.1:{port}/debug/pprof/profile?seconds={seconds}"
    into.append(urllib.request.urlopen(url, timeout=seconds + 60).read())


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _fields(data: bytes) -> Iterator[tuple[int, int, object]]:
    """A protobuf message's (field, wire type, value): varints as ints, the rest as bytes."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            yield field, wire, value
        elif wire == 2:
            size, at = _varint(data, at)
            yield field, wire, data[at : at + size]
            at += size
        else:  # fixed64 / fixed32: pprof has none we read
            width = 8 if wire == 1 else 4
            yield field, wire, data[at : at + width]
            at += width


def _ints(value: object) -> list[int]:
    if isinstance(value, int):
        return [value]
    out, at = [], 0
    while at < len(value):  # type: ignore[arg-type]
        number, at = _varint(value, at)  # type: ignore[arg-type]
        out.append(number)
    return out


def stacks(profile: bytes) -> list[tuple[list[str], int]]:
    """Each sample of a pprof CPU profile: its stack of function names (innermost first) and its nanoseconds."""
    strings: list[str] = []
    samples: list[tuple[list[int], list[int]]] = []
    locations: dict[int, list[int]] = {}
    functions: dict[int, int] = {}
    for field, _, value in _fields(gzip.decompress(profile)):
        assert isinstance(value, (bytes, int))
        if field == 6:
            strings.append(bytes(value).decode(errors="replace"))  # type: ignore[arg-type]
        elif field == 2:
            ids: list[int] = []
            values: list[int] = []
            for f, _, v in _fields(value):  # type: ignore[arg-type]
                (ids if f == 1 else values if f == 2 else []).extend(_ints(v))
            samples.append((ids, values))
        elif field == 4:
            fields = dict((f, v) for f, _, v in _fields(value) if f == 1)  # type: ignore[arg-type]
            lines = [v for f, _, v in _fields(value) if f == 4]  # type: ignore[arg-type]
            called = [next((x for g, _, x in _fields(line) if g == 1), 0) for line in lines]  # type: ignore[arg-type]
            locations[int(fields.get(1, 0))] = list(reversed(called))  # type: ignore[arg-type]
        elif field == 5:
            fields = dict((f, v) for f, _, v in _fields(value))  # type: ignore[arg-type]
            functions[int(fields.get(1, 0))] = int(fields.get(2, 0))  # type: ignore[arg-type]
    out = []
    for ids, values in samples:
        names = [strings[functions[f]] for location in ids for f in locations.get(location, [])]
        out.append((names, values[-1]))
    return out


def short(name: str) -> str:
    """``github.com/nats-io/nats-server/v2/server.(*fileStore).NumPending`` -> ``(*fileStore).NumPending``; a generic
    type's shape left out."""
    name = re.sub(r"\[go\.shape\.[^\]]*\]", "", name).split("/")[-1]
    return name.split(".", 1)[1] if name.startswith("server.") else name


def report(what: str, profile: bytes, top: int) -> None:
    samples = stacks(profile)
    total = sum(ns for _, ns in samples) or 1
    flat: collections.Counter[str] = collections.Counter()
    pending: collections.Counter[str] = collections.Counter()
    for names, ns in samples:
        if names:
            flat[short(names[0])] += ns
        counted = [short(n) for n in names]
        if "(*fileStore).NumPending" not in counted:
            continue
        if "(*stream).getDirectRequest" in counted:
            pending["a batched Direct Get"] += ns
        elif "(*consumer).processResetReq" in counted:
            pending["a consumer RESET"] += ns
        else:
            pending["other callers"] += ns
    shares = ", ".join(f"{by} {100 * ns / total:.1f}%" for by, ns in pending.most_common()) or "none"
    print(f"\n{what}: server CPU {total / 1e9:.2f} s; counting pending messages: {shares}")
    for name, ns in flat.most_common(top):
        print(f"  {100 * ns / total:5.1f}%  {name[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    prof_port = probe.getsockname()[1]
    probe.close()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    with EmbeddedServer({"prof_port": prof_port}, name="profile") as server:
        options = ConnectionOptions(servers=(server.url,))
        api = JetStreamApi(connect(options))
        api.create_stream({**partitioned_stream_config("SHAPES", "ev.*", PARTITIONS), "allow_direct": True})
        payload = os.urandom(100)
        publish_all(api.conn, ((f"ev.k{i % 1024}", payload, None) for i in range(args.messages)))
        address = ("127.0.0.1", int(server.url.rsplit(":", 1)[1]))

        def raw(filters: list[str], last: int | None = None) -> Callable[[], None]:
            def read() -> None:
                assert run_direct_parallel(address, "SHAPES", filters, last)[1] == args.messages

            return read

        def streaming(**extra: str) -> Callable[[], None]:
            def read() -> None:
                per = str(-(-args.messages // args.batches))
                reader = spark.readStream.format("jetstream").options(servers=server.url, stream="SHAPES", **extra)
                query = (
                    reader.option("maxMessagesPerTrigger", per)
                    .load()
                    .writeStream.format("noop")
                    .option("checkpointLocation", tempfile.mkdtemp(prefix="profile-"))
                    .trigger(availableNow=True)
                    .start()
                )
                query.awaitTermination()
                assert sum(p["numInputRows"] for p in query.recentProgress) == args.messages

            return read

        reads = {
            "raw Direct Get, the 8 partition filters": raw(partition_filters(range(PARTITIONS))),
            f"streaming, group, default, {args.batches} batches": streaming(group="g"),
            f"streaming, no group, default, {args.batches} batches": streaming(),
            "raw Direct Get, '>' in 2 slices": raw([">", ">"], args.messages),
            f"streaming, group, preservePartitionOrder=false, {args.batches} batches": streaming(
                group="whole",
                preservePartitionOrder="false",  # a group of its own: "g" is at the end
            ),
        }
        raw(partition_filters(range(PARTITIONS)))()  # warm the server's caches and the raw loop's processes
        streaming(group="warm-up")()  # and Spark: a session's first query takes twice as long
        for what, read in reads.items():
            got: list[bytes] = []
            fetch = threading.Thread(target=_profile, args=(prof_port, PROFILE_SECONDS, got))
            fetch.start()
            time.sleep(0.5)  # the profile has started
            began = time.monotonic()
            read()
            took = time.monotonic() - began
            fetch.join()  # the rest of the profile's time is idle: it adds next to nothing
            print(f"\n{what}: read in {took:.1f} s")
            report(what, got[0], args.top)
        disconnect(options)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
