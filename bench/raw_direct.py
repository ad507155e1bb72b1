"""The raw-protocol Direct Get loop: the baseline of reads that use Direct Get.

``raw_direct`` is the simplest loop on a blocking TCP socket (no nats-py): one Direct Get batch request
(``seq``, ``next_by_subj``, ``batch``, ``max_bytes`` ``MAX_BYTES``: without it the server answers up to its
client buffer, 64 MiB, and a reply that size closes the connection as a slow consumer) at a time, reading
each reply's ``Nats-Sequence`` and the end-of-batch status and nothing else.
``run_direct_parallel`` reads one filter subject per spawned process, ``processes()`` at once (as many as Spark's
master runs tasks at once).
"""

from __future__ import annotations

import json
import multiprocessing
import time

from common import RawSocket, processes
from raw_pull import _worker_ready

BATCH = 10_000
MAX_BYTES = 16 * 1024 * 1024
_SEQUENCE = b"Nats-Sequence: "
_STATUS = b"NATS/1.0 "


def raw_direct(
    address: tuple[str, int], stream: str, subject: str, after: int = 0, end: int | None = None
) -> tuple[int, int]:
    """Read every message of ``subject`` in ``(after, end]`` (``end`` None: to the stream's end); return (messages,
    payload bytes)."""
    raw = RawSocket(address)
    try:
        raw.handshake()
        sock, buf = raw.sock, raw.buf
        inbox = f"_INBOX.rawdirect.{subject.replace('>', 'all').replace('*', 'any')}.{after}".encode()  # one each
        sock.sendall(b"SUB " + inbox + b" 1\r\n")
        api = f"$JS.API.DIRECT.GET.{stream}".encode()
        count = nbytes = 0
        seq = after
        while end is None or seq < end:
            wanted = BATCH if end is None else min(BATCH, end - seq)
            request = {"seq": seq + 1, "next_by_subj": subject, "batch": wanted, "max_bytes": MAX_BYTES}
            body = json.dumps(request).encode()
            sock.sendall(b"PUB %s %s %d\r\n%s\r\n" % (api, inbox, len(body), body))
            pending = None
            while True:  # the replies of this request, up to its end-of-batch status
                pos = raw.pos
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    raw.fill()
                    continue
                if buf.startswith(b"HMSG ", pos):
                    parts = buf[pos:eol].split()  # HMSG <subject> <sid> <header size> <total size>
                    header_size, total = int(parts[-2]), int(parts[-1])
                    start = eol + 2
                    if len(buf) < start + total + 2:
                        raw.fill()
                        continue
                    raw.pos = start + total + 2
                    if buf.startswith(_STATUS, start) and buf[start + 9 : start + 10].isdigit():
                        found = buf.find(b"Nats-Num-Pending: ", start, start + header_size)
                        if found >= 0:
                            pending = int(buf[found + 18 : buf.find(b"\r\n", found)])
                        break  # 204 EOB, or 404: nothing (more) matches
                    at = buf.find(_SEQUENCE, start, start + header_size) + len(_SEQUENCE)
                    seq = int(buf[at : buf.find(b"\r\n", at)])
                    if end is None or seq <= end:
                        count += 1
                        nbytes += total - header_size
                elif buf.startswith(b"PING", pos):
                    raw.pos = eol + 2
                    sock.sendall(b"PONG\r\n")
                elif buf.startswith(b"-ERR", pos):
                    raise ConnectionError(bytes(buf[pos:eol]).decode(errors="replace"))
                else:  # +OK, PONG, INFO
                    raw.pos = eol + 2
            if not pending:
                return count, nbytes
        return count, nbytes
    finally:
        raw.close()


def _read(job: tuple[tuple[str, int], str, str, int, int | None]) -> tuple[int, int]:
    return raw_direct(*job)


def run_direct_parallel(
    address: tuple[str, int], stream: str, subjects: list[str], last: int | None = None
) -> tuple[float, int, int]:
    """``raw_direct`` of each subject in ``processes()`` spawned processes; return (seconds, messages, bytes).
    With ``last`` (the stream's last seq), ``subjects`` are read in as many contiguous seq slices of ``(0, last]``
    instead, one each. Process start is not timed."""
    if last is None:
        jobs = [(address, stream, subject, 0, None) for subject in subjects]
    else:
        ends = [last * (index + 1) // len(subjects) for index in range(len(subjects))]
        jobs = [(address, stream, s, low, high) for s, low, high in zip(subjects, [0, *ends], ends, strict=False)]
    workers = min(processes(), len(jobs))
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for _ in range(20):  # every worker up and done importing before the clock starts
            if len(set(pool.map(_worker_ready, range(workers), chunksize=1))) == workers:
                break
        began = time.perf_counter()
        results = pool.map(_read, jobs, chunksize=1)
        seconds = time.perf_counter() - began
    return seconds, sum(c for c, _ in results), sum(b for _, b in results)
