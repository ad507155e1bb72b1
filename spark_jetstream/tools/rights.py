"""The NATS permissions a read needs, and nothing more: what the docs list, what ``spark-jetstream rights`` prints, and
what the least-privilege tests give their users.

A JetStream API subject names the stream and the consumer, so the rights name them too: a consumer name is one subject
token, and a wildcard inside a token (``spark-orders-*``) matches nothing, so member consumers are listed one by one.
Replies come to ``inboxPrefix`` (``_INBOX`` by default): with a prefix of its own, the user receives no other user's
replies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spark_jetstream.groups.layout import ELASTIC_BUCKET, STATIC_BUCKET
from spark_jetstream.streaming.ownership import owner_subject


@dataclass(frozen=True)
class Rights:
    """A NATS user's permissions, as a server's ``authorization`` block takes them."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False

    def permissions(self) -> dict[str, object]:
        """The ``permissions`` of a user in a server config (JSON, or the conf format)."""
        shown: dict[str, object] = {
            "publish": {"allow": list(self.publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }
        if self.allow_responses:
            shown["allow_responses"] = True
        return shown

    def conf(self) -> str:
        """The permissions as nats-server's conf file writes them."""

        def listed(subjects: tuple[str, ...]) -> str:
            return ",\n".join(f'      "{subject}"' for subject in subjects)

        lines = [
            "permissions: {",
            f"  publish: {{allow: [\n{listed(self.publish)}\n  ]}}",
            f"  subscribe: {{allow: [\n{listed(self.subscribe)}\n  ]}}",
        ]
        if self.allow_responses:
            lines.append("  allow_responses: true")
        return "\n".join([*lines, "}"])


def read_rights(
    stream: str,
    *,
    consumers: Sequence[str] = (),
    group: str | None = None,
    direct: bool = True,
    streaming: bool = True,
    workqueue: bool = False,
    create: bool = True,
    api_prefix: str = "$JS.API",
    inbox_prefix: str = "_INBOX",
    subjects: Sequence[str] = (),
) -> Rights:
    """What a read of ``stream`` needs.

    ``group``: a streaming read of that group, whose member ``consumers`` it creates, checks, pins and moves (a batch
    read with a group reads like one without, after looking the group's config up). ``direct``: the tasks read with
    Direct Get; otherwise each task reads through a consumer of its own (any name: ``CONSUMER.CREATE.<stream>.*``;
    deleting it is left to the server when ``CONSUMER.DELETE`` is not given). ``subjects``: the stream's subjects, for
    an idle streaming query to wait on (optional: without them it asks for stream info every ``idleInterval``).
    ``create``: the group's reader may create and update its member consumers; without, it reads them as a user who
    may made them (the query refuses them if they differ from what its options need).
    """
    api = f"{api_prefix}."
    publish = [f"{api}INFO", f"{api}STREAM.INFO.{stream}", f"{api}STREAM.MSG.GET.{stream}"]
    subscribe = [f"{inbox_prefix}.>"]
    if direct:
        publish.append(f"{api}DIRECT.GET.{stream}")
    if group is not None:  # the group's config, where pcgroups keeps it
        publish.append(f"{api}STREAM.NAMES")
        for bucket in (STATIC_BUCKET, ELASTIC_BUCKET):
            publish += [f"{api}STREAM.INFO.KV_{bucket}", f"{api}STREAM.MSG.GET.KV_{bucket}"]
    if group is not None and streaming:
        publish.append(f"{api}CONSUMER.NAMES.{stream}")
        for consumer in consumers:
            if create:
                publish += [f"{api}CONSUMER.CREATE.{stream}.{consumer}", f"{api}CONSUMER.CREATE.{stream}.{consumer}.>"]
            publish += [f"{api}CONSUMER.{verb}.{stream}.{consumer}" for verb in ("INFO", "UNPIN", "RESET", "MSG.NEXT")]
        if workqueue:
            publish.append(f"{api}STREAM.PURGE.{stream}")
        owner = owner_subject(api_prefix, stream, group)
        publish.append(owner)
        subscribe.append(owner)
        # optional: a write to the group's config is seen at once (else looked for every 30 s)
        subscribe += [f"$KV.{bucket}.{stream}.{group}" for bucket in (STATIC_BUCKET, ELASTIC_BUCKET)]
    elif not direct:
        publish += [f"{api}CONSUMER.CREATE.{stream}.*", f"{api}CONSUMER.CREATE.{stream}.*.>"]
        publish.append(f"{api}CONSUMER.MSG.NEXT.{stream}.*")
    if streaming:
        subscribe += subjects
    return Rights(tuple(publish), tuple(subscribe), allow_responses=group is not None and streaming)
