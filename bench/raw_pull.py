"""The raw-protocol pull loop: the baseline the connector's reads are measured against.

``raw_drain`` is the simplest pull loop on a blocking TCP socket (no nats-py): one
``CONSUMER.MSG.NEXT`` request of ``BATCH`` messages at a time, carrying the pin id once known,
parsing each message's ack reply subject for its seq and pending count and nothing else. The
``run_baseline_*`` functions drain a group's member consumers with it after an untimed UNPIN and
RESET to seq 1, in ``processes()`` spawned processes (as many as Spark's master runs tasks at once) or in this one.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time

from common import STREAM, RawSocket, processes

from spark_jetstream.client.connection import Connection
from spark_jetstream.client.jsapi import PRIORITY_GROUP, JetStreamApi

BATCH = 1000
EXPIRES_NS = 5_000_000_000
INBOX = b"_INBOX.bench"
ACK_PREFIX = b"$JS.ACK."
STATUS_4XX = b"NATS/1.0 4"
PIN_HEADER = b"Nats-Pin-Id:"


def raw_drain(
    address: tuple[str, int],
    stream: str,
    consumer: str,
    inbox: bytes = INBOX,
    max_bytes: int | None = None,
    last: int | None = None,
) -> int:
    """Pull every message of a freshly reset pinned consumer (or, with ``last``, of an ephemeral one without a
    priority group up to stream seq ``last``); return how many arrived.

    Drains running at the same time need distinct ``inbox`` subjects: every connection
    subscribed to a subject gets every message published to it. ``max_bytes`` bounds each pull (large
    messages: a pull of ``BATCH`` of them would exceed what the server buffers for a client); each pull
    then ends with a status.
    """
    raw = RawSocket(address)
    try:
        raw.handshake()
        sock, buf = raw.sock, raw.buf
        sock.sendall(b"SUB " + inbox + b" 1\r\n")
        next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}".encode()
        pin_id: str | None = None
        count = 0
        last_seq = 0
        done = False
        while not done:
            request: dict[str, object] = {"batch": BATCH, "expires": EXPIRES_NS}
            if last is None:
                request["group"] = PRIORITY_GROUP
            if max_bytes is not None:
                request["max_bytes"] = max_bytes
            if pin_id is not None:
                request["id"] = pin_id
            body = json.dumps(request).encode()
            sock.sendall(b"PUB %s %s %d\r\n%s\r\n" % (next_subject, inbox, len(body), body))
            in_batch = 0
            batch_over = False
            while not batch_over:
                pos = raw.pos
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    raw.fill()  # in place: `buf` stays the same bytearray
                    continue
                if buf.startswith(b"HMSG ", pos) or buf.startswith(b"MSG ", pos):
                    # HMSG <subject> <sid> [reply] <hdr_len> <total_len> / MSG <subject> <sid> [reply] <len>
                    parts = buf[pos:eol].split()
                    has_headers = parts[0] == b"HMSG"
                    reply = parts[3] if len(parts) == (6 if has_headers else 5) else b""
                    hdr_len = int(parts[-2]) if has_headers else 0
                    start = eol + 2
                    end = start + int(parts[-1])
                    if len(buf) < end + 2:
                        raw.fill()
                        continue
                    raw.pos = end + 2
                    if reply.startswith(ACK_PREFIX):
                        # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
                        tokens = reply.split(b".")
                        last_seq = int(tokens[5])
                        count += 1
                        in_batch += 1
                        if pin_id is None and hdr_len:
                            at = buf.find(PIN_HEADER, start, start + hdr_len)
                            if at >= 0:
                                value_end = buf.find(b"\r\n", at)
                                pin_id = buf[at + len(PIN_HEADER) : value_end].strip().decode()
                        if tokens[8] == b"0" or (last is not None and last_seq >= last):
                            done = batch_over = True
                        elif in_batch == BATCH and max_bytes is None:  # with max_bytes a status ends every pull
                            batch_over = True
                    elif hdr_len and buf.startswith(STATUS_4XX, start):
                        batch_over = True
                elif buf.startswith(b"PING", pos):
                    raw.pos = eol + 2
                    sock.sendall(b"PONG\r\n")
                elif buf.startswith(b"-ERR", pos):
                    raise ConnectionError(bytes(buf[pos:eol]).decode(errors="replace"))
                else:  # +OK, PONG, async INFO
                    raw.pos = eol + 2
        if last_seq <= 0:
            raise RuntimeError(f"{consumer}: no stream sequence seen")
        return count
    finally:
        raw.close()


def _worker_ready(_: int) -> int:
    time.sleep(0.3)
    return os.getpid()


def drain(address: tuple[str, int], consumer: str, stream: str = STREAM, max_bytes: int | None = None) -> int:
    """``raw_drain`` on an inbox of its own: concurrent drains on one shared inbox see each other's messages."""
    return raw_drain(address, stream, consumer, b"%s.%d.%s" % (INBOX, os.getpid(), consumer.encode()), max_bytes)


