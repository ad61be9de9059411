"""The routing policies a benchmark compares, each an `EndpointPickerConfig` run by epp's own pipeline.

The peers' algorithms (peers.md) are expressed as epp scheduling configurations in
`epp/bench/policies/<name>.yaml`, so every policy goes through the same request control,
scheduler and plugin framework; only the configuration differs. `epp` is epp's own default
configuration with KV events (`epp/scheduling/default-precise-config.yaml`), read from where
`epp serve` reads it, so the benchmark always measures what epp ships. `config:<path>` is any
other EndpointPickerConfig file as an arm, named for the file (`ConfigFile`): one's own config
against epp's default, or an ablation of it.

Each policy reads the pods' /metrics as the router it stands for does. epp's own policies and
`config:` files are scraped as `epp serve` scrapes by default (`paced`: a busy pod whose load is
all epp's bookings is read every `--booked-metrics-interval`); the peers' rules keep the fixed
50 ms refresh of GIE's and llm-d's EPPs (the peers that scrape /metrics; the other peers' rules
read the same), so the benchmark does not hand them a pace no peer has.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from pathlib import Path

from epp.scheduling import config as sched_config


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    name: str
    description: str
    kv_events: bool  # whether its plugins read the KV-event index (the fleet then publishes events)
    paced: bool = False  # scraped as epp serve scrapes (its booked pace), not at a fixed interval

    def config_text(self) -> str:
        """The policy's EndpointPickerConfig YAML."""
        if self.name == "epp":
            return sched_config.default_config_text(precise=True)
        return (
            importlib.resources.files(__package__)
            .joinpath("policies", f"{self.name}.yaml")
            .read_text("utf-8")
        )


CONFIG_PREFIX = "config:"


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigFile(Policy):
    """An EndpointPickerConfig file as a policy (`config:<path>` in --policies), named for the file.
    The fleet publishes KV events for it, whether or not its plugins read them."""

    path: Path = Path()

    def config_text(self) -> str:
        return self.path.read_text("utf-8")


def config_file(spec: str) -> ConfigFile:
    """The policy `config:<path>` names; ValueError (its message for the user) when the file cannot
    be read or its name is a built-in policy's."""
    path = Path(spec.removeprefix(CONFIG_PREFIX)).expanduser()
    name = path.stem
    if name in POLICIES:
        raise ValueError(f"{spec}: the file's name {name!r} is a built-in policy's; rename the file")
    try:
        path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{spec}: cannot read it: {e}") from None
    return ConfigFile(name, f"the EndpointPickerConfig in {path}", True, paced=True, path=path)


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("round-robin", "endpoints in turn (the Kubernetes Service baseline)", False),
        Policy("random", "an endpoint at random (llm-d's control group)", False),
        Policy("least-request", "fewest requests in flight, as epp books them", False),
        Policy("load-only", "vLLM queue + KV-cache usage, weights 1/1 (llm-d load-scheduling)", False),
        Policy("gie-approx", "GIE default: approximate prefix 3, queue 2, KV-cache usage 2", False),
        Policy("llm-d-precise", "llm-d guide: precise prefix (KV events) 2, KV-cache usage 1, queue 1", True),
        Policy(
            "sglang-cache-aware",
            "SGLang cache_aware: match > 0.3 wins unless load is off by 64 and 1.5x",
            False,
        ),
        Policy("dynamo-cost", "Dynamo KV router: lowest 1.0 x prefill blocks + decode blocks", True),
        Policy("ranvier-bounded", "Ranvier: prefix affinity, diverted above 2x median in-flight + 2", False),
        Policy("epp-ttft", "epp's earlier default: predicted TTFT only, precise prefix", True, paced=True),
        Policy(
            "epp",
            "epp's default with KV events: predicted whole-request latency (default-precise-config.yaml)",
            True,
            paced=True,
        ),
        # Admission under overload, on GIE's default profile (gie-approx is the same without
        # flow control: GIE's legacy admission, sheddable requests 429 while saturated).
        Policy("smg-veto", "SGLang's overload veto (8 waiting / 80% KV), no priorities, GIE profile", False),
        Policy("llm-d-flow-control", "llm-d's flow control with its defaults, GIE profile", False),
        Policy(
            "flow-control",
            "epp's flow control for overload: prefill and concurrency limits, priority holdback, "
            "round-robin tenants",
            False,
            paced=True,
        ),
        Policy(
            "flow-control-requests",
            "epp's flow control counting requests only (48 per pod), priority holdback, round-robin",
            False,
            paced=True,
        ),
        Policy(
            "flow-control-fair-share",
            "flow-control with fair-share tenants: a tenant over 1.5x its share held from 40% of the ceiling",
            False,
            paced=True,
        ),
    )
}
# The policies `epp bench` runs by default (`--policies all`): the routing comparison. The
# admission ones above take part where a workload is about overload (`Workload.policies`).
ADMISSION = (
    "gie-approx",
    "smg-veto",
    "llm-d-flow-control",
    "flow-control-requests",
    "flow-control",
    "flow-control-fair-share",
)
