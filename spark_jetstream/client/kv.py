"""KV buckets: pcgroups' group configs and the streaming writer's commit markers.

Entries are read from the bucket's leader through the API's retry layer (``STREAM.MSG.GET``: a value
just written is seen, which nats-py's KV ``get`` does not promise when a replica answers its Direct
Get). Buckets are made with nats-py's KV (its bucket config); entries are written by ``write_entry``, which reaches
a bucket in another JetStream domain too.
"""

from __future__ import annotations

import json

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import APIError
from nats.js.kv import KeyValue

from spark_jetstream.client import messages
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.client.messages import DirectMessage
from spark_jetstream.errors import ApiError, StreamNotFoundError


def get_entry(api: JetStreamApi, bucket: str, key: str) -> DirectMessage | None:
    """``get_entry_async`` from sync code."""
    return api.conn.run(get_entry_async(api, bucket, key))


async def get_entry_async(api: JetStreamApi, bucket: str, key: str) -> DirectMessage | None:
    """The live entry under ``key``: None when the bucket, the key or its value (deleted, purged) is missing."""
    try:
        entry = await messages.last_message_async(api, f"KV_{bucket}", f"$KV.{bucket}.{key}")
    except StreamNotFoundError:
        return None
    if entry is None or entry.headers.get("KV-Operation") in ("DEL", "PURGE"):
        return None
    return entry


WRONG_LAST_SEQUENCE = 10071


async def write_entry(api: JetStreamApi, bucket: str, key: str, value: bytes | None, last: int | None = None) -> int:
    """Write ``key`` of ``bucket`` (``value`` None: delete it) as nats-py's KV does, but to ``kv_prefix`` (another
    JetStream domain's bucket is reached there, nats-py writes to the local one), and return the new revision.
    ``last``: only while the key's last revision is that one; 0: only while the key has no live value (a deleted or
    purged key is created again, as KV ``create`` does). A write refused so raises ``ApiError`` with the server's
    ``err_code`` 10071."""
    headers = {"KV-Operation": "DEL"} if value is None else {}
    if last is not None:
        headers["Nats-Expected-Last-Subject-Sequence"] = str(last)
    subject = f"{api.conn.options.kv_prefix(bucket)}{key}"
    reply = await api.conn.client.request(
        subject, value or b"", timeout=api.conn.options.request_timeout, headers=headers or None
    )
    ack = json.loads(reply.data)
    error = ack.get("error")
    if error is None:
        return int(ack["seq"])
    if error.get("err_code") == WRONG_LAST_SEQUENCE and last == 0:
        gone = await messages.last_message_async(api, f"KV_{bucket}", f"$KV.{bucket}.{key}")
        if gone is not None and gone.headers.get("KV-Operation") in ("DEL", "PURGE"):
            return await write_entry(api, bucket, key, value, gone.seq)
    raise ApiError(
        f"Writing key {key!r} of KV bucket {bucket!r}: {error.get('description')} (error {error.get('err_code')})",
        error.get("code") or 0,
        error.get("err_code") or 0,
    )


async def key_value(
    api: JetStreamApi, bucket: str, *, create: bool, replicas: int = 1, description: str = "", direct: bool = False
) -> KeyValue | None:
    """nats-py's handle on ``bucket``; a missing bucket is made (``create``) or None. Whether it exists is asked
    through the API's retry layer, so a leader election reads as a wait, not as a missing bucket."""
    try:
        await api.call_async(("STREAM", "INFO", f"KV_{bucket}"), None, f"KV bucket {bucket!r}", f"KV_{bucket}")
        missing = False
    except StreamNotFoundError:
        if not create:
            return None
        missing = True
    js = api.conn.client.jetstream(prefix=api.conn.options.api_prefix)
    config = KeyValueConfig(
        bucket=bucket, replicas=replicas, storage=StorageType.FILE, description=description or None, direct=direct
    )
    try:  # two processes may both make a missing bucket: the same config a second time succeeds
        return await js.create_key_value(config) if missing else await js.key_value(bucket)
    except APIError as exc:
        raise ApiError(
            f"KV bucket {bucket!r}: {exc.description} (error {exc.err_code})", exc.code or 0, exc.err_code or 0
        ) from None
