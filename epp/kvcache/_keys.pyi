"""Types of the C block keys (epp/kvcache/_keys.c)."""

from collections.abc import Sequence

def chain(token_ids: Sequence[int], block_size: int, h: int) -> list[int]: ...
