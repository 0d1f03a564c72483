"""llama.cpp serving the tiny generated model, in its own process: the comparison's real engine.

``python -m bidi_responses.bench.llama_backend --port 0`` writes the tiny model
(``bench.tiny_gguf``: a real ``llama`` GGUF over the renderer's own vocabulary) and serves it
with llama.cpp's own server (xllamacpp's CPU build), one slot and one thread, so its prefix
(KV) cache follows the rollout under test. It prints ``listening on <base URL>`` once ready,
and stops on SIGTERM or SIGINT. Its CPU time is read apart from the API server's, as the
simulated engine's is.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import xllamacpp
from bidi_responses.server.core.rendering.tokenizer import load_encoding

from .tiny_gguf import N_CTX, write_tiny_model

__all__ = ["main"]


def serve(model: Path, host: str, port: int, threads: int) -> None:
    """Serve ``model`` until SIGTERM or SIGINT; print the base URL once listening."""
    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.n_ctx = N_CTX
    params.n_parallel = 1
    params.hostnames = [host]
    params.port = port
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    stopping = (signal.SIGTERM, signal.SIGINT)
    # Blocked before llama.cpp starts its threads, so the signals reach sigwait below.
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
    server = xllamacpp.Server(params)
    try:
        print(f"listening on {str(server.listening_address).rstrip('/')}/v1", flush=True)
        signal.sigwait(stopping)
    finally:
        del server  # the destructor stops llama.cpp's loop and HTTP threads


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp's threads (1)")
    parser.add_argument("--model", type=Path, help="where to write the model (a temporary file)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tiny-llama-") as scratch:
        model = args.model or Path(scratch) / "tiny.gguf"
        if not model.exists():
            write_tiny_model(model, load_encoding())
        serve(model, args.host, args.port, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
