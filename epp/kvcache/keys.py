"""epp's own block keys: chained per-block hashes of token ids, independent of the engine's hashing.

vLLM's block hashes depend on `--prefix-caching-hash-algo`, the engine's hash seed, the vLLM version
and (from 0.31) the LoRA path, so epp never recomputes them (see docs on the two-key index in
`epp.kvcache.index`). Instead both sides of the index speak this module's keys: the scorer hashes a
request's prompt token ids, and event ingestion hashes the `token_ids` a `BlockStored` carries. Same
tokens, same block size, same seed -> same keys.

Scheme:
- Only full blocks get a key; a trailing partial block is dropped, as vLLM caches only full blocks.
- `key_i = hash((key_{i-1}, block_i)) & (2**60 - 1)` with `block_i` the tuple of the block's token
  ids, so a key stands for the whole prefix up to and including its block. The chain starts from a
  seed (`seed_for`: model, LoRA adapter, cache salt), or from the key of the block just before.
- Computed in C (`epp/kvcache/_keys.c`: CPython's tuple hash written out, no tuple built; the
  values are exactly Python's `hash((h, tuple(block)))`, which the tests check). CPython's `hash`
  of a tuple of ints is not randomised: `PYTHONHASHSEED` salts only str, bytes and
  datetime hashes. An int hashes to itself modulo 2**61 - 1 and a tuple combines its items' hashes
  with the fixed xxHash-style mixer of CPython >= 3.8, so keys are the same in every process and on
  every 64-bit machine running the same CPython. tests/kvcache/test_keys.py checks this against a
  pure-integer re-implementation of that mixer and in a subprocess with another `PYTHONHASHSEED`.
  The C code fixes the mixer of CPython 3.8-3.13, so a future CPython that changed tuple hashing
  would not change the keys; the tests would say that they no longer equal its `hash`.
- Collisions: keys are 60-bit, so among 10M distinct blocks the chance of any is ~4e-5. They are
  not resistant to a crafted prompt, which at worst skews a routing hint (the model server checks
  its own cache).
- Keys are 60-bit, i.e. uint64 values with the top 4 bits clear: CPython stores an int below 2**60
  in two 30-bit digits, a 32-byte object instead of 48 (measured with RSS over 2M keys; the
  index keeps one such object per distinct block).

Cost (tests/kvcache/bench_index.py keys, Python 3.11, this machine): see
docs/bench/microbenchmarks.md#kv-index. In Python (a list comprehension over
`zip(*[iter(ids)] * 16)`, the fastest of the pure-Python forms measured) it was 195-300 ns per
block, 51 us for a 4k-token prompt; slicing the list into tuples 64-75 us; blake2b(digest_size=8)
over `array('q')` bytes 250 us. blake2b is used only for the seed, once per model.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import NewType, cast

from epp.kvcache import _keys

BlockKey = NewType("BlockKey", int)
"""A block key: an int in [0, 2**60), standing for a token prefix ending at a block boundary."""

KEY_MASK = (1 << 60) - 1


@functools.lru_cache(maxsize=1024)
def seed_for(model: str, *, lora_name: str | None = None, cache_salt: str | None = None) -> int:
    """The root of a key chain: the parent of a sequence's first block, in [0, 2**60).

    blake2b over a length-prefixed encoding of the three fields, so it is the same in every
    process (Python's str hash is salted per process) and no two field combinations share an
    encoding. Cached: a handful of models and adapters hit this on every request.
    """
    h = hashlib.blake2b(digest_size=8, person=b"epp.kv.seed.v1")
    for field in (model, lora_name, cache_salt):
        if field is None:
            h.update(b"\x00")
        else:
            raw = field.encode("utf-8", "surrogatepass")
            h.update(b"\x01" + len(raw).to_bytes(4, "big") + raw)
    return int.from_bytes(h.digest(), "big") & KEY_MASK


def block_keys(
    token_ids: Sequence[int], block_size: int, *, seed: int, parent: int | None = None
) -> list[BlockKey]:
    """The chained keys of the full blocks of `token_ids`, one per `block_size` tokens.

    Args:
        token_ids: the tokens, starting at a block boundary.
        block_size: tokens per block (> 0).
        seed: the chain root (`seed_for`), used when `parent` is None.
        parent: the key of the block just before `token_ids[0]`, to continue a chain; the
            seed is then not used (the parent key already covers it).
    """
    return cast(list[BlockKey], _keys.chain(token_ids, block_size, seed if parent is None else parent))
