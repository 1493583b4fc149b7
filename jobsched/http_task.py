"""The built-in ``http`` task: call a URL, as Cloud Scheduler's and EventBridge Scheduler's HTTP
targets do.

Parameters (:class:`HttpParams`): ``method``, ``url`` (http or https), ``headers`` (a value is a
string or a reference to a deployment secret, ``{"secret": "name", "prefix": "Bearer "}``),
``json`` or ``text`` body, ``successStatuses`` (default: any 2xx), ``followRedirects``.

What a run does:

- sends ``Idempotency-Key: <execution id>`` (the same for every attempt and redelivery of a run,
  IETF draft-ietf-httpapi-idempotency-key-header), so the target can de-duplicate;
- connects only to addresses :class:`core.egress.EgressPolicy` allows — checked on the addresses
  each host name resolves to, by the resolver of the connection itself (no second lookup a DNS
  rebinding could change), and on literal IP addresses and every redirect before it is
  followed (at most :data:`MAX_REDIRECTS`); a refused address fails the run without retry;
- stores the answer as the run's result: ``{"status", "url", "elapsedMs", "body",
  "bodyTruncated", "redirects"}``, the body being at most :data:`BODY_EXCERPT_BYTES` of the
  response decoded as UTF-8;
- a status in ``successStatuses`` succeeds; 5xx, 429 and connection errors fail the attempt
  and are retried with the job's backoff (no sooner than a ``Retry-After``, RFC 9110 §10.2.3);
  any other status fails the run at once.

Secret header values are read from the worker's secrets directory at run time: they are never
in the job, so the API cannot show them, and never in a result or an error: a target that
echoes a secret back (``httpbin.org/headers`` does) has it replaced by :data:`REDACTED` in the
stored body excerpt, URL and error. On a redirect to another origin, secret headers,
``Authorization`` and ``Cookie`` are dropped (as browsers and ``requests`` do).
"""

from __future__ import annotations

import email.utils
import ipaddress
import socket
import time
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import aiohttp
import msgspec
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver
from yarl import URL

from core.egress import EgressPolicy, legacy_ipv4
from core.tasks import SECRET_NAME, TaskContext, TaskError

MAX_REDIRECTS = 5
BODY_EXCERPT_BYTES = 4096
"""How much of a response body a run's result keeps (bytes; the rest is not read)."""
ERROR_EXCERPT_CHARS = 200
"""How much of a failed response's body the run's error quotes (characters)."""

