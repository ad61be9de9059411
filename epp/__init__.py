"""epp: a KV-cache-aware Endpoint Picker for LLM inference.

Layers (enforced by import-linter, see pyproject.toml and docs/architecture.md):

    epp.cli ─► epp.extproc ─► epp.requestcontrol ─► epp.scheduling ─► epp.datastore / epp.api

The data path (extproc) knows nothing of Kubernetes; the scheduler knows nothing of gRPC.
"""

__version__ = "0.1.0"
