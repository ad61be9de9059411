"""Gateway-side tooling: Envoy bootstrap configs that put epp in front of model servers.

Not part of epp's data path; used by the demo, the end-to-end tests and the benchmarks.
"""
