"""The soak in a minute: every fault once, through real Envoy, two epp replicas and `epp sim` pods.

`python -m epp.bench.soak` runs the same thing for an hour (docs/reliability.md); this is the
short version CI can afford. What it holds epp to:

* no request fails outside an injected fault's window (and its grace);
* every /metrics hung at once is not an outage: routing degrades to the last known metrics, so no
  request in that window fails (issue 19: 89% got 503 for 15 s);
* a killed pod serves again after its restart, a restarted epp routes again, a dropped KV
  publisher's events are applied again.
"""

from __future__ import annotations

from pathlib import Path

from epp.bench.soak import Soak, SoakConfig


async def test_a_minute_of_faults_loses_no_request_outside_them(
    tmp_path: Path, e2e_prerequisites: None
) -> None:
    cfg = SoakConfig(
        out=tmp_path / "soak",
        duration=50.0,
        rate=10.0,
        pods=3,
        warmup=5.0,
        fault_every=11.0,
        fault_duration=3.0,
        grace=4.0,
        sample_every=0.5,
        # The epp restart first: on a loaded machine a fresh epp takes seconds to import and start.
        faults=("epp_sigterm", "pod_kill", "publisher_drop", "scrape_hang"),
        attack_rate=0.5,  # every kind of client attack (epp.bench.soak.attacks) two or three times
    )
    report = await Soak(cfg).run()
    summary = (tmp_path / "soak" / "report.md").read_text()
    faults = {f["kind"]: f for f in report["faults"]}
    assert set(faults) == {"pod_kill", "publisher_drop", "scrape_hang", "epp_sigterm"}, summary
    assert report["lost"] == 0, summary
    assert report["attack_5xx"] == 0 and len(report["attacks"]) == 9, summary
    assert report["ok"] > 0.9 * report["requests"], summary
    hang = faults["scrape_hang"]
    assert hang["requests"] > 0 and hang["failed"] == 0, summary
    assert hang["readmitted_s"] is not None, summary
    assert faults["pod_kill"]["first_served_s"] is not None, summary
    assert faults["epp_sigterm"]["routing_s"] is not None, summary
    assert faults["publisher_drop"]["events_again_s"] is not None, summary
