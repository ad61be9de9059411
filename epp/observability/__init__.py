"""epp's own Prometheus metrics and structured logging."""
