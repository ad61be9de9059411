"""How `epp serve` scrapes the model servers' metrics: GIE's `--model-server-metrics-*` flags or
the config's metrics source (llm-d's), one way; and with `--workers`, whether each worker follows
its supervisor's scrape or scrapes for itself."""

from __future__ import annotations

import argparse
import logging
import ssl
from typing import Any

from epp.datastore.endpoints import Datastore
from epp.datastore.engines import DEFAULT_ENGINES, with_default_overrides
from epp.datastore.scraper import MetricsScraper
from epp.flags.compat import metric_flag_specs
from epp.scheduling import datalayer
from epp.workers import worker as workers_worker
from epp.workers.shared_metrics import MetricsFollower

log = logging.getLogger("epp")


def scraper(
    args: argparse.Namespace,
    datastore: Datastore,
    pool_label: str,
    source: datalayer.MetricsScrape,
    role: workers_worker.WorkerRole | None = None,
    booked_interval: float | None = None,
) -> MetricsScraper | MetricsFollower:
    """The metrics scrape: GIE's --model-server-metrics-* flags, or the config's metrics source
    (llm-d's metrics-data-source; a flag given that says otherwise is a startup error), with the
    engines' metric names of its core-metrics-extractor and GIE's --*-metric flags.

    A worker follows its supervisor's scrape (epp.workers.shared_metrics: one scrape per model
    server for the pod), which the flags alone describe: the supervisor reads no config. With a
    config whose metrics source sets anything of its own, each worker scrapes for itself, never
    with other settings than the config says. `booked_interval`: the booked pace
    (`--booked-metrics-interval` when None; 0 where flow control dispatches on the scrapes)."""
    booked = args.booked_metrics_interval if booked_interval is None else booked_interval
    own = _own_scraper(args, datastore, pool_label, source, booked)  # a contrary flag is an error either way
    if role is None:
        return own
    given = _config_settings(args, source)
    if not given:
        return role.metrics_follower(datastore, pool_label)
    # The supervisor reads no config, so it cannot scrape as this one says: each worker scrapes for
    # itself, as every worker did before the supervisor scraped (correct, at workers x the cost).
    log.warning(
        "metrics: with --workers %d each worker scrapes the model servers itself, because the "
        "config's %s sets %s, which the supervisor's scrape (the --model-server-metrics-* flags) "
        "does not say; give those flags instead to scrape once for the pod",
        role.workers,
        source.name,
        ", ".join(given),
    )
    return own


def _own_scraper(
    args: argparse.Namespace,
    datastore: Datastore,
    pool_label: str,
    source: datalayer.MetricsScrape,
    booked_interval: float,
) -> MetricsScraper:
    scheme = _one_way("model-server-metrics-scheme", args.model_server_metrics_scheme, "http", source.scheme)
    path = _one_way(
        "model-server-metrics-path",
        args.model_server_metrics_path.strip('"') or "/metrics",
        "/metrics",
        source.path,
    )
    port = _one_way("model-server-metrics-port", args.model_server_metrics_port or None, None, source.port)
    flag_insecure = args.model_server_metrics_https_insecure_skip_verify
    insecure = (
        flag_insecure is not False if source.insecure_skip_verify is None else source.insecure_skip_verify
    )
    if flag_insecure is not None and source.insecure_skip_verify is not None and flag_insecure != insecure:
        raise ValueError(
            f"--model-server-metrics-https-insecure-skip-verify={str(flag_insecure).lower()}, but the "
            f"config's {source.name} says insecureSkipVerify: {str(insecure).lower()}"
        )
    base = args.refresh_metrics_interval
    engines = source.engines or DEFAULT_ENGINES
    overrides = metric_flag_specs(args)
    if overrides:
        if source.engines is not None:
            raise ValueError(
                f"--{next(iter(overrides))} and the config's core-metrics-extractor both name metrics: "
                "give them one way (the extractor's engineConfigs)"
            )
        engines = with_default_overrides(engines, overrides)
    if source.tls is not None and scheme == "https":
        try:
            source.tls.context(verify=not insecure)
        except (OSError, ssl.SSLError) as err:
            raise ValueError(f"the config's {source.name}: its TLS files cannot be used: {err}") from None
    return MetricsScraper(
        datastore,
        interval=tick(source.interval, base) if source.interval is not None else base,
        idle_interval=args.idle_metrics_interval,
        booked_interval=booked_interval,
        staleness=args.metrics_staleness_threshold,
        failure_threshold=args.scrape_failure_threshold,
        pool_name=pool_label,
        path=path,
        scheme=scheme,
        port=port,
        # GIE's and llm-d's default is to skip verification (servers' certificates are often self-signed).
        insecure_skip_verify=insecure,
        tls=source.tls,
        engines=engines,
        models_path=source.models_path or "/v1/models",
        models_interval=source.models_interval or 30.0,
    )


def _config_settings(args: argparse.Namespace, source: datalayer.MetricsScrape) -> list[str]:
    """What the config's metrics source sets otherwise than the flags' scrape does (which the
    supervisor of several workers runs); none when it only repeats the flags or the defaults."""
    flag_path = args.model_server_metrics_path.strip('"') or "/metrics"
    base = args.refresh_metrics_interval
    flag_insecure = args.model_server_metrics_https_insecure_skip_verify is not False
    differs = {
        "scheme": source.scheme not in (None, args.model_server_metrics_scheme),
        "path": source.path not in (None, flag_path),
        "port": source.port not in (None, args.model_server_metrics_port or None),
        "insecureSkipVerify": source.insecure_skip_verify not in (None, flag_insecure),
        "TLS files": source.tls is not None,
        "interval": source.interval is not None and tick(source.interval, base) != base,
        "a models-data-source path": source.models_path not in (None, "/v1/models"),
        "a models-data-source interval": source.models_interval not in (None, 30.0),
        "its core-metrics-extractor's engines": source.engines not in (None, DEFAULT_ENGINES),
    }
    return [label for label, given in differs.items() if given]


def _one_way(flag: str, given: Any, default: Any, configured: Any) -> Any:
    """A scrape setting given by a GIE flag or the config's metrics source: the config's unless
    the flag was changed from its default to something else (an error)."""
    if configured is None:
        return given
    if given != default and given != configured:
        raise ValueError(f"--{flag}={given}, but the config's metrics source says {configured}")
    return configured


def tick(interval: float, base: float) -> float:
    """llm-d polls a source with its own interval at the nearest multiple of the base tick
    (--refresh-metrics-interval); 0 or none means every tick."""
    return max(1, round(interval / base)) * base if interval > 0 else base
