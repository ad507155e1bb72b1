"""Every option: its name, type, default and documentation, defined once.

Spark hands options over as strings in a case-insensitive map. ``parse_options`` turns them into
typed values, refusing unknown names (suggesting the closest valid one) and malformed values
(naming the option and the expected form). The README's option table is generated from these
definitions, so code and docs cannot drift apart.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .errors import OptionError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``"500ms"``, ``"5s"``, ``"2m"``, ``"1h"`` or a bare number of seconds -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError("expected a duration such as 500ms, 5s, 2m or 1h")
    unit = match.group(2).lower() if match.group(2) else None
    return float(match.group(1)) * _DURATION_UNITS[unit]


def parse_int(text: str) -> int:
    try:
        return int(text.strip().replace("_", ""))
    except ValueError:
        raise ValueError("expected a whole number") from None


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError("expected true or false")


def parse_text(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def parse_servers(text: str) -> tuple[str, ...]:
    """A comma-separated list of ``nats://host:port`` (``host:port`` and ``tls://`` also accepted)."""
    servers = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        url = entry if "://" in entry else f"nats://{entry}"
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{entry!r} has a malformed port") from None
        if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname:
            raise ValueError(f"{entry!r} is not a server URL such as nats://host:4222")
        if port is None and parts.scheme in ("nats", "tls"):
            url = f"{url.rstrip('/')}:4222"
        servers.append(url)
    if not servers:
        raise ValueError("name at least one server, e.g. nats://localhost:4222")
    return tuple(servers)


@dataclass(frozen=True)
class Option:
    """One user-facing option."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    secret: bool = False
    minimum: float | None = None

    def convert(self, raw: str) -> Any:
        shown = "<hidden>" if self.secret else repr(raw)
        try:
            value = self.parse(raw)
        except ValueError as exc:
            raise OptionError(f"Option {self.name!r} has an invalid value {shown}: {exc}.") from None
        if self.minimum is not None and value < self.minimum:
            raise OptionError(
                f"Option {self.name!r} has an invalid value {shown}: it must be at least {self.minimum:g}."
            )
        return value


CONNECTION_OPTIONS: tuple[Option, ...] = (
    Option("servers", parse_servers, ("nats://127.0.0.1:4222",), "Comma-separated NATS server URLs."),
    Option("creds", parse_text, None, "Path of a NATS credentials file (JWT and nkey seed)."),
    Option("nkey", parse_text, None, "Path of a file holding an nkey seed."),
    Option("token", parse_text, None, "Authentication token.", secret=True),
    Option("user", parse_text, None, "User name (with `password`)."),
    Option("password", parse_text, None, "Password (with `user`).", secret=True),
    Option("tls.ca", parse_text, None, "Path of the CA certificate that signed the server's certificate."),
    Option("tls.cert", parse_text, None, "Path of the client certificate for mutual TLS (with `tls.key`)."),
    Option("tls.key", parse_text, None, "Path of the client private key for mutual TLS."),
    Option("domain", parse_text, None, "JetStream domain, when the stream lives in another domain."),
    Option(
        "connectTimeout",
        parse_duration,
        5.0,
        "How long to try to reach a server before failing (e.g. `5s`).",
        minimum=0.1,
    ),
)

PULL_OPTIONS: tuple[Option, ...] = (
    Option("pullBatchSize", parse_int, 1000, "Messages asked for by one pull request.", minimum=1),
    Option("pullsInFlight", parse_int, 4, "Pull requests kept outstanding per member.", minimum=1),
    Option(
        "pullExpires",
        parse_duration,
        5.0,
        "How long one pull request may wait at the server; keep it well under half the "
        "consumer's `priority_timeout`.",
        minimum=0.1,
    ),
    Option(
        "pullIdleHeartbeat",
        parse_duration,
        1.0,
        "Server heartbeat interval while a pull waits; at most half of `pullExpires`.",
        minimum=0.05,
    ),
    Option("recordBatchSize", parse_int, 10_000, "Rows per Arrow record batch handed to Spark.", minimum=1),
)


def parse_options(raw: Mapping[str, str], allowed: Iterable[Option]) -> dict[str, Any]:
    """Check names against ``allowed`` (case-insensitively, as Spark does) and convert values."""
    by_lower = {option.name.lower(): option for option in allowed}
    values = {option.name: option.default for option in by_lower.values()}
    for key, raw_value in raw.items():
        option = by_lower.get(key.lower())
        if option is None:
            names = [option.name for option in by_lower.values()]
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.5) or difflib.get_close_matches(
                key.lower(), list(by_lower), n=1, cutoff=0.5
            )
            hint = f" Did you mean {by_lower[close[0].lower()].name!r}?" if close else ""
            raise OptionError(f"Unknown option {key!r}.{hint} Valid options: {', '.join(sorted(names))}.")
        values[option.name] = option.convert(str(raw_value))
    return values
