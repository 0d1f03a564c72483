"""Who a request belongs to and what it may use: API keys and tenants, per-tenant and
per-connection limits."""

from .auth import ApiKeys
from .caller import ANONYMOUS, Caller
from .limits import limit_exceeded
from .request_budget import RequestBytes, over_budget

__all__ = ["ANONYMOUS", "ApiKeys", "Caller", "RequestBytes", "limit_exceeded", "over_budget"]
