"""Extract the few series epp routes on from a model server's Prometheus text exposition, fast.

A real vLLM's /metrics is tens of KB, nearly all of it histogram buckets epp never reads, and epp
fetches it from every endpoint every 50 ms. A general parser (prometheus_client's
`text_string_to_metric_families`) builds an object per sample for the whole page; this module
instead searches the raw bytes for each wanted metric name at a line start (`bytes.find`, which
runs at memchr-like speed in C) and parses only the handful of lines found. Measured by
tests/datastore/bench_promtext.py on a 40 KB / 66 KB vLLM page: ~30 / ~40 us per parse against
~7 / ~12 ms for the general parser, about 250-300x less.

Series read for vLLM (see ModelServerMetrics); other engines' names, and label matchers such as
Triton's `{request_type="waiting"}`, come from their mapping (`epp.datastore.engines`), read the
same way (queues summed, usage and cache sizes the largest value, a cache size given as a gauge's
value taken as it is, an engine's custom scalar metrics into `ModelServerMetrics.custom`):

- `vllm:num_requests_waiting`, `vllm:num_requests_running`: summed over all series, because one
  port may front several engines (data-parallel `engine="0"`, `"1"`, ...) or models.
- `vllm:kv_cache_usage_perc` (0..1; older vLLM: `vllm:gpu_cache_usage_perc`, read only when the
  new name is absent): the maximum over series, i.e. the most loaded engine.
- `vllm:cache_config_info` labels `block_size` and `num_gpu_blocks`: the maximum over series.
  Engines behind one port share one cache config, so this is the per-engine value.
- `vllm:lora_requests_info` labels `max_lora`, `running_lora_adapters`, `waiting_lora_adapters`
  (comma lists): taken from the series with the largest value, which vLLM sets to a timestamp.
- `vllm:request_success_total` (a counter, one series per `finished_reason`): summed, as
  `requests_total`; None when absent. Not a wanted series on its own (a page with only it raises).
- The `_sum` and `_count` of `vllm:inter_token_latency_seconds` and
  `vllm:request_decode_time_seconds` (vLLM 0.32 has them), each summed over its series, as
  `latency` (`LatencyTotals`); None unless the page has all four with finite, non-negative values.
  Their buckets are not read.

Tolerance: comments, HELP/TYPE lines, `\\r\\n` line ends, trailing timestamps, exponent notation,
NaN and +/-Inf (a non-finite value is ignored, as if the series were absent), escaped quotes and
`}` inside label values. Names that merely start with a wanted name
(`vllm:num_requests_waiting_by_reason`) are not matched. A page with none of the wanted series,
or a wanted line that is malformed, raises `PromTextError`: the caller keeps its last good
metrics rather than routing on zeros read from a broken page.
"""

from __future__ import annotations

import functools
import math
import re

from epp.datastore.endpoints import LatencyTotals, ModelServerMetrics
from epp.datastore.engines import VLLM, EngineMapping, MetricSpec

WAITING = b"vllm:num_requests_waiting"
RUNNING = b"vllm:num_requests_running"
KV_USAGE = b"vllm:kv_cache_usage_perc"
KV_USAGE_OLD = b"vllm:gpu_cache_usage_perc"
CACHE_INFO = b"vllm:cache_config_info"
LORA_INFO = b"vllm:lora_requests_info"
SUCCESS = b"vllm:request_success_total"
LATENCY_HISTOGRAMS = (  # whose sums and counts make LatencyTotals, in its order
    b"vllm:inter_token_latency_seconds",
    b"vllm:request_decode_time_seconds",
)
TTFT_HISTOGRAM = b"vllm:time_to_first_token_seconds"  # LatencyTotals' last two, where the page has it

_AFTER_NAME = (b"{", b" ", b"\t")  # what may follow a metric name on a sample line

# One label pair inside {...}: name="value" where value may hold escaped characters.
_LABEL = re.compile(rb'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"\\]*(?:\\.[^"\\]*)*)"\s*,?')
_UNESCAPE = re.compile(rb"\\(.)")
_ESCAPES = {b"n": b"\n", b"\\": b"\\", b'"': b'"'}


class PromTextError(ValueError):
    """The page is not a usable vLLM /metrics page (names the offending series or line)."""


