"""Which path reads a stream (option ``readMode``): Direct Get or consumers, chosen once when a read is planned.

``direct`` needs batched Direct Get (nats-server 2.11+), the stream to allow Direct Get (``allow_direct``) and the
NATS user to be allowed to publish to ``$JS.API.DIRECT.GET.<stream>``; ``auto`` (the default) takes Direct Get where
all three hold and consumers otherwise;
``pull`` always reads through consumers. An explicit ``direct`` that cannot work fails here, naming the option and
the fix; ``auto`` says once in the log which path reads and why.
"""

from __future__ import annotations

import logging
from typing import Any

from spark_jetstream.client import messages
from spark_jetstream.client.features import BATCHED_DIRECT_GET
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.errors import OptionError

log = logging.getLogger(__name__)

AUTO, DIRECT, PULL = "auto", "direct", "pull"


def choose_read_mode(api: JetStreamApi, stream: str, stream_config: dict[str, Any], wanted: str, what: str) -> str:
    """``DIRECT`` or ``PULL`` for reading ``stream`` (whose config is ``stream_config``) as option ``readMode``
    (``wanted``) asks; ``what`` names the read in the log ("batch read", "query on group 'g'")."""
    if wanted == PULL:
        log.info("The %s reads stream %r by pulling from consumers (readMode=pull)", what, stream)
        return PULL
    if not api.conn.supports(BATCHED_DIRECT_GET):
        if wanted == DIRECT:
            api.conn.require(BATCHED_DIRECT_GET, ", or set readMode to auto or pull to read through consumers")
        log.warning(
            "The NATS server has no batched Direct Get (nats-server %s+): the %s reads stream %r through consumers "
            "(readMode=auto).",
            BATCHED_DIRECT_GET.shown_since,
            what,
            stream,
        )
        return PULL
    if not stream_config.get("allow_direct"):
        if wanted == DIRECT:
            raise OptionError(
                f"readMode=direct, but stream {stream!r} does not allow Direct Get: enable it with "
                f"`nats stream edit {stream} --allow-direct`, or set readMode to auto or pull to read through "
                "consumers."
            )
        log.warning(
            "Stream %r does not allow Direct Get: the %s reads it by pulling from consumers (readMode=auto). "
            "`nats stream edit %s --allow-direct` lets it use Direct Get.",
            stream,
            what,
            stream,
        )
        return PULL
    if not messages.may_direct_get(api, stream):
        subject = api.subject("DIRECT", "GET", stream)
        if wanted == DIRECT:
            raise OptionError(
                f"readMode=direct, but the NATS user may not use Direct Get on stream {stream!r} (the server refused "
                f"a publish to {subject}: a permissions violation): allow the user to publish to {subject}, or set "
                "readMode to auto or pull to read through consumers."
            )
        log.warning(
            "The NATS user may not use Direct Get on stream %r (a permissions violation for publish to %s): the %s "
            "reads it by pulling from consumers (readMode=auto).",
            stream,
            subject,
            what,
        )
        return PULL
    log.info("The %s reads stream %r with Direct Get (readMode=%s)", what, stream, wanted)
    return DIRECT
