"""What each nats-server version can carry, asked of the server a connection is on.

Every use needs nats-server 2.10 or newer (the oldest release tested: ephemeral consumers with
``filter_subjects``, ``STREAM.MSG.GET`` with ``next_by_subj``, pulls with ``max_bytes`` and heartbeats,
``Nats-Msg-Id`` and KV buckets all work there). Some features need more, refused at the start of the read that needs
them with the feature, the server's version and the version needed (decision 0019, which has what each release
answered), or done another way:

- a message by time (``STREAM.MSG.GET`` with ``start_time``): 2.11. 2.10 ignores ``start_time`` and answers the
  stream's first message; there the leader's messages are searched by seq (``read.start.seq_at``).

- batched Direct Get (``batch`` in a ``DIRECT.GET`` request): 2.11. A 2.10 server ignores ``batch`` and answers
  one message without an end-of-batch status, so reads there go through consumers.
- atomic batch publish (the exactly-once writer's progress markers): 2.12. Without it the writer works as on any
  stream without ``allow_atomic``, and says so once.
- consumer groups (priority-group pins, UNPIN and consumer RESET): 2.14.5. 2.10 creates a ``pinned_client``
  consumer without the pin (it drops the fields it does not know), 2.11-2.12 have no RESET, and before 2.14.5 a
  non-JSON pull could crash a server with priority-group consumers.

In a cluster the version checked is that of the server the connection is on, and where a call is served by an
asset's leader (consumer RESET and pins, atomic batches) that leader's too: during a rolling upgrade a connection to a
new server reaches leaders on old ones (``leader_version``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from spark_jetstream.errors import ServerTooOldError

Version = tuple[int, int, int]


@dataclass(frozen=True)
class Feature:
    """A server feature and the first nats-server release that has it."""

    name: str
    since: Version

    @property
    def shown_since(self) -> str:
        return shown(self.since)


def shown(version: Version) -> str:
    """``2.11`` for 2.11.0, ``2.14.5``."""
    major, minor, patch = version
    return f"{major}.{minor}" + (f".{patch}" if patch else "")


ANY_USE = Feature("spark-jetstream", (2, 10, 0))
MESSAGE_BY_TIME = Feature("STREAM.MSG.GET by start_time", (2, 11, 0))
BATCHED_DIRECT_GET = Feature("batched Direct Get", (2, 11, 0))
ATOMIC_BATCHES = Feature("atomic batch publish", (2, 12, 0))
GROUPS = Feature("consumer groups (priority-group pins and consumer RESET)", (2, 14, 5))


def leader_version(info: dict[str, Any]) -> Version:
    """The version of the server that answered a stream's or consumer's info, its leader: the ``_nats.ver`` servers
    since 2.11 add to an asset's metadata; 2.10 (or older, ``shown`` as 2.10) without it."""
    shown = ((info.get("config") or {}).get("metadata") or {}).get("_nats.ver", "")
    numbers = re.match(r"(\d+)\.(\d+)\.(\d+)", shown)
    return (int(numbers[1]), int(numbers[2]), int(numbers[3])) if numbers else (2, 10, 0)


def supports(version: Version, feature: Feature) -> bool:
    return version >= feature.since


def require(version: Version, shown: str, where: str, feature: Feature, fix: str) -> None:
    """Raise ``ServerTooOldError`` unless the server (at ``where``, version ``shown``) has ``feature``; ``fix`` is
    the sentence that says what to do besides upgrading."""
    if supports(version, feature):
        return
    raise ServerTooOldError(
        f"The NATS server at {where} runs version {shown}, but {feature.name} requires nats-server "
        f"{feature.shown_since} or newer: upgrade the server{fix}."
    )
