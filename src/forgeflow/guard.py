"""Token checks shared by the API and the sign-in form: constant-time, on bytes (a
non-ASCII value is simply wrong, never an exception), slowed per client address, and
every failure audited through the bounded :class:`~forgeflow.rejections.RejectionLog`."""

from __future__ import annotations

import hmac
import time
from collections import OrderedDict, deque

from forgeflow.rejections import Rejection, RejectionLog

# Addresses remembered at once; the least recently failed is forgotten past it.
MAX_ADDRESSES = 10_000


def same_secret(submitted: str | bytes, expected: str) -> bool:
    """``hmac.compare_digest`` on UTF-8 bytes (on ``str`` it raises for non-ASCII)."""
    given = submitted if isinstance(submitted, bytes) else submitted.encode("utf-8", "replace")
    return hmac.compare_digest(given, expected.encode("utf-8"))


class FailureThrottle:
    """At most ``allowed`` failed attempts per client address in ``window`` seconds;
    past that every attempt from the address is refused unchecked (429 with
    ``Retry-After``) until its oldest failure leaves the window, so guessing runs at
    ``allowed / window`` per address whatever the request rate."""

    def __init__(self, allowed: int, window: float) -> None:
        self.allowed = allowed
        self.window = window
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, address: str) -> float | None:
        """Seconds until ``address`` may try again, or None when it may now."""
        times = self._failures.get(address)
        if times is None:
            return None
        now = time.monotonic()
        while times and now - times[0] >= self.window:
            times.popleft()
        if len(times) < self.allowed:
            return None
        return max(0.0, self.window - (now - times[0]))

    def failed(self, address: str) -> None:
        times = self._failures.pop(address, None) or deque(maxlen=self.allowed)
        times.append(time.monotonic())
        self._failures[address] = times  # now the most recent
        while len(self._failures) > MAX_ADDRESSES:
            self._failures.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)


class TokenGuard:
    """Checks a submitted admin token for one client address."""

    def __init__(self, token: str, throttle: FailureThrottle, rejections: RejectionLog) -> None:
        self._token = token
        self.throttle = throttle
        self._rejections = rejections

    async def check(self, submitted: str | bytes | None, address: str, action: str) -> bool:
        """True when ``submitted`` is the token; a failure is counted and audited."""
        if submitted and same_secret(submitted, self._token):
            self.throttle.succeeded(address)
            return True
        self.throttle.failed(address)
        reason = "missing_token" if not submitted else "wrong_token"
        await self._rejections.record(Rejection(action, reason, address))
        return False

    async def refuse_throttled(self, address: str, action: str) -> float | None:
        """Seconds to wait when ``address`` has failed too often (audited), else None."""
        wait = self.throttle.retry_after(address)
        if wait is not None:
            await self._rejections.record(Rejection(action, "too_many_attempts", address))
        return wait
