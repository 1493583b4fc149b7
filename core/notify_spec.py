"""The ``notify`` option of a job: the webhook structs that :mod:`core.model` embeds (kept apart
from :mod:`core.notifications`, which uses the model, so that the model can import them).

Same policy as :class:`core.model.Model` (frozen, keyword-only, omit defaults, camelCase).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

Outcome = Literal["failure", "success"]
"""``failure``: a run that ended FAILED (its last attempt failed); ``success``: SUCCEEDED."""
MAX_URL_CHARS = 2048


class _Base(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True, rename="camel"):
    pass


WebhookUrl = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_URL_CHARS)]
Secret = Annotated[str, msgspec.Meta(max_length=200)]


class NotifyIn(_Base, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """What a user sends: ``POST /jobs``' and ``PATCH /jobs/{id}``'s ``notify``, the body of
    ``PUT /me/notifications``.

    Attributes:
        url: absolute ``http://`` or ``https://`` URL, without credentials.
        on: the outcomes that notify (at least one).
        secret: ``whsec_`` + base64 of 24 to 64 random bytes (Standard Webhooks); absent: the
            webhook is not signed (on PATCH: the job's current secret is kept).
    """

    url: WebhookUrl
    on: list[Outcome] = msgspec.field(default_factory=lambda: ["failure"])
    secret: Secret | None = None


class NotifyTarget(_Base, kw_only=True, frozen=True):
    """A webhook as stored in a job (``notify``) and as a user's default.

    ``secret`` is never shown by the API: :func:`redacted` replaces it by ``has_secret``.
    """

    url: str
    on: list[Outcome] = msgspec.field(default_factory=lambda: ["failure"])
    secret: str | None = None
    has_secret: bool = False
