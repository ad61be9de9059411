"""End-to-end tests: a real Envoy, `epp serve` and simulated model servers (marker `e2e`)."""
