"""The ``bidi-responses`` command: ``serve``, ``usage`` and ``compare``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import sys
from collections.abc import Sequence
from functools import partial

from .config import (
    RouteConfig,
    ServerConfig,
    apply_route_setting,
    load_config,
)
from .core.observability.logsafe import EscapingFormatter
from .core.storage.backend import check_store_url, is_postgres_url
from .engines import ENGINE_KINDS
from .workers import LOG_FORMAT, add_workers_flag


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the server (gRPC, HTTP+SSE and WebSocket)")
    p.add_argument("--config", help="TOML file with server settings and model routes")
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--grpc-port", type=int, default=None, help="gRPC port (default 50051)")
    p.add_argument("--http-port", type=int, default=None, help="HTTP/WebSocket port (default 8000)")
    p.add_argument("--no-http", action="store_true", help="serve gRPC only")
    p.add_argument("--data-dir", default=None, help="where the SQLite store lives")
    p.add_argument(
        "--store-url",
        default=None,
        help="store backend: postgresql://... for a store shared by replicas "
        "(default: SQLite in --data-dir)",
    )
    p.add_argument(
        "--engine",
        choices=ENGINE_KINDS,
        default=None,
        help="engine behind the model alias --model: sim (default), script (--script), "
        "completions (an OpenAI-compatible /v1/completions backend: --backend-*) or upstream "
        "(another Responses API: --backend-*)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="alias that --engine and the --sim-* flags configure (default sim-model; "
        "added unless --config defines the model aliases)",
    )
    p.add_argument("--sim-tps", type=float, default=None, help="sim decode tokens/s (1000)")
    p.add_argument("--sim-ttft-ms", type=float, default=None, help="sim base time to first token")
    p.add_argument(
        "--sim-prefill-tps", type=float, default=None, help="sim prompt tokens/s (100000)"
    )
    p.add_argument(
        "--sim-tool-rounds",
        type=int,
        default=None,
        help="tool-calling turns before the sim answers in text (3)",
    )
    p.add_argument("--sim-seed", type=int, default=None, help="sim random seed (0)")
    p.add_argument("--script", default=None, help="JSONL file for --engine script")
    p.add_argument(
        "--backend-url",
        default=None,
        help="completions/upstream: the backend's OpenAI base URL, e.g. http://127.0.0.1:8080/v1",
    )
    p.add_argument(
        "--backend-model", default=None, help="completions/upstream: the backend's model name"
    )
    p.add_argument(
        "--backend-api-key-env",
        default=None,
        help="completions/upstream: environment variable holding the backend's API key",
    )
    p.add_argument(
        "--backend-format",
        default=None,
        choices=("generic", "harmony", "template"),
        help="completions: the model's chat format: generic (default), harmony (gpt-oss) or "
        "template (any open model: its own tokenizer and chat template, --backend-tokenizer)",
    )
    p.add_argument(
        "--backend-tokenizer",
        default=None,
        metavar="PATH",
        help="completions, format template: the model's tokenizer.json, its directory or its "
        "GGUF file (the chat template is read from it too)",
    )
    p.add_argument(
        "--backend-chat-template",
        default=None,
        metavar="PATH",
        help="completions, format template: a .jinja file replacing the model's own template",
    )
    p.add_argument(
        "--backend-tool-call-format",
        default=None,
        choices=("auto", "tags", "json", "none"),
        help="completions, format template: how the model writes tool calls (default auto: "
        "read from its template)",
    )
    p.add_argument(
        "--upstream-transport",
        default=None,
        help="upstream: websocket, http, or auto (WebSocket mode, HTTP if refused; default)",
    )
    p.add_argument(
        "--route-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other setting of the route, as in the config file's [models.<alias>] "
        "(a TOML value; repeatable), e.g. completions.context_window=8192",
    )
    p.add_argument(
        "--cache-responses", type=int, default=None, help="responses kept per stream cache (1)"
    )
    p.add_argument(
        "--delta-window-ms",
        type=float,
        default=None,
        help="after an item's first delta, wait this long to merge deltas into one event "
        "(default 2; 0 merges only deltas that are already waiting)",
    )
    p.add_argument("--no-coalesce", action="store_true", help="one event per engine token")
    p.add_argument(
        "--grace-period-s",
        type=float,
        default=None,
        help="on SIGTERM/SIGINT, how long in-flight responses may take to finish (10)",
    )
    p.add_argument(
        "--cache-budget-mb",
        type=float,
        default=None,
        help="memory budget of all stream caches together, MiB (1024); least recently used "
        "entries of any stream are evicted over it",
    )
    p.add_argument(
        "--write-timeout-s",
        type=float,
        default=None,
        help="cut off a client that reads nothing for this long (30)",
    )
    p.add_argument(
        "--no-journal",
        action="store_true",
        help="acknowledge responses before their ledger row and stored form are durable "
        "(faster by one group-committed fsync; a crash can lose acknowledged responses)",
    )
    p.add_argument(
        "--drain-notice-s",
        type=float,
        default=None,
        help="on SIGTERM, report NOT_SERVING this long before ending streams (0)",
    )
    p.add_argument(
        "--api-keys-file",
        default=None,
        help="file of 'KEY TENANT' lines; keys also come from $BIDI_RESPONSES_API_KEYS "
        "('KEY=TENANT,...'). With keys, every request must authenticate",
    )
    p.add_argument(
        "--allow-unauthenticated-public",
        action="store_true",
        help="without API keys, still bind a non-loopback --host (otherwise 127.0.0.1 is used)",
    )
    p.add_argument("--tls-cert", default=None, help="PEM certificate (chain) for gRPC and HTTP")
    p.add_argument("--tls-key", default=None, help="PEM private key for --tls-cert")
    p.add_argument(
        "--tls-client-ca", default=None, help="PEM CA bundle: require client certificates (mTLS)"
    )
    p.add_argument(
        "--otel-tracing",
        action="store_true",
        help="OpenTelemetry server spans on every transport (needs the 'otel' extra)",
    )
    add_workers_flag(p)
    p.add_argument("--log-level", default="INFO")


def _config(args: argparse.Namespace) -> ServerConfig:
    """The server configuration: the --config file, then the flags on top."""
    config = load_config(
        args.config,
        host=args.host,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        data_dir=args.data_dir,
        grace_period_s=args.grace_period_s,
    )
    explicit_engine = args.route_setting or any(
        v is not None
        for v in (
            args.engine,
            args.sim_tps,
            args.sim_ttft_ms,
            args.sim_prefill_tps,
            args.sim_tool_rounds,
            args.sim_seed,
            args.script,
            *(getattr(args, flag) for flag in _BACKEND_FLAGS),
        )
    )
    model = args.model or "sim-model"
    # A config file that lists its model aliases gets no extra default alias.
    if (
        explicit_engine
        or args.model is not None
        or (model not in config.models and args.config is None)
    ):
        config.models[model] = _route(args, config.models.get(model) or RouteConfig())
    if not config.models:
        raise ValueError("no model aliases: add [models.<alias>] to the config file")
    if args.store_url is not None:
        config.store.url = args.store_url
    check_store_url(config.store.url)
    if is_postgres_url(config.store.url):
        _require_extra("asyncpg", "postgres", "a PostgreSQL store")
    for route in config.models.values():
        if route.engine == "completions" and route.completions.tokenizer:
            # An open model's own tokenizer and chat template.
            _require_extra("tokenizers", "models", "an open model's tokenizer")
            _require_extra("jinja2", "models", "an open model's chat template")
    if args.cache_responses is not None:
        config.cache.max_responses = args.cache_responses
    if args.delta_window_ms is not None:
        config.streaming.delta_window_ms = args.delta_window_ms
    if args.no_coalesce:
        config.streaming.coalesce_deltas = False
    if args.drain_notice_s is not None:
        config.drain_notice_s = args.drain_notice_s
    if args.api_keys_file is not None:
        config.auth.api_keys_file = args.api_keys_file
    if args.otel_tracing:
        config.tracing = True
    if config.tracing:
        _require_extra("opentelemetry.instrumentation.grpc", "otel", "tracing")
    if args.allow_unauthenticated_public:
        config.auth.allow_unauthenticated_public = True
    for flag, field in (
        ("tls_cert", "cert_file"),
        ("tls_key", "key_file"),
        ("tls_client_ca", "client_ca_file"),
    ):
        value = getattr(args, flag)
        if value is not None:
            setattr(config.tls, field, value)
    if bool(config.tls.cert_file) != bool(config.tls.key_file):
        raise ValueError("TLS needs both a certificate (--tls-cert) and a key (--tls-key)")
    if args.workers is not None:
        config.workers = args.workers
    if config.workers < 1:
        raise ValueError(f"--workers must be at least 1, not {config.workers}")
    if args.cache_budget_mb is not None:
        config.cache.global_max_bytes = int(args.cache_budget_mb * 1024 * 1024)
    if args.write_timeout_s is not None:
        config.limits.write_timeout_s = args.write_timeout_s
    if args.no_journal:
        config.durability.journal = False
    # Without API keys: loopback only unless told otherwise (every worker builds this too).
    from .app import guard_public_bind

    config, _ = guard_public_bind(config)
    return config


#: The flags that configure a completions or upstream route, and the setting each one sets.
_BACKEND_FLAGS = {
    "backend_url": "base_url",
    "backend_model": "model",
    "backend_api_key_env": "api_key_env",
    "backend_format": "format",
    "backend_tokenizer": "tokenizer",
    "backend_chat_template": "chat_template",
    "backend_tool_call_format": "tool_call_format",
    "upstream_transport": "transport",
}


def _route(args: argparse.Namespace, route: RouteConfig) -> RouteConfig:
    """``route`` (the alias's route from the config file, or a new one) with the engine flags
    on top."""
    sim = route.sim
    if args.sim_tps is not None:
        sim.tokens_per_second = args.sim_tps
    if args.sim_ttft_ms is not None:
        sim.ttft_ms = args.sim_ttft_ms
    if args.sim_prefill_tps is not None:
        sim.prefill_tokens_per_second = args.sim_prefill_tps
    if args.sim_tool_rounds is not None:
        sim.tool_rounds = args.sim_tool_rounds
    if args.sim_seed is not None:
        sim.seed = args.sim_seed
    route.engine = args.engine or route.engine
    if args.script is not None:
        route.script_path = args.script
    for flag, setting in _BACKEND_FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        backend = {"completions": route.completions, "upstream": route.upstream}.get(route.engine)
        if backend is None or not hasattr(backend, setting):
            option = "--" + flag.replace("_", "-")
            raise ValueError(f"{option} does not apply to --engine {route.engine}")
        setattr(backend, setting, value)
    for setting in args.route_setting:
        apply_route_setting(route, setting)
    if route.engine not in ENGINE_KINDS:
        kinds = ", ".join(ENGINE_KINDS)
        raise ValueError(f"unknown engine {route.engine!r}; expected one of {kinds}")
    if route.engine == "script" and not route.script_path:
        raise ValueError("--engine script needs --script PATH")
    return route


def _require_extra(module: str, extra: str, what: str) -> None:
    """ValueError naming the extra to install when ``what`` needs an optional package."""
    try:
        missing = importlib.util.find_spec(module) is None
    except ImportError:  # a parent package is missing
        missing = True
    if missing:
        raise ValueError(f"{what} needs the '{extra}' extra: pip install 'bidi-responses[{extra}]'")


def config_from_args(argv: Sequence[str]) -> ServerConfig:
    """The configuration ``bidi-responses serve ARGV`` would run with (ValueError if bad)."""
    parser = argparse.ArgumentParser(prog="bidi-responses")
    _add_serve(parser.add_subparsers(dest="command", required=True))
    return _config(parser.parse_args(["serve", *argv]))


def _serve(args: argparse.Namespace) -> int:
    from .app import StartupError, serve

    try:
        config = _config(args)
    except (OSError, ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if config.workers > 1:
        from .workers import run_workers

        return run_workers(partial(_config, args), http=not args.no_http, log_level=args.log_level)
    handler = logging.StreamHandler()
    # Client strings can reach log lines; escaping them keeps every line the server's own.
    handler.setFormatter(EscapingFormatter(LOG_FORMAT))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    from .core.storage.store import StoreUnavailable

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(config, http=not args.no_http, reload=lambda: _config(args)))
    except StoreUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except StartupError as error:
        # One line, no traceback: what is wrong and where is all the operator needs.
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _add_usage(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("usage", help="summarize the usage ledger")
    p.add_argument("--data-dir", default=".bidi-responses", help="the server's data directory")
    p.add_argument(
        "--store-url", default=None, help="a shared store's postgresql://... URL instead"
    )
    p.add_argument(
        "--by",
        default="tenant",
        help="group by tenant, model, transport or status, or several joined by "
        "commas (default tenant)",
    )
    p.add_argument(
        "--since",
        default=None,
        help="only responses created since then: 15m, 2h, 7d, or a unix time",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _usage(args: argparse.Namespace) -> int:
    from .usage import print_usage

    source = args.store_url or args.data_dir
    if is_postgres_url(source):
        try:
            _require_extra("asyncpg", "postgres", "a PostgreSQL store")
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    return print_usage(source, by=args.by, as_json=args.json, since=args.since)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = argparse.ArgumentParser(
        prog="bidi-responses",
        description="The Responses API over a gRPC bidi stream, HTTP+SSE and WebSocket.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    _add_usage(sub)
    from bidi_responses.bench.cli import add_compare

    add_compare(sub)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "usage":
        return _usage(args)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.error(f"unknown command {args.command}")
    if args.command == "compare":
        try:
            for module in ("tqdm", "psutil", "matplotlib"):
                _require_extra(module, "bench", "compare")
        except ValueError as error:
            parser.exit(2, f"error: {error}\n")
    result: int = handler(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
