"""The Envoy ext-proc data path: the gRPC stream state machine and its protobuf messages.

This package is the only place that knows Envoy's protocol. It turns ext-proc messages into calls
on `epp.requestcontrol` and the results back into ext-proc responses.
"""
