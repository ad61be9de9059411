from __future__ import annotations

import random

from epp.bench.words import WordCodec
from epp.tokenize.tokenizer import load_shipped


def test_text_tokenizes_back_to_the_mapped_ids() -> None:
    codec = WordCodec()
    tok = load_shipped()
    rng = random.Random(3)
    for _ in range(20):
        ids = [rng.randrange(32_000) for _ in range(rng.randrange(1, 600))]
        text = codec.text(ids)
        assert tok.encode(text, add_special_tokens=False) == codec.pod_ids(ids)


def test_a_shared_id_prefix_is_a_shared_text_prefix() -> None:
    codec = WordCodec()
    shared = list(range(100, 400))
    a, b = codec.text([*shared, 7, 8]), codec.text([*shared, 9])
    assert a.startswith(codec.text(shared)) and b.startswith(codec.text(shared))
    assert a != b
