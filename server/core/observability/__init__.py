"""What the server reports about itself: counters, Prometheus metrics, log-safe client text."""
