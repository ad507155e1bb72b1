"""``JetStreamAdmin``: streams and consumer groups from Python (a notebook, a script, a test), as the
``spark-jetstream`` command line handles them. Public as ``spark_jetstream.JetStreamAdmin``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from spark_jetstream.client.connection import connect, disconnect
from spark_jetstream.client.jsapi import JetStreamApi
from spark_jetstream.groups.admin import MemberStatus, create_group, delete_group, status
from spark_jetstream.groups.layout import GroupConfig, partitioned_stream_config
from spark_jetstream.options import parse_connection_options


class JetStreamAdmin:
    """Streams and consumer groups on the NATS servers the connection options name (the same options as
    ``format("jetstream")``'s, e.g. ``{"servers": "nats://localhost:4222", "creds": "/path/user.creds"}``).

    Use it as a context manager, or call ``close()``. Errors are the package's (``spark_jetstream.ApiError``,
    ``StreamNotFoundError``, ``GroupConfigError``, ...)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._options = parse_connection_options(options)
        connect(self._options)  # fails here on a server it cannot reach

    @property
    def _api(self) -> JetStreamApi:
        return JetStreamApi(connect(self._options))  # the process's connection for these options, open again if closed

    def create_stream(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Create a stream from its JetStream config (the JSON of ``nats stream add --config``, as a dict); the
        server's answer (``config`` and ``state``). Creating one that exists with the same config changes nothing."""
        return self._api.create_stream(dict(config))

    def create_partitioned_stream(self, name: str, subject: str, partitions: int, **config: Any) -> dict[str, Any]:
        """Create a stream that stores ``subject`` (with at least one ``*``) as ``<p>.<subject>``, ``p`` a hash of
        the ``*`` tokens modulo ``partitions`` (the layout consumer groups read), with Direct Get allowed; ``config``
        adds to or overrides its JetStream config (e.g. ``num_replicas=3``)."""
        return self._api.create_stream(partitioned_stream_config(name, subject, partitions, **config))

    def stream_info(self, name: str) -> dict[str, Any]:
        """The stream's ``config`` and ``state`` (``state["messages"]``, ``first_seq``, ``last_seq``, ...)."""
        return self._api.stream_info(name)

    def delete_stream(self, name: str) -> None:
        """Delete the stream, with its messages and consumers."""
        self._api.delete_stream(name)

    def create_group(self, stream: str, group: str, members: Iterable[str], max_members: int) -> dict[str, list[int]]:
        """Create a static consumer group on a partitioned stream (``max_members``: its number of partitions), as
        ``spark-jetstream group create`` does; the partitions of each member."""
        config = GroupConfig(kind="static", max_members=max_members, members=tuple(members))
        return create_group(self._api, stream, group, config).mapping()

    def group_status(self, stream: str, group: str, members: int | None = None) -> list[MemberStatus]:
        """Per member, as ``spark-jetstream status`` shows it: ``member``, ``consumer``, ``partitions``, ``pinned``,
        ``ack_floor`` (the stream sequence the group has committed up to), ``pending`` and ``lag``. ``members``: of a
        group without a stored config, how many members its queries were given (default: as many as they made)."""
        return status(self._api, stream, group, members)

    def delete_group(self, stream: str, group: str) -> list[str]:
        """Delete a group: its stored config and member consumers (or, of a group without a stored config, the member
        consumers a query made); what was removed, by name."""
        return delete_group(self._api, stream, group)

    def close(self) -> None:
        """Close the connection (a later call opens it again)."""
        disconnect(self._options)

    def __enter__(self) -> JetStreamAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
