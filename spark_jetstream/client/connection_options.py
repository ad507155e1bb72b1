"""Where and how to connect: ``ConnectionOptions``, the connection cache's key, and its defaults.

The client layer needs it without the option table: the defaults live here and
``options/connection.py`` shows them (``servers``, ``connectTimeout``); ``options.connection_options``
builds one from parsed option values.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from urllib.parse import urlsplit

from spark_jetstream.errors import redact

DEFAULT_SERVERS = ("nats://127.0.0.1:4222",)
DEFAULT_CONNECT_TIMEOUT = 5.0
"""Seconds to try to reach a server before failing."""
DEFAULT_REQUEST_TIMEOUT = 60.0
"""Seconds a request is waited for and asked again before the task or query fails: Kafka's ``default.api.timeout.ms``.
A server starved of CPU or working off a backlog answers late, not never, and a whole cluster restarted answers
nothing for tens of seconds (decision 0043)."""
DEFAULT_SILENCE_TIMEOUT = 3.0
"""Seconds a connected server may send nothing, though pinged, before the connection moves to another server: a
frozen server or a silent partition sends no reset, and a JetStream cluster elects new leaders in 2-5 s."""


@dataclass(frozen=True)
class ConnectionOptions:
    """Where and how to connect. Hashable: it is the connection cache key. Secrets stay out of repr."""

    servers: tuple[str, ...] = DEFAULT_SERVERS
    creds: str | None = None
    nkey: str | None = None
    token: str | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    creds_secret: str | None = field(default=None, repr=False)
    nkey_secret: str | None = field(default=None, repr=False)
    tls_key_secret: str | None = field(default=None, repr=False)
    domain: str | None = None
    api_import: str | None = None
    """The prefix an imported JetStream API is reached under (option ``apiPrefix``)."""
    inbox_prefix: str | None = None
    """Where replies come to (option ``inboxPrefix``; None: nats-py's ``_INBOX``)."""
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    silence_timeout: float = DEFAULT_SILENCE_TIMEOUT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return redact(f"ConnectionOptions({shown})")

    @property
    def api_prefix(self) -> str:
        """Where the JetStream API answers: an imported API's prefix, a domain's, or this account's own."""
        if self.api_import:
            return self.api_import
        return f"$JS.{self.domain}.API" if self.domain else "$JS.API"

    def kv_prefix(self, bucket: str) -> str:
        """What a write to a key of ``bucket`` publishes to, before the key: ``$KV.<bucket>.``, or in another JetStream
        domain ``$JS.<domain>.API.$KV.<bucket>.``, which that domain's servers map to its ``$KV.>`` (as nats.go
        writes): a bare ``$KV`` subject would go to a same-named bucket of the local domain, or to none."""
        return f"{self.api_prefix}.$KV.{bucket}." if self.domain else f"$KV.{bucket}."

    def stored_subject(self, subject: str) -> str:
        """The subject a stream stores a message published to ``subject`` under (``kv_prefix``'s domain part off)."""
        prefix = f"{self.api_prefix}."
        return subject[len(prefix) :] if self.domain and subject.startswith(f"{prefix}$KV.") else subject

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret values, for redacting messages that might quote them."""
        return tuple(
            value
            for value in (self.token, self.password, self.creds_secret, self.nkey_secret, self.tls_key_secret)
            if value
        )

    @property
    def shown_servers(self) -> str:
        """The servers option as messages show it: any password or token in a URL is ``***``."""
        return redact(", ".join(self.servers))

    @property
    def wants_tls(self) -> bool:
        """TLS was asked for (a ``tls://`` or ``wss://`` URL, or any ``tls.*`` option): never connect without it."""
        tls_urls = any(urlsplit(url).scheme in ("tls", "wss") for url in self.servers)
        return tls_urls or any((self.tls_ca, self.tls_cert, self.tls_key, self.tls_key_secret))

    def describe_auth(self) -> str:
        """Which authentication is configured, without any secret."""
        in_url = [urlsplit(url) for url in self.servers]
        kinds = [
            name
            for name, value in (
                ("creds", self.creds),
                ("credsSecret", self.creds_secret),
                ("nkey", self.nkey),
                ("nkeySecret", self.nkey_secret),
                ("token", self.token),
                ("user/password", self.user),
                ("user/password in the servers URL", any(u.password is not None for u in in_url)),
                ("token in the servers URL", any(u.username and u.password is None for u in in_url)),
            )
            if value
        ]
        return ", ".join(kinds) or "no credentials"
