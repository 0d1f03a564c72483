"""The settings of one model route served by a completions backend, apart from the engine, so
that what reads a backend's answer (``completion_stream``) can name them without importing the
engine that imports it."""

from __future__ import annotations

from dataclasses import dataclass, field

from bidi_responses.schema import JSONObject


@dataclass(slots=True)
class CompletionsConfig:
    """One model route served by an OpenAI-compatible completions backend (TOML:
    ``[models.NAME.completions]``)."""

    # The backend's OpenAI base URL; the engine posts to ``{base_url}/completions``.
    base_url: str = "http://127.0.0.1:8080/v1"
    # The backend's model name; empty sends none (a backend serving one model uses it).
    model: str = ""
    # Environment variable holding the backend's API key (sent as a bearer token); empty: none.
    api_key_env: str = ""
    connect_timeout_s: float = 5.0
    # From sending the request to the first streamed chunk: queueing plus prefill.
    first_token_timeout_s: float = 120.0
    # The longest silence between two streamed chunks.
    idle_timeout_s: float = 30.0
    # Attempts after the first, only while no token has been streamed.
    max_retries: int = 2
    retry_backoff_s: float = 0.25
    # Most tokens one sampling segment may produce (the request's budget may lower it).
    max_output_tokens: int = 4096
    # The backend's context window: prompt plus output budget must fit.
    context_window: int = 131_072
    # Connections kept open to the backend.
    max_connections: int = 64
    # The model's chat format: "generic" (the project's own), "harmony" (gpt-oss) or
    # "template" (any open model: its own tokenizer and chat template, from the files below).
    format: str = "generic"
    # format = "template": the model's tokenizer.json, its directory, or its GGUF file (a
    # relative path is taken from the config file's directory).
    tokenizer: str = ""
    # A .jinja file replacing the model's own chat template ("" keeps the model's).
    chat_template: str = ""
    # How the model writes tool calls: "auto" (from its template), "tags", "json" or "none".
    tool_call_format: str = "auto"
    # Extra variables for the chat template (``chat_template_kwargs``: enable_thinking...).
    chat_template_kwargs: JSONObject = field(default_factory=dict)
    # Extra fields merged into every request body (backend sampling settings, logit_bias...).
    extra_body: JSONObject = field(default_factory=dict)
