"""argparse types every subcommand uses: Go-style durations and booleans, sizes, ports, counts.

This module imports nothing of epp's but units, so every subcommand's flag module can use its types
without importing `epp.cli` (which imports them all). `epp.flags` re-exports them.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from fractions import Fraction

from epp.units import parse_duration


def duration(text: str) -> float:
    """Go-style durations: '50ms', '2s', '1.5s', '1m30s'; a bare number is seconds."""
    try:
        return parse_duration(text, bare_seconds=True)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def go_bool(g: argparse._ArgumentGroup, name: str, *, default: bool | None, help: str) -> None:
    """A boolean flag in Go's forms, as GIE's binary takes them: `--name`, `--name=true|false`."""
    g.add_argument(f"--{name}", type=boolean, nargs="?", const=True, default=default, help=help)


def byte_size(text: str) -> int:
    match = re.match(r"^(\d+)\s*([kKmMgG]i?[bB]?)?$", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 16Mi, 1048576)")
    unit = (match.group(2) or "").lower()[:1]
    return int(match.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit]


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc


def _integer_at_least(text: str, least: int) -> int:
    value = _integer(text)
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}: {text!r}")
    return value


def non_negative_int(text: str) -> int:
    return _integer_at_least(text, 0)


def positive_int(text: str) -> int:
    return _integer_at_least(text, 1)


def model_length(text: str) -> tuple[str, int]:
    """`--max-model-len` values: `MODEL=N` for one model, `N` for every model (model "*")."""
    model, sep, number = text.rpartition("=")
    if sep and not model:
        raise argparse.ArgumentTypeError(f"the model name before '=' is empty: {text!r}")
    return (model if sep else "*", positive_int(number))


def workers_count(text: str) -> int:
    """`--workers`: N >= 1, or `auto`/0 (0 stands for auto)."""
    if text.strip().lower() == "auto":
        return 0
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number of workers: {text!r} (N or auto)") from exc
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be auto, 0 (auto) or at least 1: {text!r}")
    return value


def port_number(text: str) -> int:
    value = _integer(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port in 1-65535: {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def ratio(text: str) -> float:
    """A share between 0 and 1."""
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1: {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if value < 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def bind_address(text: str) -> str:
    """`--bind-address`: an IP literal, `[v6]` with or without brackets, or a host name; returned
    without brackets (the listeners add what their address syntax needs)."""
    value = text.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    if not value:
        raise argparse.ArgumentTypeError("an empty address: give 0.0.0.0 or :: for every address")
    if ":" in value:
        try:
            ipaddress.IPv6Address(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an IPv6 address: {text!r}") from None
    elif not re.fullmatch(r"[A-Za-z0-9.-]+", value):
        raise argparse.ArgumentTypeError(f"not an address or host name: {text!r}")
    return value


_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
_QUANTITY_SCALE = {
    **{s: 1024**i for i, s in enumerate(("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: 1000**i for i, s in enumerate(("", "k", "M", "G", "T", "P", "E"))},
}


def quantity_bytes(text: str) -> int:
    """A size as llm-d's `--grpc-max-*-msg-size` reads it: a Kubernetes quantity (`10Mi`, `25M`,
    `1e6`, `1.5Ki`) after a trailing `B`/`b` is dropped (`10MiB`, `25MB`); a whole number >= 0."""
    value = text.strip()
    if len(value) > 1 and value[-1] in "Bb":
        value = value[:-1]
    match = _QUANTITY.match(value)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 10MiB, 25MB, 4194304)")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        # Exact arithmetic: 1.5Ki is 1536 bytes, 0.1 is not a whole number of bytes.
        amount = Fraction(number)
        if suffix[:1] in ("e", "E"):
            amount *= Fraction(10) ** int(suffix[1:])
        elif suffix in ("n", "u", "m"):
            amount /= {"n": 10**9, "u": 10**6, "m": 10**3}[suffix]
        else:
            amount *= _QUANTITY_SCALE[suffix]
    except (ValueError, OverflowError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if amount < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative: {text!r}")
    if amount.denominator != 1:
        raise argparse.ArgumentTypeError(f"not a whole number of bytes: {text!r}")
    if amount >= 1 << 63:
        raise argparse.ArgumentTypeError(f"overflows the maximum supported size: {text!r}")
    return int(amount)


# GIE's logging verbosity levels (its logutil): V(2) is the default, V(4) debug, V(5) trace.
GIE_DEFAULT_VERBOSITY = 2


def zap_level(text: str) -> str:
    """controller-runtime's --zap-log-level: debug, info, error, panic, or an integer > 0."""
    value = text.strip().lower()
    if value in ("debug", "info", "error", "panic"):
        return value
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a zap level: {text!r} (debug, info, error, panic or N > 0)"
        ) from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"a numeric zap level must be > 0: {text!r}")
    return value


def verbosity_level(v: int) -> str:
    """A klog/logr verbosity (-v N) as a Python level: GIE logs most lines at V(2), debug at V(4)."""
    if v >= 4:
        return "debug"
    if v >= GIE_DEFAULT_VERBOSITY:
        return "info"
    return "warning"
