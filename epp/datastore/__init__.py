"""Endpoints of the pool, what we know of each (scraped metrics, epp's own in-flight load) and the
sources that feed them (standalone list or file; the Kubernetes operator in epp.k8s)."""
