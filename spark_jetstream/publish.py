"""Pipelined JetStream publishing: many messages in flight, every PubAck checked.

Publishing one message and awaiting its PubAck caps out near 18k msg/s; core publishes without
acks can be dropped by a busy server. This sends up to ``window`` messages before waiting, with
one wildcard reply subscription whose raw handler matches PubAcks by token, and fails on the
first error with the subject and the server's reason.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from .connection import Connection
from .errors import JetStreamError

Message = tuple[str, bytes, dict[str, str] | None]
"""(subject, payload, headers or None)."""


class PublishError(JetStreamError):
    """A message was not stored: the message names the subject and the server's reason."""


@dataclass
class PublishResult:
    """What a pipelined publish stored."""

    count: int = 0
    duplicates: int = 0
    first_seq: int = 0
    last_seq: int = 0
    streams: set[str] = field(default_factory=set)


def publish_all(
    conn: Connection, messages: Iterable[Message], window: int = 2000, timeout: float = 30.0
) -> PublishResult:
    """Publish every message with acks pipelined ``window`` deep; raise ``PublishError`` on any failure."""
    return conn.run(_publish_all(conn, messages, window, timeout))


async def _publish_all(conn: Connection, messages: Iterable[Message], window: int, timeout: float) -> PublishResult:
    client = conn.client
    prefix = client.new_inbox()
    in_flight: dict[bytes, str] = {}
    result = PublishResult()
    failures: list[str] = []
    room = asyncio.Event()
    room.set()

    def on_ack(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        sent_to = in_flight.pop(subject[len(prefix) + 1 :], "?")
        if headers and headers.startswith(b"NATS/1.0 "):
            status = headers[9:].split(b"\r\n", 1)[0].decode(errors="replace")
            hint = " (no stream captures this subject)" if status.startswith("503") else ""
            failures.append(f"publish to {sent_to!r} failed: {status}{hint}")
        else:
            ack = json.loads(data)
            if "error" in ack:
                failures.append(f"publish to {sent_to!r} failed: {ack['error'].get('description')}")
            else:
                result.count += 1
                result.duplicates += bool(ack.get("duplicate"))
                result.first_seq = result.first_seq or ack["seq"]
                result.last_seq = max(result.last_seq, ack["seq"])
                result.streams.add(ack["stream"])
        if len(in_flight) < window // 2 or failures:
            room.set()

    _, sid = await conn.subscribe_raw(on_ack, f"{prefix}.*")
    try:
        for index, (subject, payload, headers) in enumerate(messages):
            if len(in_flight) >= window:
                room.clear()
                await asyncio.wait_for(room.wait(), timeout)
            if failures:
                break
            token = str(index).encode()
            in_flight[token] = subject
            await client.publish(subject, payload, reply=f"{prefix}.{index}", headers=headers)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while in_flight and not failures:
            if loop.time() > deadline:
                raise PublishError(f"{len(in_flight)} publishes got no PubAck within {timeout:g}s.")
            room.clear()
            await asyncio.wait_for(room.wait(), max(0.01, deadline - loop.time()))
    except TimeoutError:
        raise PublishError(f"{len(in_flight)} publishes got no PubAck within {timeout:g}s.") from None
    finally:
        await conn.unsubscribe_raw(sid)
    if failures:
        raise PublishError(f"{failures[0]} ({len(failures)} failed in all).")
    return result
