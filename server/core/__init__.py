"""The core: requests and tools, sessions and lanes, per-stream state and cache, rendering,
the response runner and its steps, the router and the post-inference queue."""
