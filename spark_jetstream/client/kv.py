"""KV buckets: pcgroups' group configs and the streaming writer's commit markers.

Entries are read from the bucket's leader through the API's retry layer (``STREAM.MSG.GET``: a value
just written is seen, which nats-py's KV ``get`` does not promise when a replica answers its Direct
Get). Buckets are made with nats-py's KV (its bucket config), and the group admin writes through it.
"""

from __future__ import annotations

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
