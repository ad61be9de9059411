"""Tokenizers: the token ids a model server will compute for a prompt, for prefix-aware routing.

`tokenizer.Tokenizer` is one model's tokenizer, loaded from Hugging Face files (`tokenizer.json`
and friends); `chat` renders chat requests with the model's chat template after the reshaping
vLLM's chat endpoint applies; `registry.Tokenizers` maps model names to tokenizers and encodes
off the event loop.
`data/` holds epp-tiny, the small byte-level BPE shipped with epp (built by
scripts/build_tokenizer.py), which `epp serve` and the simulator share when nothing else is
configured. This package imports nothing else from epp.
"""
