"""The request lifecycle, independent of the proxy protocol: parse -> candidates -> schedule ->
book load -> (response path) -> release. The ext-proc layer drives it; it knows nothing of gRPC."""
