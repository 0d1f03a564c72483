"""API keys and the tenants they stand for.

With keys configured, every request must carry ``authorization: Bearer <key>`` (gRPC metadata,
HTTP header or the WebSocket upgrade's header) and is served as the key's tenant; a tenant sees
only its own responses. Without keys the server is open: requests run as no tenant (``None``)
and the ledger labels them by a hash of the bearer token, as before.

Keys come from the config (``[auth] api_keys``), a keys file (one ``KEY TENANT`` per line) or an
environment variable (``KEY=TENANT`` pairs separated by commas). Keys are compared in constant
time and never logged; errors name the problem, never the key.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from ..api.errors import ApiError
from .tenants import tenant_from_authorization

DEFAULT_KEYS_ENV = "BIDI_RESPONSES_API_KEYS"


def unauthenticated(reason: str) -> ApiError:
    """A 401 in OpenAI's shape (``invalid_api_key``)."""
    return ApiError(
        f"{reason} Send 'Authorization: Bearer <API key>'.",
        code="invalid_api_key",
        status=401,
        type="invalid_request_error",
    )


def parse_keys_file(path: str | Path) -> dict[str, str]:
    """``KEY TENANT`` per line; blank lines and ``#`` comments are skipped."""
    keys: dict[str, str] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            # The line itself may hold a key: name only where it is.
            raise ValueError(f"{path}:{number}: expected 'KEY TENANT'")
        keys[parts[0]] = parts[1]
    return keys


def parse_keys_env(value: str, name: str = DEFAULT_KEYS_ENV) -> dict[str, str]:
    """``KEY=TENANT,KEY=TENANT``."""
    keys: dict[str, str] = {}
    for index, pair in enumerate(p.strip() for p in value.split(",")):
        if not pair:
            continue
        key, sep, tenant = pair.partition("=")
        if not sep or not key.strip() or not tenant.strip():
            raise ValueError(f"${name}: entry {index + 1}: expected 'KEY=TENANT'")
        keys[key.strip()] = tenant.strip()
    return keys


class ApiKeys:
    """The key table; ``authenticate`` turns an authorization value into a tenant."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self._keys = [(key.encode(), tenant) for key, tenant in keys.items()]

    @classmethod
    def load(
        cls,
        inline: Mapping[str, str],
        keys_file: str | None,
        env_name: str = DEFAULT_KEYS_ENV,
        environ: Mapping[str, str] | None = None,
    ) -> ApiKeys:
        """All configured sources merged (file, then environment, then inline entries)."""
        keys: dict[str, str] = {}
        if keys_file:
            keys.update(parse_keys_file(keys_file))
        env = (os.environ if environ is None else environ).get(env_name)
        if env:
            keys.update(parse_keys_env(env, env_name))
        keys.update(inline)
        return cls(keys)

    @property
    def enabled(self) -> bool:
        """True when requests must authenticate."""
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def authenticate(self, authorization: str | None) -> str | None:
        """The caller's tenant; ApiError 401 if keys are on and this is not one of them.

        Open mode returns None: nothing is isolated and the ledger labels by token hash.
        """
        if not self._keys:
            return None
        if not authorization:
            raise unauthenticated("Missing API key.")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthenticated("Malformed authorization value.")
        presented = token.encode()
        found: str | None = None
        for key, tenant in self._keys:  # no early exit: timing does not tell which key matched
            if hmac.compare_digest(key, presented):
                found = tenant
        if found is None:
            raise unauthenticated("Incorrect API key provided.")
        return found

    def label(self, authorization: str | None) -> str | None:
        """Open mode's ledger label for a bearer token (a short hash)."""
        return tenant_from_authorization(authorization)
