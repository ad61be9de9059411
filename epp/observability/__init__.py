"""epp's own Prometheus metrics and structured logging."""

# The scrape-time collectors register with metrics.REGISTRY on import: importing them with the
# package keeps their series in every process that exports metrics, whoever imported what first.
from epp.observability import collectors as collectors
from epp.observability import llmd_metrics as llmd_metrics
