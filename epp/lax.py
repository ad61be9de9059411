"""Values read as pydantic 2's lax mode reads a JSON body's fields (vLLM's request models).

vLLM validates every request body with pydantic models in lax mode, which converts some values
("5" is an int, 1.0 is an int, "yes" is a bool) and refuses others. epp refuses (400) where vLLM's
model would, so it reads fields the same way. Each reader returns the converted value, or None
when pydantic would refuse it. Observed on vLLM 0.32's pydantic (2.12). Shared by `epp.api` and
`epp.tokenize`, which import nothing of each other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeGuard

# pydantic's int from a string: optional sign, digits with single underscores between them,
# optionally a fraction of zeros; spaces around.
_INT_TEXT = re.compile(r"\s*[+-]?\d(?:_?\d)*(?:\.0*)?\s*")
_TRUE_STRINGS = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_STRINGS = frozenset({"0", "off", "f", "false", "n", "no"})


def lax_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        # pydantic refuses a fraction, and a float too large to be an exact integer
        return int(value) if value.is_integer() and abs(value) < 2**53 else None
    if isinstance(value, str) and _INT_TEXT.fullmatch(value):
        return int(value.strip().replace("_", "").split(".")[0])
    return None


def lax_float(value: Any) -> float | None:
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # Python's float() takes what pydantic takes: "1e3", " 5", "inf", "1_0"
        except ValueError:
            return None
    return None


def lax_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, float) and value in (0.0, 1.0):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_STRINGS:
            return True
        if word in _FALSE_STRINGS:
            return False
    return None


def is_object(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """A JSON object: what a `dict[str, Any]` field accepts."""
    return isinstance(value, Mapping)
