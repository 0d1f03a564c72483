"""Who a request belongs to and what it may use: API keys and tenants, per-tenant and
per-connection limits."""
