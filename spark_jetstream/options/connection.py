"""The connection options: which servers, whose credentials, how long to wait. Every mode takes them (``ALL``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spark_jetstream.client.connection_options import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SERVERS,
    DEFAULT_SILENCE_TIMEOUT,
)
from spark_jetstream.options.option import ALL, Option
from spark_jetstream.options.parsers import (
    parse_api_prefix,
    parse_duration,
    parse_inbox_prefix,
    parse_servers,
    parse_text,
)


def _connection(name: str, parse: Callable[[str], Any], default: Any, doc: str, **extra: Any) -> Option:
    return Option(name, parse, default, doc, ALL, "connection", **extra)


CONNECTION: tuple[Option, ...] = (
    _connection("servers", parse_servers, DEFAULT_SERVERS, "Comma-separated NATS server URLs."),
    _connection("creds", parse_text, None, "Path of a NATS credentials file (JWT and nkey seed)."),
    _connection("nkey", parse_text, None, "Path of a file holding an nkey seed."),
    _connection("token", parse_text, None, "Authentication token.", secret=True),
    _connection("user", parse_text, None, "User name (with `password`)."),
    _connection("password", parse_text, None, "Password (with `user`).", secret=True),
    _connection("tls.ca", parse_text, None, "Path of the CA certificate that signed the server's certificate."),
    _connection("tls.cert", parse_text, None, "Path of the client certificate for mutual TLS (with `tls.key`)."),
    _connection("tls.key", parse_text, None, "Path of the client private key for mutual TLS."),
    _connection(
        "credsSecret",
        parse_text,
        None,
        "The text of a NATS credentials file (e.g. `dbutils.secrets.get(...)`), instead of `creds`: never written "
        "to disk, hidden in plans, progress, logs and errors.",
        secret=True,
    ),
    _connection("nkeySecret", parse_text, None, "An nkey seed (`SU...`) as text, instead of `nkey`.", secret=True),
    _connection(
        "tls.keySecret",
        parse_text,
        None,
        "The client private key for mutual TLS as PEM text, instead of `tls.key` (handed to OpenSSL through an "
        "in-memory file, never written to disk; Linux).",
        secret=True,
    ),
    _connection(
        "domain",
        parse_text,
        None,
        "JetStream domain, when the stream or bucket lives in another domain (a leaf node's): API requests go to "
        "`$JS.<domain>.API`, and KV writes and commit markers to `$JS.<domain>.API.$KV...`, as nats.go writes.",
    ),
    _connection(
        "apiPrefix",
        parse_api_prefix,
        None,
        "JetStream API prefix of a stream shared from another account, as this account imports that account's "
        "`$JS.API.>` (e.g. `JS.OWNER.API`); instead of `domain` (docs: Security guide).",
        attr="api_import",
    ),
    _connection(
        "inboxPrefix",
        parse_inbox_prefix,
        None,
        "The subject prefix replies come to (default `_INBOX`), e.g. `_INBOX.spark-team`: the NATS user then needs "
        "`subscribe` on `<prefix>.>` only, not on every client's `_INBOX.>` (Security).",
        attr="inbox_prefix",
    ),
    _connection(
        "connectTimeout",
        parse_duration,
        DEFAULT_CONNECT_TIMEOUT,
        "How long to try to reach a server before failing (e.g. `5s`).",
        minimum=0.1,
    ),
    _connection(
        "requestTimeout",
        parse_duration,
        DEFAULT_REQUEST_TIMEOUT,
        "How long a read, write or JetStream API request is waited for and asked again before the task or query "
        "fails (Kafka's `default.api.timeout.ms`): a server short of CPU, or working off a backlog, answers late, "
        "and a whole cluster restarted answers nothing for tens of seconds. A connection leaves a server that sends "
        "nothing after `silenceTimeout` and asks the others meanwhile.",
        minimum=1.0,
    ),
    _connection(
        "silenceTimeout",
        parse_duration,
        DEFAULT_SILENCE_TIMEOUT,
        "How long a connected server may send nothing, though pinged, before the connection moves to another of "
        "`servers` (a frozen server or a network partition sends no reset). Lower notices such a server sooner; "
        "too low for a server that stalls for seconds under load moves connections needlessly (each move asks "
        "again for what was in flight, exactly once).",
        minimum=0.3,
    ),
)
