"""The settings of one model route served by an upstream Responses API, apart from the engine,
so that its wire (``upstream_wire``) can name them without importing the engine that imports it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class UpstreamConfig:
    """One model route served by an upstream Responses API (TOML: ``[models.NAME.upstream]``)."""

    # The upstream's OpenAI base URL: HTTP posts go to {base_url}/responses, WebSocket mode
    # connects to the same path with ws:// (wss:// for https://).
    base_url: str = "http://127.0.0.1:8000/v1"
    # The upstream model name (required by most upstreams).
    model: str = ""
    # Environment variable holding the upstream's API key (bearer token); empty: none.
    api_key_env: str = ""
    # "auto" (WebSocket mode, HTTP if the upgrade is refused), "websocket" or "http".
    transport: str = "auto"
    # Ask the upstream to store responses (then HTTP turns chain previous_response_id too).
    store: bool = False
    connect_timeout_s: float = 10.0
    first_event_timeout_s: float = 120.0
    idle_timeout_s: float = 60.0
    max_retries: int = 2
    retry_backoff_s: float = 0.25
    max_message_bytes: int = 64 * 1024 * 1024