def _drain(job: tuple[tuple[str, int], str, str, int | None]) -> tuple[str, int, float]:
    address, consumer, stream, max_bytes = job
    began = time.perf_counter()
    count = drain(address, consumer, stream, max_bytes)
    return consumer, count, time.perf_counter() - began


def _drain_slice(job: tuple[tuple[str, int], str, str, int]) -> int:
    address, consumer, stream, last = job
    return raw_drain(address, stream, consumer, b"%s.%d.%s" % (INBOX, os.getpid(), consumer.encode()), None, last)


def run_slices_parallel(
    address: tuple[str, int], stream: str, consumers: list[str], lasts: list[int]
) -> tuple[float, int]:
    """Drain ephemeral consumers (no priority group), each up to its stream seq in ``lasts``, in ``processes()``
    spawned processes: the raw loop of reads cut in seq slices through consumers. Process start not timed."""
    workers = min(processes(), len(consumers))
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for _ in range(20):
            if len(set(pool.map(_worker_ready, range(workers), chunksize=1))) == workers:
                break
        began = time.perf_counter()
        counts = pool.map(_drain_slice, [(address, c, stream, last) for c, last in zip(consumers, lasts, strict=True)])
        seconds = time.perf_counter() - began
    return seconds, sum(counts)


def reset_members(conn: Connection, consumers: list[str], stream: str = STREAM) -> int:
    """UNPIN and RESET every member to seq 1; return the messages now pending on them."""
    api = JetStreamApi(conn)
    pending = 0
    for consumer in consumers:
        conn.run(api.unpin(stream, consumer))
        pending += conn.run(api.reset(stream, consumer, 1))["num_pending"]
    return pending


def run_baseline_parallel(
    conn: Connection,
    address: tuple[str, int],
    consumers: list[str],
    expected: int,
    stream: str = STREAM,
    max_bytes: int | None = None,
) -> tuple[float, int]:
    """Drain the members with ``raw_drain`` in ``processes()`` spawned processes; resets and process start not
    timed."""
    workers = min(processes(), len(consumers))
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for _ in range(20):  # every worker up and done importing before the clock starts
            if len(set(pool.map(_worker_ready, range(workers), chunksize=1))) == workers:
                break
        if reset_members(conn, consumers, stream) != expected:
            raise SystemExit("FAILED: the member consumers do not hold every message after RESET to seq 1")
        began = time.perf_counter()
        results = pool.map(_drain, [(address, c, stream, max_bytes) for c in consumers], chunksize=1)
        seconds = time.perf_counter() - began
    return seconds, sum(count for _, count, _ in results)


def run_baseline_sequential(conn: Connection, address: tuple[str, int], consumers: list[str]) -> tuple[float, int]:
    """Drain the members one after the other in this process; the resets are not timed."""
    reset_members(conn, consumers)
    began = time.perf_counter()
    total = sum(drain(address, consumer) for consumer in consumers)
    return time.perf_counter() - began, total
