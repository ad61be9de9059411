"""The scheduling framework (filter -> score -> pick per profile) and its built-in plugins.

It knows nothing of gRPC or Kubernetes: it sees an `epp.api.requests.InferenceRequest` and a list of
`epp.datastore.endpoints.Endpoint`, and returns the endpoints to try, in order.
"""
