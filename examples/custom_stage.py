"""Two custom pipeline stages, ready to plug in through the configuration.

``KeywordClassifier`` is the smallest useful stage: it flags (or blocks) new items that contain
words an operator lists. ``ModelClassifier`` is model-backed: it scores text with a model that
is too slow for the event loop, so it runs the model in a thread or a process pool.

Use them from a TOML file passed to ``bidi-responses serve --config``::

    stages = ["validation", "secrets", "injection",
              "examples.custom_stage:KeywordClassifier",
              "examples.custom_stage:ModelClassifier"]

    [stage_settings."examples.custom_stage:KeywordClassifier"]
    words = ["DROP TABLE", "rm -rf /"]
    block = true

    [stage_settings."examples.custom_stage:ModelClassifier"]
    threshold = 0.7
    executor = "process"

The module must be importable (run the server from the repository root with
``PYTHONPATH=.``), or name the file instead: ``"examples/custom_stage.py:KeywordClassifier"``.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import re
import threading
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.pipeline import Flag, StageInput, iter_texts


class KeywordClassifier:
    """Flags new items that contain one of ``words`` (case-insensitive); ``block`` rejects
    the request instead. Carried state: how many items it flagged in this conversation."""

    def __init__(
        self,
        *,
        words: list[str] | tuple[str, ...] = ("rm -rf /", "DROP TABLE"),
        block: bool = False,
        name: str = "keywords",
    ) -> None:
        if not words:
            raise ValueError("words must not be empty")
        self.name = name
        self.block = block
        self.words = [w.lower() for w in words]

    async def examine(self, batch: StageInput, carried: dict[str, Any]) -> list[Flag]:
        """Look at the new items only; the pipeline counts them and times this call."""
        flags = []
        for item, path in zip(batch.items, batch.paths, strict=True):
            for where, text in iter_texts(item, path):
                lowered = text.lower()
                hits = [w for w in self.words if w in lowered]
                if not hits:
                    continue
                if self.block:
                    raise ApiError(
                        f"Request blocked: '{where}' contains a forbidden phrase.",
                        code="forbidden_content",
                        param=where,
                    )
                carried["flagged"] = carried.get("flagged", 0) + 1
                flags.append(
                    Flag(self.name, "keyword_match", where, f"{len(hits)} listed phrase(s)")
                )
        return flags


# -- a model-backed classifier -----------------------------------------------------------------

# The "model": a bag-of-words logistic regression with fixed weights. It stands in for what a
# real deployment loads once per process (an ONNX or torch model): CPU-bound, and too slow to
# run on the event loop for large inputs.
_WEIGHTS = {
    "password": 1.6,
    "secret": 1.2,
    "token": 0.8,
    "credential": 1.4,
    "private": 0.6,
    "ignore": 0.9,
    "instructions": 1.1,
    "exfiltrate": 2.5,
    "urgent": 0.7,
    "wire": 0.9,
    "transfer": 0.6,
    "bitcoin": 1.5,
    "immediately": 0.5,
}
_BIAS = -3.0
_WORD = re.compile(r"[a-z]+")


def predict(texts: list[str]) -> list[float]:
    """Model inference: one probability per text. Runs in a worker thread or process."""
    scores = []
    for text in texts:
        logit = _BIAS
        for word in _WORD.findall(text.lower()):
            logit += _WEIGHTS.get(word, 0.0)
        scores.append(1 / (1 + math.exp(-max(min(logit, 50.0), -50.0))))
    return scores


def _predict_with_thread(texts: list[str]) -> tuple[list[float], str]:
    return predict(texts), threading.current_thread().name


class ModelClassifier:
    """Scores new items with ``predict`` off the event loop and flags those above
    ``threshold``.

    ``executor``: ``"thread"`` (default; right for models that release the GIL, such as
    ONNX Runtime or torch) or ``"process"`` (a process pool, for pure-Python models that hold
    the GIL). Carried state: the highest score seen in the conversation, a single float.
    """

    def __init__(
        self,
        *,
        threshold: float = 0.8,
        executor: str = "thread",
        max_workers: int = 1,
        name: str = "model",
    ) -> None:
        if not 0 < threshold < 1:
            raise ValueError("threshold must be between 0 and 1")
        self.name = name
        self.threshold = threshold
        self._executor: Executor
        if executor == "thread":
            self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="model-stage")
        elif executor == "process":
            # "forkserver" (not fork): the server process has gRPC threads.
            context = multiprocessing.get_context("forkserver")
            self._executor = ProcessPoolExecutor(max_workers, mp_context=context)
        else:
            raise ValueError("executor must be 'thread' or 'process'")
        self.kind = executor
        self.last_worker: str | None = None  # for tests and curiosity: where inference ran

    async def examine(self, batch: StageInput, carried: dict[str, Any]) -> list[Flag]:
        """Batch the new items' text into one model call, awaited off the event loop."""
        pairs = [
            pair
            for item, path in zip(batch.items, batch.paths, strict=True)
            for pair in iter_texts(item, path)
        ]
        if not pairs:
            return []
        texts = [text for _, text in pairs]
        loop = asyncio.get_running_loop()
        if self.kind == "thread":
            scores, self.last_worker = await loop.run_in_executor(
                self._executor, _predict_with_thread, texts
            )
        else:
            scores = await loop.run_in_executor(self._executor, predict, texts)
            self.last_worker = "process"
        carried["max_score"] = max([carried.get("max_score", 0.0), *scores])
        return [
            Flag(self.name, "model_flagged", where, f"score {score:.2f} >= {self.threshold}")
            for (where, _), score in zip(pairs, scores, strict=True)
            if score >= self.threshold
        ]

    def close(self) -> None:
        """Called once when the server stops: release the workers."""
        self._executor.shutdown(wait=True, cancel_futures=True)
