"""Simulated model servers for the demo, the end-to-end tests and the benchmarks."""