Sample = tuple[bytes, float]  # (raw label block without braces, value)


def _samples(data: bytes, name: bytes) -> list[Sample]:
    """Every sample line of metric `name` exactly (not of longer names it is a prefix of).

    The text format requires all lines of one metric to form a single group, so once the group
    is found its lines are read in sequence and the search stops at the first other line: this
    saves a scan of the rest of the page per name (about 7 us per 40 KB, see the benchmark).
    """
    out: list[Sample] = []
    n = len(name)
    needle = b"\n" + name
    if data.startswith(name):
        line = 0
    else:
        i = data.find(needle)
        if i == -1:
            return out
        line = i + 1
    while True:
        start = line + n
        end = data.find(b"\n", start)
        if end == -1:
            end = len(data)
        if data[start : start + 1] in _AFTER_NAME:
            out.append(_split(name, data[start:end]))
        elif out:
            break  # a longer name right after the group (vllm:num_requests_waiting_by_reason)
        if out:
            if not data.startswith(name, end + 1):
                break
            line = end + 1
        else:  # only a longer name so far: keep looking for the group itself
            i = data.find(needle, end)
            if i == -1:
                break
            line = i + 1
    return out


def samples(data: bytes, name: bytes) -> list[Sample]:
    """Every sample (label block, value) of metric `name` exactly on the page."""
    return _samples(data, name)


def _split(name: bytes, rest: bytes) -> Sample:
    """Parse what follows the metric name on its line: `{labels} value [timestamp]`."""
    labels = b""
    if rest[:1] == b"{":
        # Neither the value nor the timestamp can contain "}", so the last one closes the block,
        # whatever braces the quoted label values hold.
        close = rest.rfind(b"}")
        if close == -1:
            raise PromTextError(f"{name.decode()}: unterminated label block")
        labels = rest[1:close]
        rest = rest[close + 1 :]
    fields = rest.split()  # also drops a trailing "\r"
    if not fields or len(fields) > 2:
        raise PromTextError(f"{name.decode()}: expected 'value [timestamp]', got {rest.strip()[:60]!r}")
    try:
        value = float(fields[0])
    except ValueError:
        raise PromTextError(f"{name.decode()}: bad value {fields[0][:40]!r}") from None
    return labels, value


def parse_labels(block: bytes) -> dict[str, str]:
    """Parse a label block (without braces) into a dict; raises PromTextError if malformed."""
    out: dict[str, str] = {}
    pos = 0
    n = len(block)
    while pos < n:
        m = _LABEL.match(block, pos)
        if m is None:
            if block[pos:].strip() in (b"", b","):
                break
            raise PromTextError(f"bad label syntax near {block[pos : pos + 40]!r}")
        raw = m.group(2)
        if b"\\" in raw:
            raw = _UNESCAPE.sub(lambda e: _ESCAPES.get(e.group(1), b"\\" + e.group(1)), raw)
        out[m.group(1).decode()] = raw.decode("utf-8", "replace")
        pos = m.end()
    return out


def _int_label(labels: dict[str, str], key: str) -> int | None:
    # vLLM renders unset config fields as "None"; anything non-numeric counts as absent.
    try:
        v = int(labels.get(key, ""))
    except ValueError:
        return None
    return v if v >= 0 else None


def _names(labels: dict[str, str], key: str) -> frozenset[str]:
    return frozenset(s for s in (p.strip() for p in labels.get(key, "").split(",")) if s)


# The two info series change rarely (cache config: never; LoRA lists: when adapters come and go)
# while their label blocks are the costliest part of a page to parse (~10 us for cache_config_info's
# fifteen labels). Memoising on the raw block makes a repeat a dict lookup. Bounded, so a server
# that puts a changing label in them cannot grow it without limit.
@functools.lru_cache(maxsize=256)
def _cache_info(block: bytes, size_label: str, count_label: str) -> tuple[int | None, int | None]:
    labels = parse_labels(block)
    return _int_label(labels, size_label), _int_label(labels, count_label)


@functools.lru_cache(maxsize=256)
def _lora_info(block: bytes) -> tuple[int, frozenset[str], frozenset[str]]:
    labels = parse_labels(block)
    return (
        _int_label(labels, "max_lora") or 0,
        _names(labels, "running_lora_adapters"),
        _names(labels, "waiting_lora_adapters"),
    )


