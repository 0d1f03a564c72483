"""The start/stop context manager of every process wrapper (servers, PostgreSQL, a cluster)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ["ManagedService"]


class ManagedService(ABC):
    """Something started and stopped around a ``with`` block, and stopped if it fails to start."""

    @abstractmethod
    def start(self) -> object:
        """Start, and wait until ready."""

    @abstractmethod
    def stop(self) -> None:
        """Stop and clean up; safe to call more than once and after a failed start."""

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