HeaderName = Annotated[str, msgspec.Meta(pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")]
HeaderText = Annotated[str, msgspec.Meta(pattern=r"^[^\r\n\x00]{0,8192}$")]
Status = Annotated[int, msgspec.Meta(ge=100, le=599)]
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_SENSITIVE = frozenset({"authorization", "cookie", "proxy-authorization"})
REDACTED = "[secret]"
"""What stands for a secret's value that a target echoed into a stored body, URL or error."""


class SecretRef(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    """A header value taken from the deployment's secret ``secret`` at run time, after
    ``prefix`` (e.g. ``"Bearer "``)."""

    secret: Annotated[str, msgspec.Meta(pattern=SECRET_NAME)]
    prefix: HeaderText = ""


class HttpParams(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    """The ``http`` task's parameters (see the module docstring)."""

    url: Annotated[str, msgspec.Meta(max_length=8192)]
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] = "GET"
    headers: Annotated[dict[HeaderName, HeaderText | SecretRef], msgspec.Meta(max_length=64)] = {}
    json: Any = None
    text: Annotated[str, msgspec.Meta(max_length=1_000_000)] | None = None
    success_statuses: Annotated[list[Status], msgspec.Meta(max_length=100)] = []
    follow_redirects: bool = True

    def __post_init__(self) -> None:
        url = URL(self.url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("url: must be an absolute http:// or https:// URL")
        if url.user is not None or url.password is not None:
            raise ValueError("url: credentials in the URL are not allowed; use a secret header")
        if legacy_ipv4(url.host):
            raise ValueError(
                f"url: {url.host} is an IPv4 address in a legacy form (decimal, octal, hex or "
                "short); write it as four decimal numbers, e.g. 192.0.2.1"
            )
        if self.json is not None and self.text is not None:
            raise ValueError("text: give a json or a text body, not both")
        for name in self.headers:
            if name.lower() in ("idempotency-key", "host", "content-length", "transfer-encoding"):
                raise ValueError(f"headers.{name}: this header is set by the task itself")


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that returns only the addresses ``policy`` allows.

    aiohttp connects to exactly the addresses its resolver returns, so the check and the
    connection cannot disagree (no time-of-check/time-of-use gap for DNS rebinding).

    Raises (from :meth:`resolve`):
        TaskError: not retryable, when every address of the host is refused.
    """

    def __init__(self, policy: EgressPolicy) -> None:
        self._policy = policy
        self._inner = ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        allowed = [r for r in results if self._policy.refusal(r["host"]) is None]
        if not allowed:
            reasons = "; ".join(sorted({str(self._policy.refusal(r["host"])) for r in results}))
            raise _refused(host, reasons)
        return allowed

    async def close(self) -> None:
        await self._inner.close()


def _refused(host: str, reason: str) -> TaskError:
    return TaskError(
        f"refused to connect to {host}: {reason} (JOBSCHED_HTTP_ALLOWED_NETWORKS on "
        "the workers allows internal targets)",
        retryable=False,
    )


def _check_literal(url: URL, policy: EgressPolicy) -> None:
    """A URL whose host is an IP address is checked here (aiohttp does not resolve it)."""
    host = (url.host or "").strip("[]")
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return
    reason = policy.refusal(ip)
    if reason is not None:
        raise _refused(host, reason)


def _headers(
    params: HttpParams, ctx: TaskContext
) -> tuple[dict[str, str], set[str], frozenset[str]]:
    """The request headers (secrets filled in), the names of those that came from secrets and
    the secrets' values."""
    headers = {"Idempotency-Key": ctx.idempotency_key}
    secret_names: set[str] = set()
    values: set[str] = set()
    for name, value in params.headers.items():
        if isinstance(value, SecretRef):
            secret = ctx.secret(value.secret)
            headers[name] = value.prefix + secret
            secret_names.add(name.lower())
            if secret:
                values.add(secret)
        else:
            headers[name] = value
    return headers, secret_names, frozenset(values)


def redact(text: str, secrets: frozenset[str], *, truncated: bool = False) -> str:
    """``text`` with every occurrence of a secret's value replaced by :data:`REDACTED`, longest
    first; ``truncated``: the text was cut, so a secret's first 4 characters or more at its end
    are replaced too."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
        if truncated:
            for cut in range(min(len(secret) - 1, len(text)), 3, -1):
                if text.endswith(secret[:cut]):
                    text = text[:-cut] + REDACTED
                    break
    return text


def _origin(url: URL) -> tuple[str, str, int | None]:
    return (url.scheme, url.host or "", url.port)


def _retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds from a ``Retry-After`` header (delay-seconds or an HTTP-date, RFC 9110 §10.2.3)."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


async def _excerpt(resp: aiohttp.ClientResponse) -> tuple[str, bool]:
    data = await resp.content.read(BODY_EXCERPT_BYTES + 1)
    truncated = len(data) > BODY_EXCERPT_BYTES
    return data[:BODY_EXCERPT_BYTES].decode("utf-8", errors="replace"), truncated


def _successful(status: int, params: HttpParams) -> bool:
    if params.success_statuses:
        return status in params.success_statuses
    return 200 <= status <= 299


async def call_url(params: HttpParams, ctx: TaskContext) -> dict[str, Any]:
    """The ``http`` task (see the module docstring); its result.

    Raises:
        TaskError: a refused address or an unsuccessful answer (retryable for 5xx and 429,
            with the target's ``Retry-After``; not retryable otherwise).
        aiohttp.ClientError: a connection error (retried with the job's backoff).
    """
    policy = EgressPolicy.parse(ctx.allowed_networks)
    headers, secret_names, secrets = _headers(params, ctx)
    method, url = params.method, URL(params.url)
    body: dict[str, Any] = {}
    if params.json is not None:
        body["json"] = params.json
    elif params.text is not None:
        body["data"] = params.text.encode()
        headers.setdefault("Content-Type", "text/plain; charset=utf-8")
    began = time.perf_counter()
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(policy), use_dns_cache=False)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        for redirects in range(MAX_REDIRECTS + 1):
            _check_literal(url, policy)
            try:
                async with session.request(
                    method, url, headers=headers, allow_redirects=False, **body
                ) as resp:
                    location = resp.headers.get("Location")
                    if not (params.follow_redirects and resp.status in _REDIRECTS and location):
                        text, truncated = await _excerpt(resp)
                        elapsed_ms = round((time.perf_counter() - began) * 1000, 1)
                        return _outcome(
                            params, resp, url, text, truncated, elapsed_ms, redirects, secrets
                        )
            except aiohttp.InvalidURL as e:  # retrying cannot make it valid
                raise TaskError(redact(f"invalid URL {e}", secrets), retryable=False) from None
            target = url.join(URL(location))
            if target.scheme not in ("http", "https"):
                raise TaskError(
                    redact(f"refused to follow a redirect to {target}: not http(s)", secrets),
                    retryable=False,
                )
            if _origin(target) != _origin(url):
                drop = secret_names | _SENSITIVE
                headers = {k: v for k, v in headers.items() if k.lower() not in drop}
            if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
                method, body = "GET", {}
            url = target
    raise TaskError(
        redact(f"more than {MAX_REDIRECTS} redirects, last to {url}", secrets), retryable=False
    )


def _outcome(
    params: HttpParams,
    resp: aiohttp.ClientResponse,
    url: URL,
    text: str,
    truncated: bool,
    elapsed_ms: float,
    redirects: int,
    secrets: frozenset[str],
) -> dict[str, Any]:
    if _successful(resp.status, params):
        return {
            "status": resp.status,
            "url": redact(str(url), secrets),
            "elapsedMs": elapsed_ms,
            "body": redact(text, secrets, truncated=truncated),
            "bodyTruncated": truncated,
            "redirects": redirects,
        }
    quoted = redact(text, secrets, truncated=truncated)[:ERROR_EXCERPT_CHARS]
    message = f"HTTP {resp.status} from {params.method} {redact(str(url), secrets)}: {quoted!r}"
    if resp.status >= 500 or resp.status == 429:
        after = _retry_after(resp.headers.get("Retry-After"), datetime.now(UTC))
        raise TaskError(message, retry_after_seconds=after)
    raise TaskError(message, retryable=False)
