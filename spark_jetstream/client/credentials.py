"""What a connection presents and why one failed: the TLS context, the credentials checked as text before
connecting (a secret is never quoted), and one sentence from the errors of a failed connect that names the option
to fix."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

from nats.errors import AuthorizationError
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError

from spark_jetstream.client.connection_options import ConnectionOptions
from spark_jetstream.errors import ConnectError


class TlsNotOfferedError(NatsError):
    """The server offered no TLS although TLS was asked for: nothing (no credential) was sent to it."""


def tls_context(options: ConnectionOptions) -> ssl.SSLContext | None:
    if not options.wants_tls:
        return None
    if bool(options.tls_cert) != bool(options.tls_key or options.tls_key_secret):
        raise ConnectError("Set both tls.cert and tls.key (or tls.keySecret) for mutual TLS, or neither.")
    try:
        context = ssl.create_default_context(cafile=options.tls_ca)
        if options.tls_cert and options.tls_key_secret:
            with _in_memory_file(options.tls_key_secret, "tls.keySecret") as key:
                context.load_cert_chain(options.tls_cert, key)
        elif options.tls_cert:
            context.load_cert_chain(options.tls_cert, options.tls_key)
    except (OSError, ssl.SSLError) as exc:
        which = "tls.keySecret" if options.tls_key_secret else "tls.key"
        raise ConnectError(f"Cannot load the TLS files named by tls.ca/tls.cert/{which}: {exc}.") from None
    return context


@contextlib.contextmanager
def _in_memory_file(text: str, option: str) -> Iterator[str]:
    """A path OpenSSL can read ``text`` from that is no file on disk: an anonymous in-memory file (Linux
    ``memfd_create``) named through ``/proc/self/fd`` (Python's ssl loads keys from paths only)."""
    if not hasattr(os, "memfd_create"):
        raise ConnectError(f"Option {option!r} needs Linux (an in-memory file for OpenSSL): use tls.key, a path.")
    fd = os.memfd_create("spark-jetstream-key", os.MFD_CLOEXEC)
    try:
        os.write(fd, text.encode())
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


_CREDS_BLOCK = re.compile(r"-{3,}\s*BEGIN ([A-Z ]+?)\s*-{3,}\s*\n\s*(\S+)")
"""A block of a creds file as nsc writes it: ``-----BEGIN USER NKEY SEED-----`` and the line below."""


def _is_seed(text: str | None) -> bool:
    import nkeys  # not at module level: only creds and nkey users need it (~5 ms)

    try:
        return text is not None and nkeys.from_seed(bytearray(text.encode())) is not None
    except Exception:  # nkeys raises its own errors and binascii's for malformed base32
        return False


def check_credentials(options: ConnectionOptions) -> None:
    """Refuse a creds or nkey file (or secret) that is missing or holds no usable key before connecting: nats-py
    would fail on it with an empty message or as an authorization error from the server. A secret's text is never
    quoted."""
    for name, path in (("creds", options.creds), ("nkey", options.nkey)):
        if not path:
            continue
        if not os.path.isfile(path):
            raise ConnectError(f"The {name} file {path!r} does not exist or is not a file: check the {name} option.")
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConnectError(f"Cannot read the {name} file {path!r} ({exc}): check the {name} option.") from None
        _check_key_text(name, text, f"The {name} file {path!r}")
    for name, text in (("credsSecret", options.creds_secret), ("nkeySecret", options.nkey_secret)):
        if text:
            _check_key_text(name, text, f"Option {name!r}")


def _check_key_text(option: str, text: str, what: str) -> None:
    blocks = dict(match.groups() for match in _CREDS_BLOCK.finditer(text))
    holder = "the file holds" if what.startswith("The") else "the text is"
    if option.startswith("nkey") and not _is_seed(text.strip()):
        raise ConnectError(
            f"{what} holds no valid nkey seed: check the {option} option ({holder} one seed, SU..., as `nk -gen user` "
            "writes it)."
        )
    if option.startswith("creds") and not (_is_seed(blocks.get("USER NKEY SEED")) and "NATS USER JWT" in blocks):
        raise ConnectError(
            f"{what} does not hold a user JWT and a valid nkey seed: check the {option} option (a .creds file as "
            "`nsc generate creds` writes it)."
        )


def is_auth_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, AuthorizationError) or "authorization" in text or "authentication" in text


def explain_failure(errors: list[BaseException], options: ConnectionOptions) -> str:
    """One sentence from what actually went wrong (the most telling of the errors seen), naming the option."""
    servers = options.shown_servers
    within = f"within {options.connect_timeout:g}s"

    def first(*kinds: type[BaseException]) -> BaseException | None:
        return next((e for e in errors if isinstance(e, kinds)), None)

    def detail(exc: BaseException) -> str:
        return str(exc).strip() or type(exc).__name__  # nats-py raises some errors with empty messages

    if (tls := first(TlsNotOfferedError)) is not None:
        return str(tls)
    if any(is_auth_error(e) for e in errors):
        auth = options.describe_auth()
        if auth == "no credentials":
            return (
                f"The NATS server at {servers} requires credentials, and none were given: set the creds, nkey, "
                "token or user and password option."
            )
        return (
            f"The NATS server at {servers} refused the credentials ({auth}): check the creds, nkey, token or "
            "user/password options."
        )
    if (handshake := first(ssl.SSLError, ssl.CertificateError)) is not None:
        return f"TLS handshake with {servers} failed: check tls.ca, tls.cert and tls.key ({detail(handshake)})."
    from nkeys import NkeysError

    if (key := first(NkeysError)) is not None:
        return f"The nkey seed of the creds or nkey option is not valid ({detail(key)}): check that option."
    if first(ConnectionRefusedError) is not None:
        return (
            f"Cannot reach a NATS server at {servers} {within}: the connection was refused (nothing listens "
            "there): check the servers option and that nats-server is running."
        )
    if (unknown_host := first(socket.gaierror)) is not None:
        return (
            f"Cannot reach a NATS server at {servers}: the host name does not resolve ({detail(unknown_host)}): "
            "check the servers option."
        )
    if first(TimeoutError, NatsTimeoutError) is not None or not errors:
        return (
            f"Cannot reach a NATS server at {servers} {within}: no answer (timed out): check the servers option "
            "and firewalls; raise connectTimeout for a slow network."
        )
    if (network := first(OSError)) is not None:
        return f"Cannot reach a NATS server at {servers} {within} ({detail(network)}): check the servers option."
    last = errors[-1]
    what = f"{type(last).__name__}: {str(last).strip()}" if str(last).strip() else type(last).__name__
    return f"Connecting to the NATS server at {servers} failed ({what}): check the servers and connection options."
