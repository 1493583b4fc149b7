"""TLS to NATS: the client's :class:`ssl.SSLContext`, built from the ``JOBSCHED_NATS_TLS_*``
settings with the standard library.

The server's certificate is always verified, hostname included (RFC 6125 through
:func:`ssl.create_default_context`; an IP address in the URL is matched against the
certificate's IP addresses), against ``JOBSCHED_NATS_TLS_CA_FILE`` or, without it, the system's
trust store. TLS 1.2 is the oldest version accepted (RFC 8996 retired 1.0 and 1.1; nats-server
offers 1.2 and later). A client certificate (``JOBSCHED_NATS_TLS_CERT_FILE`` and
``_KEY_FILE``, PEM, key unencrypted) is presented when set: servers whose ``tls`` block says
``verify: true`` refuse connections without one (docs.nats.io, "Enabling TLS" and "TLS
Authentication").

A connection that wants TLS never falls back to plain text: :class:`bus.nats.NatsClient`
refuses a server that does not require TLS before it sends anything, credentials included.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path

from core.errors import ConfigError

CA_SETTING = "JOBSCHED_NATS_TLS_CA_FILE"
CERT_SETTING = "JOBSCHED_NATS_TLS_CERT_FILE"
KEY_SETTING = "JOBSCHED_NATS_TLS_KEY_FILE"
TLS_SCHEME = "tls://"


def client_context(
    *, ca_file: str = "", cert_file: str = "", key_file: str = ""
) -> ssl.SSLContext | None:
    """The SSL context of a NATS client, or None when no file is set (TLS then only for
    ``tls://`` URLs, against the system's trust store).

    Args:
        ca_file: PEM bundle of the CAs that sign the servers' certificates; empty: the system's.
        cert_file: PEM client certificate (chain), presented to the server.
        key_file: its PEM private key (not encrypted: a process has nobody to ask).

    Raises:
        ConfigError: naming the setting: a certificate without its key or a key without its
            certificate, a file that cannot be read, or one that is not what it should be
            (never the files' content).
    """
    if not (ca_file or cert_file or key_file):
        return None
    if bool(cert_file) != bool(key_file):
        missing = KEY_SETTING if cert_file else CERT_SETTING
        raise ConfigError(
            f"{CERT_SETTING} and {KEY_SETTING} go together (a client certificate and its key): "
            f"{missing} is not set"
        )
    files = ((CA_SETTING, ca_file), (CERT_SETTING, cert_file), (KEY_SETTING, key_file))
    for setting, path in files:
        if path:
            _check_readable(setting, path)
    try:
        context = verifying_context(ca_file or None)
    except ssl.SSLError as e:
        raise ConfigError(
            f"{CA_SETTING}={ca_file}: no PEM CA certificate in it ({_reason(e)})"
        ) from None
    if cert_file:
        try:
            context.load_cert_chain(cert_file, key_file, password=_no_password)
        except (ssl.SSLError, ValueError) as e:
            raise ConfigError(
                f"{CERT_SETTING}={cert_file} and {KEY_SETTING}={key_file} are not a PEM "
                f"certificate and its unencrypted private key ({_reason(e)})"
            ) from None
    return context


def verifying_context(ca_file: str | None = None) -> ssl.SSLContext:
    """A client context that verifies the server's certificate and hostname against
    ``ca_file`` (PEM) or the system's trust store, TLS 1.2 or later.

    Raises:
        OSError: ``ca_file`` cannot be read; ``ssl.SSLError`` (one) when it has no certificate.
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def wants_tls(servers: Sequence[str], context: ssl.SSLContext | None) -> bool:
    """Whether connections to ``servers`` must be TLS: a context was given or a URL is
    ``tls://``."""
    return context is not None or any(s.strip().lower().startswith(TLS_SCHEME) for s in servers)


def _check_readable(setting: str, path: str) -> None:
    try:
        with Path(path).open("rb"):
            pass
    except OSError as e:
        raise ConfigError(f"{setting}={path}: cannot be read ({e.strerror or e})") from None


def _no_password() -> bytes:
    raise ValueError("the private key is encrypted")


def _reason(e: Exception) -> str:
    if isinstance(e, ssl.SSLError) and e.reason:
        return str(e.reason)
    return str(e) or type(e).__name__