def _count(samples: list[Sample]) -> int:
    """Sum of the finite values as a non-negative int; 0 if none (or if the sum overflows)."""
    total = sum(v for _, v in samples if math.isfinite(v))
    return max(0, round(total)) if math.isfinite(total) else 0


def _matching(data: bytes, spec: MetricSpec) -> list[Sample]:
    """The samples of `spec`'s metric whose labels include all of `spec`'s label matchers."""
    samples = _samples(data, spec.name)
    if not spec.labels or not samples:
        return samples
    wanted = spec.labels
    out = []
    for block, value in samples:
        labels = parse_labels(block)
        if all(labels.get(k) == v for k, v in wanted):
            out.append((block, value))
    return out


def _latency(data: bytes) -> LatencyTotals | None:
    """`LatencyTotals` from the page, None unless every one of its series is there and sane."""
    if LATENCY_HISTOGRAMS[0] not in data:  # (vLLM before them, other servers: one search)
        return None
    found: list[tuple[float, float]] = []
    for name in LATENCY_HISTOGRAMS:
        pair = _sum_and_count(data, name)
        if pair is None:
            return None
        found.append(pair)
    (token_s, tokens), (decode_s, decodes) = found
    ttft_s, ttfts = _sum_and_count(data, TTFT_HISTOGRAM) or (0.0, 0.0)
    return LatencyTotals(token_s, tokens, decode_s, decodes, ttft_s, ttfts)


def _sum_and_count(data: bytes, name: bytes) -> tuple[float, float] | None:
    """Histogram `name`'s `_sum` and `_count`, each summed over its series (one per engine behind
    the port); None when either is missing, not finite or negative.

    A histogram's series interleave (buckets, count and sum of one engine, then the next's), so
    each of its `_count` lines is searched for; prometheus_client writes the `_sum` line right
    after it, which is then read without a search (another layout: searched for alike)."""
    count_name, sum_name = name + b"_count", name + b"_sum"
    needle = b"\n" + count_name
    count = total = 0.0
    lines, paired = 0, True
    i = data.find(needle)
    # Its family ends at the next family's comments: the later searches stop there, not at the
    # page's end (~5 us a search on a 40 KB page). A page without comments is searched to its end.
    stop = data.find(b"\n# ", i) if i != -1 else -1
    stop = len(data) if stop == -1 else stop
    while i != -1:
        start = i + 1 + len(count_name)
        end = data.find(b"\n", start)
        end = len(data) if end == -1 else end
        pos = end
        if data[start : start + 1] in _AFTER_NAME:
            count += _split(count_name, data[start:end])[1]
            lines += 1
            after = end + 1 + len(sum_name)
            if data.startswith(sum_name, end + 1) and data[after : after + 1] in _AFTER_NAME:
                close = data.find(b"\n", after)
                close = len(data) if close == -1 else close
                total += _split(sum_name, data[after:close])[1]
                pos = close
            else:
                paired = False
        i = data.find(needle, pos, stop)
    if not lines:
        return None
    if not paired:
        total = sum(v for _, v in _samples_all(data, sum_name))
    if not (math.isfinite(total) and math.isfinite(count)) or total < 0 or count < 0:
        return None
    return total, count


def _samples_all(data: bytes, name: bytes) -> list[Sample]:
    """Every sample line of `name`, wherever on the page (a histogram's interleave)."""
    out: list[Sample] = []
    needle, pos = b"\n" + name, 0
    while (i := data.find(needle, pos)) != -1:
        start = i + 1 + len(name)
        end = data.find(b"\n", start)
        end = len(data) if end == -1 else end
        pos = end
        if data[start : start + 1] in _AFTER_NAME:
            out.append(_split(name, data[start:end]))
    return out


def _gauge(data: bytes, spec: MetricSpec | None) -> float | None:
    """The largest finite value among `spec`'s series, None when it has none."""
    if spec is None:
        return None
    values = [v for _, v in _matching(data, spec) if math.isfinite(v)]
    return max(values) if values else None


def is_vllm(engine: EngineMapping) -> bool:
    """Whether `engine` names vLLM's series (vLLM's mapping, or one with its queue metric): its page
    then has vLLM's success counter and latency histograms too, and vLLM's metrics handlers."""
    return engine is VLLM or engine.queued == VLLM.queued


