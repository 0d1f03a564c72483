"""The core: requests and items, per-stream state and cache, rendering, and the runner."""
