"""Benchmarks run by `epp bench ...`; each module exposes add_arguments(parser) and run(args)."""
