"""The test suite's nats-servers require authentication, as every deployment does (issue 12).

An :class:`AuthedNatsServer` knows two kinds of users:

* the harness's own observer, ``test-admin``, allowed everything: its credentials are in the
  server's :attr:`~AuthedNatsServer.url`, so a test's own connections (a status collector, a
  seeded event, a raw ``nats.connect``) work unchanged;
* the role users (:mod:`bus.auth`) of each test's subject prefix, added by
  :meth:`~AuthedNatsServer.grant` when the test builds its settings and removed when it ends,
  by config reload. jobsched itself always connects as those (``make_settings`` strips the
  observer from the URL it hands over), so every test that runs jobsched proves that the
  roles' permissions cover what the code does: at the end of the test the server's log must
  hold no permission violation by any of that prefix's users (:meth:`violations`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bus.auth import (
    Credentials,
    Permissions,
    authorization_block,
    credentials_file_name,
    read_credentials,
    role_users,
)
from core.settings import Settings
from jobsched.natsserver import NatsServer

ADMIN_USER = "test-admin"

_SERVERS: dict[str, AuthedNatsServer] = {}
"""Running servers by ``host:port``, to find the server a settings URL points at."""


def _netloc(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def plain_url(urls: str) -> str:
    """``urls`` (comma-separated) without user and password."""
    out = []
    for url in urls.split(","):
        parts = urlsplit(url.strip())
        out.append(urlunsplit(parts._replace(netloc=_netloc(url.strip()))))
    return ",".join(out)


def server_at(url: str) -> AuthedNatsServer | None:
    """The running :class:`AuthedNatsServer` listening at ``url``, if any."""
    return _SERVERS.get(_netloc(url))


class AuthedNatsServer(NatsServer):
    """A :class:`NatsServer` with the observer and the granted role users (module docstring)."""

    def __init__(self, *args: Any, admin: Credentials | None = None, **kwargs: Any) -> None:
        """``NatsServer``'s arguments; ``admin``: the observer's credentials (the nodes of a
        cluster share them), else new ones."""
        self.admin = admin or Credentials(ADMIN_USER, secrets.token_hex(16))
        self._grants: dict[str, tuple[Path, tuple[str, ...]]] = {}
        self._plain_url = ""
        super().__init__(*args, **kwargs)
        self.authorization = self._block()

    @property  # NatsServer's plain attribute, seen with the observer
    def url(self) -> str:
        """The client URL with the observer's user and password (empty until started)."""
        if not self._plain_url:
            return ""
        parts = urlsplit(self._plain_url)
        netloc = f"{self.admin.user}:{self.admin.password}@{parts.netloc}"
        return urlunsplit(parts._replace(netloc=netloc))

    @url.setter
    def url(self, value: str) -> None:
        self._plain_url = value
        if value:
            _SERVERS[_netloc(value)] = self

    @property
    def plain_url(self) -> str:
        """The client URL without credentials."""
        return self._plain_url

    def _block(self) -> str:
        everything = Permissions(publish=(">",), subscribe=(">",))
        users: list[tuple[Credentials, Permissions]] = [(self.admin, everything)]
        for prefix, (directory, queues) in sorted(self._grants.items()):
            users += role_users(directory, prefix, queues)
        return authorization_block(users)

    def grant(self, prefix: str, queues: Sequence[str], directory: Path) -> None:
        """Let the role users of ``prefix`` (credentials kept in ``directory``), whose workers
        consume ``queues`` (added to those granted before), connect."""
        known = self._grants.get(prefix)
        wanted = tuple(sorted(set(queues) | set(known[1] if known else ())))
        if known == (directory, wanted):
            return
        self._grants[prefix] = (directory, wanted)
        self._apply()

    def revoke(self, prefix: str) -> None:
        """Remove the role users of ``prefix`` (their connections are closed)."""
        if self._grants.pop(prefix, None) is not None:
            self._apply()

    def _apply(self) -> None:
        if self.pid is not None and self.plain_url:
            self.reload(self._block())
        else:
            self.authorization = self._block()

    def violations(self, prefix: str, offset: int = 0) -> list[str]:
        """The permission violations logged since ``offset`` by the role users of ``prefix``."""
        who = f"/user:{prefix}-"
        return [line for line in self.log_since(offset) if "Violation" in line and who in line]


def observer_url(urls: str) -> str:
    """``urls`` (comma-separated) as the harness's observer connects to them: with
    ``test-admin``'s credentials where the server is an :class:`AuthedNatsServer`."""
    out = []
    for url in urls.split(","):
        server = server_at(url.strip())
        out.append(server.url if server is not None else url.strip())
    return ",".join(out)


def api_credentials(settings: Settings) -> Credentials:
    """The ``api`` user of a test's settings (as :func:`bus.auth.generate_users` wrote it)."""
    return read_credentials(Path(settings.nats.credentials_dir) / credentials_file_name("api"))
