"""Limits per tenant and per connection: open streams, requests and tokens per minute.

Past a limit the caller gets a 429 / RESOURCE_EXHAUSTED that names the limit (code
``rate_limit_exceeded``, ErrorInfo metadata ``limit``); other tenants are unaffected because
every count is kept per tenant (per bearer-token label on an open server). Rates are token
buckets refilled continuously, so a tenant at its limit gets work back as time passes rather
than at a minute boundary. HTTP answers carry OpenAI's ``x-ratelimit-*`` headers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...config import TenantLimits
from ..api.errors import ApiError


def limit_exceeded(
    limit: str, value: int, what: str, retry_after_s: float | None = None
) -> ApiError:
    """The 429 for one named limit."""
    wait = f" Retry in {math.ceil(retry_after_s)} s." if retry_after_s else ""
    return ApiError(
        f"Limit '{limit}' reached: at most {value} {what}.{wait}",
        code="rate_limit_exceeded",
        status=429,
        type="rate_limit_error",
        metadata={
            "limit": limit,
            "limit_value": str(value),
            **({"retry_after_s": str(math.ceil(retry_after_s))} if retry_after_s else {}),
        },
    )


@dataclass(slots=True)
class _Bucket:
    capacity: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.capacity / 60.0)
        self.at = now

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return max(self.capacity - self.level, 0.0) * 60.0 / self.capacity


class TenantLimiter:
    """Counts per tenant key; owned by the core, used by every transport."""

    def __init__(
        self,
        limits: TenantLimits,
        clock: Callable[[], float] = time.monotonic,
        on_reject: Callable[[str], None] | None = None,
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._on_reject = on_reject or (lambda limit: None)
        self._streams: dict[str, int] = {}
        self._requests: dict[str, _Bucket] = {}
        self._tokens: dict[str, _Bucket] = {}

    def _reject(
        self, limit: str, value: int, what: str, retry_after_s: float | None = None
    ) -> ApiError:
        self._on_reject(limit)
        return limit_exceeded(limit, value, what, retry_after_s)

    # -- streams -------------------------------------------------------------------------

    def open_stream(self, tenant: str) -> None:
        """Count a stream of ``tenant``; 429 past ``max_streams_per_tenant``."""
        limit = self.limits.max_streams_per_tenant
        count = self._streams.get(tenant, 0)
        if limit and count >= limit:
            raise self._reject("max_streams_per_tenant", limit, "open streams per tenant")
        self._streams[tenant] = count + 1

    def close_stream(self, tenant: str) -> None:
        """Release a stream counted by ``open_stream``."""
        count = self._streams.get(tenant, 0) - 1
        if count > 0:
            self._streams[tenant] = count
        else:
            self._streams.pop(tenant, None)

    # -- rates ---------------------------------------------------------------------------

    def _bucket(self, table: dict[str, _Bucket], tenant: str, capacity: int) -> _Bucket:
        now = self._clock()
        bucket = table.get(tenant)
        if bucket is None:
            bucket = table[tenant] = _Bucket(float(capacity), float(capacity), now)
        bucket.refill(now)
        return bucket

    def admit_request(self, tenant: str) -> None:
        """Take one request from ``tenant``'s budget; 429 if either budget is spent."""
        rpm, tpm = self.limits.requests_per_minute, self.limits.tokens_per_minute
        if tpm:
            tokens = self._bucket(self._tokens, tenant, tpm)
            if tokens.level <= 0:
                wait = -tokens.level * 60.0 / tpm + 60.0 / tpm
                raise self._reject("tokens_per_minute", tpm, "tokens per minute", wait)
        if rpm:
            requests = self._bucket(self._requests, tenant, rpm)
            if requests.level < 1:
                wait = (1 - requests.level) * 60.0 / rpm
                raise self._reject("requests_per_minute", rpm, "requests per minute", wait)
            requests.level -= 1

    def charge_tokens(self, tenant: str, tokens: int) -> None:
        """Spend the tokens a finished response used (the budget may go negative)."""
        tpm = self.limits.tokens_per_minute
        if tpm and tokens > 0:
            self._bucket(self._tokens, tenant, tpm).level -= tokens

    def headers(self, tenant: str) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for ``tenant`` (only for limits that are on)."""
        out: dict[str, str] = {}
        for name, table, capacity in (
            ("requests", self._requests, self.limits.requests_per_minute),
            ("tokens", self._tokens, self.limits.tokens_per_minute),
        ):
            if not capacity:
                continue
            bucket = self._bucket(table, tenant, capacity)
            out[f"x-ratelimit-limit-{name}"] = str(capacity)
            out[f"x-ratelimit-remaining-{name}"] = str(max(int(bucket.level), 0))
            out[f"x-ratelimit-reset-{name}"] = f"{bucket.reset_s():.3f}s"
        return out
