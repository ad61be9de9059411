"""epp's own gRPC API (protos/epp/rpc/v1/endpoint_picker.proto) and its HTTP twin.

The protobuf modules under epp/rpc/v1/ are generated at build time by setup.py; they are not
committed. `service.py` implements the API over the Director; `http.py` serves the same answers as
JSON on the metrics port.
"""
