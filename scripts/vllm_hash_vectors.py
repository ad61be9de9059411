"""Block-hash vectors computed by vLLM 0.32 itself, for tests/sim/test_vllm_hashes.py.

Run with the real vLLM's Python (the venv of `scripts/vllm-env`), once per seed setting, since vLLM
reads PYTHONHASHSEED when it computes NONE_HASH:

    for seed in unset 0 42; do
      if [ $seed = unset ]; then env -u PYTHONHASHSEED .venv-vllm/bin/python scripts/vllm_hash_vectors.py;
      else PYTHONHASHSEED=$seed .venv-vllm/bin/python scripts/vllm_hash_vectors.py; fi
    done > tests/sim/data/vllm_hashes.jsonl

Each line: the algorithm, the seed (null: unset), block size, token ids, LoRA (name, path), cache
salt, and the hex digests of the full blocks from vLLM's `hash_block_tokens` with the extra keys
vLLM's `generate_block_hash_extra_keys` gives a request with that adapter and salt.
"""

from __future__ import annotations

import json
import os
import random

from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils


def digests(hash_fn, tokens, block_size, lora, salt):  # type: ignore[no-untyped-def]
    out, parent = [], None
    for i in range(len(tokens) // block_size):
        keys = []
        if lora is not None:
            keys.append(("lora", lora[0], lora[1]))
        if i == 0 and salt:
            keys.append(("cache_salt", salt))
        h = kv_cache_utils.hash_block_tokens(
            hash_fn, parent, tokens[i * block_size : (i + 1) * block_size], tuple(keys) or None
        )
        out.append(bytes(h).hex())
        parent = h
    return out


def main() -> None:
    rng = random.Random(7)
    for algo in ("sha256", "sha256_cbor"):
        hash_fn = get_hash_fn_by_name(algo)
        kv_cache_utils.init_none_hash(hash_fn)
        for block_size, lora, salt in (
            (16, None, None),
            (32, None, None),
            (16, ("adapter-a", "/models/adapter-a"), None),
            (16, None, "salt-1"),
            (16, ("adapter-b", "/models/adapter-b"), "salt-2"),
        ):
            tokens = [rng.randrange(0, 200_000) for _ in range(block_size * 3 + 5)]
            print(
                json.dumps(
                    {
                        "algo": algo,
                        "seed": os.environ.get("PYTHONHASHSEED"),
                        "block_size": block_size,
                        "token_ids": tokens,
                        "lora": lora,
                        "cache_salt": salt,
                        "digests": digests(hash_fn, tokens, block_size, lora, salt),
                    }
                )
            )


if __name__ == "__main__":
    main()
