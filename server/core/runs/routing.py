"""Model routing: a model alias resolves to an engine and its settings.

Resolution builds (or finds) the engine for the alias. A stream lane resolves once and reuses
the route while the model and the alias's settings stay the same (``route_key``); a change of
model, or new settings for the alias (``update``, e.g. on SIGHUP), resolves again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ...config import RouteConfig
from ..api.errors import ApiError, shown
from ..ports import Engine, close_engine


@dataclass(frozen=True, slots=True)
class Route:
    """A resolved model: the engine that serves it (a lane keeps it while ``route_key``
    stays the same)."""

    engine: Engine


EngineBuilder = Callable[[RouteConfig], Engine]


class Router:
    """Maps model aliases to engines; counts resolutions."""

    def __init__(self, routes: Mapping[str, RouteConfig], build_engine: EngineBuilder) -> None:
        self._routes = dict(routes)
        self._build_engine = build_engine
        self._engines: dict[str, Engine] = {}
        # Bumped whenever an alias's settings change, so that cached routes go stale.
        self._versions: dict[str, int] = dict.fromkeys(self._routes, 0)
        self.resolutions = 0
        # Engines replaced by ``update`` still finishing their in-flight work.
        self._retired: set[asyncio.Task[None]] = set()

    @property
    def aliases(self) -> list[str]:
        """Known model aliases, sorted."""
        return sorted(self._routes)

    def engine_name(self, model: str) -> str | None:
        """The engine kind configured for ``model`` ("sim", "script", ...), None if unknown."""
        config = self._routes.get(model)
        return config.engine if config is not None else None

    def route_key(self, model: str) -> tuple[str, int]:
        """What a cached route depends on: the alias and the version of its settings."""
        return (model, self._versions.get(model, -1))

    def resolve(self, model: str) -> Route:
        """Resolve ``model``; ApiError (400 ``model_not_found``) listing the known aliases."""
        self.resolutions += 1
        config = self._routes.get(model)
        if config is None:
            raise ApiError(
                f"The model '{shown(model)}' does not exist. Known models: "
                f"{', '.join(self.aliases)}.",
                code="model_not_found",
                param="model",
                status=400,
            )
        engine = self._engines.get(model)
        if engine is None:
            engine = self._engines[model] = self._build_engine(config)
        return Route(engine)

    def build_all(self) -> None:
        """Build every alias's engine now, so a bad route stops the server at start-up
        instead of failing each request (ValueError/OSError naming the alias)."""
        for alias, config in self._routes.items():
            if alias in self._engines:
                continue
            try:
                self._engines[alias] = self._build_engine(config)
            except (OSError, ValueError) as error:
                raise ValueError(f"model '{alias}': {error}") from error

    def update(self, routes: Mapping[str, RouteConfig]) -> list[str]:
        """Replace the routes; returns the aliases added, changed or removed (sorted).

        A changed alias gets a new engine on its next resolution, and every stream that cached
        it resolves again; unchanged aliases keep their engines and cached routes.
        """
        changed: list[str] = []
        for alias in set(self._routes) | set(routes):
            old, new = self._routes.get(alias), routes.get(alias)
            if old == new:
                continue
            changed.append(alias)
            self._versions[alias] = self._versions.get(alias, 0) + 1
            self._retire(self._engines.pop(alias, None))
        self._routes = dict(routes)
        return sorted(changed)

    def _retire(self, engine: Engine | None) -> None:
        # A replaced engine may still serve responses in flight; its ``aclose`` waits for them
        # (see CompletionsEngine), so it runs as a task and the reload is not blocked.
        if engine is None or getattr(engine, "aclose", None) is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(close_engine(engine))
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    async def aclose(self) -> None:
        """Release every engine's resources (connection pools); on server stop."""
        engines = list(self._engines.values())
        self._engines.clear()
        for engine in engines:
            await close_engine(engine)
        if self._retired:
            await asyncio.gather(*self._retired, return_exceptions=True)
