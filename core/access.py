"""Who may do what: the caller of an operation (a token's identity) and the checks on it.

A bearer token carries three claims that decide access (see README "Security model"):

- ``sub``: the user. Every job is owned by the user who created it.
- ``role``: ``user`` (the default when absent) sees and changes only the user's own jobs;
  ``admin`` may list and act on every user's jobs, and each of those actions is recorded with
  the admin as its actor (:mod:`core.audit`).
- ``scope``: what the token may do, space-separated as OAuth 2.0 spells it (RFC 8693 §4.2,
  RFC 6749 §3.3): ``jobs:read`` (read jobs, runs, audit records) and ``jobs:write`` (create,
  change, pause, resume, cancel, delete, trigger). Absent means both, so tokens minted before
  scopes existed keep working; ``jobs:read`` alone is a read-only token.

A token naming an unknown role or scope is rejected (401): a typo must never widen or silently
narrow what a token grants.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from core.errors import Forbidden


class Role(enum.StrEnum):
    """A token's ``role`` claim."""

    USER = "user"
    ADMIN = "admin"


READ = "jobs:read"
WRITE = "jobs:write"
SCOPES = frozenset({READ, WRITE})
"""Every scope a token may carry."""


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller of an operation.

    Attributes:
        user: the token's ``sub``; owner of the jobs the caller creates.
        role: ``user`` or ``admin``.
        scopes: a subset of :data:`SCOPES`.
    """

    user: str
    role: Role = Role.USER
    scopes: frozenset[str] = SCOPES

    @property
    def admin(self) -> bool:
        return self.role == Role.ADMIN

    def require_read(self) -> None:
        """Raises: Forbidden: the token lacks ``jobs:read``."""
        if READ not in self.scopes:
            raise Forbidden(f"this token has no {READ} scope: it cannot read jobs")

    def require_write(self) -> None:
        """Raises: Forbidden: the token lacks ``jobs:write`` (a read-only token)."""
        if WRITE not in self.scopes:
            raise Forbidden(f"this token is read-only (no {WRITE} scope): it cannot change jobs")

    def owner_filter(self, owner: str | None, *, all_users: bool = False) -> str | None:
        """The owner whose records a listing returns: the caller's own unless an admin asks for
        ``owner`` or for everyone (``all_users``, the result None).

        Raises:
            Forbidden: a user who is not an admin asks for another user's or everyone's records.
        """
        if all_users:
            if owner is not None:
                raise Forbidden("give either an owner or allUsers, not both")
            if not self.admin:
                raise Forbidden("only an admin may list every user's records")
            return None
        if owner is None or owner == self.user:
            return self.user
        if not self.admin:
            raise Forbidden("only an admin may list another user's records")
        return owner


def parse_scope(claim: object) -> frozenset[str]:
    """The scopes of a ``scope`` claim (absent: every scope).

    Raises:
        ValueError: not a string, empty, or naming an unknown scope (the message says which).
    """
    if claim is None:
        return SCOPES
    if not isinstance(claim, str):
        raise ValueError("'scope' must be a space-separated string")
    scopes = frozenset(claim.split())
    if not scopes:
        raise ValueError("'scope' names no scope")
    unknown = sorted(scopes - SCOPES)
    if unknown:
        raise ValueError(f"unknown scope {unknown[0]!r}; known: {', '.join(sorted(SCOPES))}")
    return scopes


def parse_role(claim: object) -> Role:
    """The role of a ``role`` claim (absent: ``user``).

    Raises:
        ValueError: not one of :class:`Role` (the message lists them).
    """
    if claim is None:
        return Role.USER
    if isinstance(claim, str) and claim in Role.__members__.values():
        return Role(claim)
    known = ", ".join(r.value for r in Role)
    raise ValueError(f"unknown role {claim!r}; known: {known}")
