"""The notifier's webhook sender (:class:`actors.notifier.WebhookSender`) on aiohttp, behind the
same server-side request forgery guard as the ``http`` task (:mod:`jobsched.http_task`,
:mod:`core.egress`): the addresses a host name resolves to are checked by the connection's own
resolver, a literal IP address before the request; setting ``JOBSCHED_HTTP_ALLOWED_NETWORKS``
allows internal targets. Redirects are not followed (a 3xx is a failed attempt): a webhook
URL names its receiver.
"""

from __future__ import annotations

import aiohttp
from yarl import URL

from actors.notifier import WebhookResult
from core.egress import EgressPolicy
from core.tasks import TaskError
from jobsched.http_task import GuardedResolver, _check_literal

REQUEST_TIMEOUT_SECONDS = 10.0
"""How long one delivery attempt may take, connection included (seconds)."""
ERROR_EXCERPT_BYTES = 200
"""How much of a non-2xx answer's body the attempt's error quotes (bytes)."""


class AiohttpSender:
    """POSTs webhooks through one session (connections reused per receiver).

    Args:
        policy: the addresses it may connect to.
        timeout_seconds: the total time of one attempt (seconds).
    """

    def __init__(
        self, policy: EgressPolicy, *, timeout_seconds: float = REQUEST_TIMEOUT_SECONDS
    ) -> None:
        self.policy = policy
        self.timeout_seconds = timeout_seconds
        self._session: aiohttp.ClientSession | None = None

    def _opened(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                resolver=GuardedResolver(self.policy), use_dns_cache=False
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=False,
                timeout=aiohttp.ClientTimeout(total=self.timeout_seconds),
            )
        return self._session

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> WebhookResult:
        try:
            _check_literal(URL(url), self.policy)
            async with self._opened().post(
                url, data=body, headers=headers, allow_redirects=False
            ) as resp:
                if 200 <= resp.status <= 299:
                    return WebhookResult(resp.status, None)
                excerpt = await resp.content.read(ERROR_EXCERPT_BYTES)
                text = excerpt.decode("utf-8", errors="replace")
                return WebhookResult(resp.status, f"HTTP {resp.status}: {text!r}")
        except TaskError as e:  # the SSRF guard refused every address
            return WebhookResult(None, str(e), final=True)
        except aiohttp.InvalidURL as e:  # retrying cannot make it valid
            return WebhookResult(None, f"invalid URL {e}", final=True)
        except TimeoutError:
            return WebhookResult(None, f"no answer within {self.timeout_seconds:g} s")
        except (aiohttp.ClientError, ValueError, OSError) as e:
            return WebhookResult(None, f"{type(e).__name__}: {e}")

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
