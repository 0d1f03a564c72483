"""What the server reports about itself: counters, Prometheus metrics, log-safe client text."""

from .counters import Counters, ServerStats
from .gc_pauses import freeze_startup_heap
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .ratelimit import CLIENT_FAULTS, RateLimitFilter

__all__ = [
    "CLIENT_FAULTS",
    "CONTENT_TYPE_LATEST",
    "Counters",
    "Metrics",
    "RateLimitFilter",
    "ServerStats",
    "freeze_startup_heap",
]
