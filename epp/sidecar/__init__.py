"""`epp sidecar`: llm-d's prefill/decode routing-sidecar protocol beside a decode pod
(`protocol`: the bodies and headers; `proxy`: the aiohttp server; `cli`: the command)."""
