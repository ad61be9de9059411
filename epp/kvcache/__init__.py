"""Where KV blocks live: vLLM KV-event decoding, epp's own block keys, and the block -> pods index.

This package knows nothing of ZMQ or gRPC: ingestion hands it decoded batches, the scheduler asks
it for prefix matches.
"""
