"""A conversation's reusable state and the caches that keep it between turns."""
