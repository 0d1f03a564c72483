"""Model routing: a model alias resolves to an engine and its settings.

Resolution builds (or finds) the engine for the alias. A stream resolves once and reuses the
route while the model stays the same; a change of model resolves again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bidi_responses.server.config import RouteConfig
from bidi_responses.server.core.errors import ApiError
from bidi_responses.server.engines.base import Engine


@dataclass(frozen=True, slots=True)
class Route:
    """A resolved model: the alias, its engine and a key of the settings it was built from."""

    alias: str
    engine: Engine
    settings_key: str


EngineBuilder = Callable[[RouteConfig], Engine]


class Router:
    """Maps model aliases to engines; counts resolutions."""

    def __init__(self, routes: dict[str, RouteConfig], build_engine: EngineBuilder) -> None:
        self._routes = dict(routes)
        self._build_engine = build_engine
        self._engines: dict[str, Engine] = {}
        self.resolutions = 0

    @property
    def aliases(self) -> list[str]:
        """Known model aliases, sorted."""
        return sorted(self._routes)

    def route_key(self, model: str) -> tuple[str, int]:
        """What a cached route depends on: the alias and the identity of its settings."""
        return (model, id(self._routes.get(model)))

    def resolve(self, model: str) -> Route:
        """Resolve ``model``; ApiError (404-like 400) listing the known aliases if unknown."""
        self.resolutions += 1
        config = self._routes.get(model)
        if config is None:
            raise ApiError(
                f"The model '{model}' does not exist. Known models: {', '.join(self.aliases)}.",
                code="model_not_found",
                param="model",
                status=400,
            )
        engine = self._engines.get(model)
        if engine is None:
            engine = self._engines[model] = self._build_engine(config)
        return Route(alias=model, engine=engine, settings_key=_settings_key(config))

    def engines(self) -> list[Any]:
        """Engines built so far."""
        return list(self._engines.values())


def _settings_key(config: RouteConfig) -> str:
    return repr(config)
