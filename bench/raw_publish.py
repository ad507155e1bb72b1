"""The raw pipelined publisher: the baseline of writes.

``raw_publish`` is a minimal raw-protocol publisher on a blocking socket (no nats-py): ``PUB`` commands written
in chunks, up to ``window`` messages ahead of their PubAcks, every PubAck read and checked. With ``ids`` it sends a
``Nats-Msg-Id`` header per message (what exactly-once costs the server: it keeps every id of the duplicate
window), shaped like the Spark writer's (``<32 hex digits>:<partition>:<row>``, see ``writer_ids``) so both store
the same bytes. Messages go to the 1,024 subjects ``bench.k<i % 1024>``.
"""

from __future__ import annotations

import os
import uuid

from common import SUBJECTS, RawSocket


def writer_ids() -> str:
    """A msg id prefix as long as the Spark writer's for a batch write (``<save id>:<partition>:``)."""
    return f"{uuid.uuid4().hex}:0:"


def raw_publish(address: tuple[str, int], count: int, size: int, window: int, ids: str | None) -> int:
    """Publish ``count`` messages pipelined on a raw socket (msg ids ``<ids><i>`` unless ``ids`` is None).

    Returns the PubAcks that said stored."""
    raw = RawSocket(address)
    try:
        raw.handshake()
        sock, buf = raw.sock, raw.buf
        inbox = b"_INBOX.wbench"
        sock.sendall(b"SUB " + inbox + b".* 1\r\n")
        payload = os.urandom(size)
        subjects = [f"bench.k{k}".encode() for k in range(SUBJECTS)]
        chunk = max(1, window // 2)
        sent = acked = 0
        while acked < count:
            if sent < count and sent - acked <= window - chunk:
                commands = []
                for i in range(sent, min(count, sent + chunk)):
                    reply = b"%s.%d" % (inbox, i)
                    if ids is None:
                        commands.append(b"PUB %s %s %d\r\n%s\r\n" % (subjects[i % SUBJECTS], reply, size, payload))
                    else:
                        header = b"NATS/1.0\r\nNats-Msg-Id: %s%d\r\n\r\n" % (ids.encode(), i)
                        total = len(header) + size
                        commands.append(
                            b"HPUB %s %s %d %d\r\n%s%s\r\n"
                            % (subjects[i % SUBJECTS], reply, len(header), total, header, payload)
                        )
                sock.sendall(b"".join(commands))
                sent += len(commands)
                continue
            pos = raw.pos
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                raw.fill()
                continue
            if buf.startswith(b"MSG ", pos) or buf.startswith(b"HMSG ", pos):
                parts = buf[pos:eol].split()
                start = eol + 2
                end = start + int(parts[-1])
                if len(buf) < end + 2:
                    raw.fill()
                    continue
                raw.pos = end + 2
                if parts[0] == b"HMSG" or b'"error"' in buf[start:end]:
                    raise RuntimeError(f"publish failed: {bytes(buf[start:end])[:200]!r}")
                acked += 1
            elif buf.startswith(b"PING", pos):
                raw.pos = eol + 2
                sock.sendall(b"PONG\r\n")
            elif buf.startswith(b"-ERR", pos):
                raise ConnectionError(bytes(buf[pos:eol]).decode(errors="replace"))
            else:
                raw.pos = eol + 2
        return acked
    finally:
        raw.close()
