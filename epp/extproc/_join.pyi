"""Types of the GIL-free join (epp/extproc/_join.c)."""

from collections.abc import Sequence

def join(parts: Sequence[bytes | bytearray | memoryview], /) -> bytes: ...
