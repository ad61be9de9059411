"""`--tokenizer` values (`PATH` or `MODEL=PATH`), parsed but not loaded: `epp.tokenize.registry`
loads them (docs/tokenization.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path


@dataclasses.dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Parsed `--tokenizer` values: a default path and per-model paths, not yet loaded."""

    default: Path | None = None
    by_model: Mapping[str, Path] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.default is not None or bool(self.by_model)


def parse_tokenizer_arg(values: list[str]) -> TokenizerSpec:
    """Parse `--tokenizer` values (`PATH` or `MODEL=PATH`). Raises ValueError naming the bad value."""
    default: Path | None = None
    by_model: dict[str, Path] = {}
    for raw in values:
        value = raw.strip()
        if not value:
            raise ValueError("--tokenizer: empty value (expected PATH or MODEL=PATH)")
        if "=" in value:
            model, _, path = (part.strip() for part in value.partition("="))
            if not model:
                raise ValueError(f"--tokenizer {raw!r}: the model name before '=' is empty")
            if not path:
                raise ValueError(f"--tokenizer {raw!r}: the path after '=' is empty")
            if model in by_model:
                raise ValueError(
                    f"--tokenizer {raw!r}: model {model!r} already has a tokenizer ({by_model[model]})"
                )
            by_model[model] = Path(path)
        elif default is not None:
            raise ValueError(
                f"--tokenizer {raw!r}: a default tokenizer is already given ({default}); "
                "use MODEL=PATH for per-model tokenizers"
            )
        else:
            default = Path(value)
    return TokenizerSpec(default=default, by_model=by_model)
