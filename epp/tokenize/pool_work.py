"""What the tokenizer pool's threads run (`epp.tokenize.registry.Tokenizers`): each call is
handed to a worker with positional arguments only (`run_in_executor`), and the commit thread
runs below the process's priority."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from epp.tokenize import prefixcache, tokenizer

log = logging.getLogger("epp.tokenize")


def encode_cached(
    cache: prefixcache.PrefixCache, text: str, add_special_tokens: bool, found: prefixcache.Lookup
) -> list[int]:
    # `tokenizers` engine: cached before the request gets its ids. Answering first and committing
    # after took only ~0.1 ms off a warm 4k-token chat, but a request following at once then missed
    # the text, and the commit's GIL-holding chunking overlapped the next encode (bench_loop_lag
    # p99 7 -> 11 ms in one run on a loaded machine). With the fast engine the commit is the
    # `tokenizers` encode itself, ~80% of the work, so there the request does not wait for it.
    ids, commit = cache.begin(text, add_special_tokens=add_special_tokens, found=found, fast=False)
    commit()
    return ids


COMMIT_NICENESS = 10  # added to the process's own niceness (Linux caps the sum at 19)


def lower_priority() -> None:
    """Run this thread COMMIT_NICENESS below the process's priority (Linux schedules threads by
    their own nice value). Relative, so a process started niced keeps its commits below it."""
    try:
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + COMMIT_NICENESS))
    except (AttributeError, OSError) as e:  # not Linux, or a sandbox that forbids it
        log.debug("commit thread keeps its priority: %s", e)


def cached(
    cache: prefixcache.PrefixCache, text: str, add_special_tokens: bool, found: prefixcache.Lookup
) -> list[int] | None:
    return cache.cached(text, add_special_tokens=add_special_tokens, found=found)


def begin(
    cache: prefixcache.PrefixCache,
    text: str,
    add_special_tokens: bool,
    found: prefixcache.Lookup,
    fast: bool | None,
) -> tuple[list[int], Callable[[], None]]:
    return cache.begin(text, add_special_tokens=add_special_tokens, found=found, fast=fast)


def encode(tok: tokenizer.Tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    # run_in_executor passes positional arguments only.
    return tok.encode(text, add_special_tokens=add_special_tokens)