def _reads_old_usage(engine: EngineMapping) -> bool:
    """Whether vLLM's KV-usage name before 0.10 is read where the new one is absent."""
    return engine.kv_usage is not None and engine.kv_usage.name == KV_USAGE and not engine.kv_usage.labels


def series_read(engine: EngineMapping = VLLM) -> tuple[str, ...]:
    """The sample names `parse` reads from `engine`'s page, in a stable order: what a scraper may
    ask a prometheus_client server for (its `name[]` filter) and still get every figure `parse`
    returns. A histogram is named by its `_sum` and `_count` samples only (its buckets are not read)."""
    names = [spec.name for spec in engine.specs()]
    if _reads_old_usage(engine):
        names.append(KV_USAGE_OLD)
    if is_vllm(engine):
        names.append(SUCCESS)
        for histogram in (*LATENCY_HISTOGRAMS, TTFT_HISTOGRAM):
            names += (histogram + b"_sum", histogram + b"_count")
    return tuple(dict.fromkeys(n.decode() for n in names))


def parse(data: bytes | str, engine: EngineMapping = VLLM, *, latency: bool = True) -> ModelServerMetrics:
    """Extract epp's metrics from one /metrics page of `engine` (vLLM by default; its names and
    llm-d's mappings for other engines: `epp.datastore.engines`). `updated_at` is left 0 for the
    caller to set.

    `latency` False skips vLLM's latency histograms (`latency` is then None).

    Raises PromTextError if none of the engine's series is present or a wanted line is malformed.
    """
    if isinstance(data, str):
        data = data.encode()
    none: list[Sample] = []
    waiting = _matching(data, engine.queued) if engine.queued is not None else none
    running = _matching(data, engine.running) if engine.running is not None else none
    usage = none
    if engine.kv_usage is not None:
        usage = _matching(data, engine.kv_usage)
        # vLLM before 0.10: the old name, looked for only when the new one is absent.
        if not usage and _reads_old_usage(engine):
            usage = _samples(data, KV_USAGE_OLD)
    cache_info = _matching(data, engine.cache_info) if engine.cache_info is not None else none
    lora_info = _matching(data, engine.lora) if engine.lora is not None else none
    block_gauge = _gauge(data, engine.cache_block_size)
    blocks_gauge = _gauge(data, engine.cache_num_blocks)
    custom = {key: _gauge(data, spec) for key, spec in engine.custom}
    found = custom and any(v is not None for v in custom.values())
    if (
        not (waiting or running or usage or cache_info or lora_info or found)
        and block_gauge is None
        and blocks_gauge is None
    ):
        names = ", ".join(str(s) for s in engine.specs()) or "none"
        raise PromTextError(f"no {engine.name} series found ({names})")
    m = ModelServerMetrics()
    if is_vllm(engine):
        success = [v for _, v in _samples(data, SUCCESS) if math.isfinite(v) and v >= 0]
        if success:
            m.requests_total = sum(success)
        if latency:
            m.latency = _latency(data)

    m.waiting = _count(waiting)
    m.running = _count(running)
    fractions = [v for _, v in usage if math.isfinite(v)]
    if fractions:
        m.kv_usage = min(1.0, max(0.0, max(fractions)))

    if cache_info:
        size_label, count_label = engine.cache_block_size_label, engine.cache_num_blocks_label
        for block, _ in cache_info:
            bs, nb = _cache_info(block, size_label, count_label)
            if bs is not None:
                m.block_size = max(m.block_size, bs)
            if nb is not None:
                m.num_gpu_blocks = max(m.num_gpu_blocks, nb)
    if block_gauge is not None and block_gauge >= 0:
        m.block_size = max(m.block_size, int(block_gauge))
    if blocks_gauge is not None and blocks_gauge >= 0:
        m.num_gpu_blocks = max(m.num_gpu_blocks, int(blocks_gauge))

    lora = [(v, block) for block, v in lora_info if not math.isnan(v)]
    if lora:
        _, block = max(lora, key=lambda s: s[0])
        m.max_lora, m.running_loras, m.waiting_loras = _lora_info(block)
    if engine.custom:
        m.custom = {key: value for key, value in custom.items() if value is not None}
    return m
