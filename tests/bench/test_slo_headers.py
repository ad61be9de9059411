"""`epp bench --slo-headers`: the latency target goes as x-slo-* headers with every request, in
fast mode to epp's default scorer (a target every candidate meets changes no decision), in live
mode from the client, in the milliseconds of the wall clock."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from epp.bench import cli, fast
from epp.bench.policies import POLICIES

from . import helpers


def outcome(headers: Mapping[str, str] | None, seed: int = 7) -> list[tuple[object, ...]]:
    run = fast.FastRun(
        helpers.small(seed),
        POLICIES["epp"],
        profile=helpers.PROFILE,
        pods=helpers.PODS,
        seed=seed,
        request_headers=headers,
    )
    result = run.run()
    assert not result.stopped_early
    return [(r.arrival, r.pod, r.status, r.cached_tokens, r.first_token, r.finish) for r in result.records]


def test_targets_reach_the_scorer_and_easy_ones_change_nothing() -> None:
    plain = outcome(None)
    # Every candidate meets an hour: the same decisions, request by request.
    assert outcome({"x-slo-ttft-ms": "3600000", "x-slo-tpot-ms": "3600000"}) == plain
    # On this tiny fleet TTFTs are 10-25 ms (p50 13, p90 21): a 15 ms target moves some picks.
    tight = outcome({"x-slo-ttft-ms": "15"})
    # (a closed loop: other picks may change how many requests fit in the run)
    assert sum(a[1] != b[1] for a, b in zip(tight, plain, strict=False)) > 50


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_flag_is_recorded_and_needs_epps_client(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--workload", "unique", "--policies", "epp", "--scale", "0.01", "--no-plots", "--slo-headers"]
    assert cli.run(parse(*argv, "--out", str(tmp_path), "--slo-ttft", "0.25")) == 0
    s = json.loads((tmp_path / "results.json").read_text())["workloads"]["unique"]["policies"]["epp"]
    assert s["slo_headers"] is True and s["slo_ttft_s"] == 0.25
    live = ("--workload", "shared-prefix", "--mode", "live", "--slo-headers", "--client", "inference-perf")
    assert cli.run(parse(*live)) == 2
    assert "--slo-headers needs epp's own client" in capsys.readouterr().err


def test_live_targets_are_in_wall_milliseconds() -> None:
    args = parse("--slo-ttft", "0.5", "--slo-tpot", "0.04")
    profile = helpers.PROFILE
    assert cli._slo_headers(args, profile, 1.0) == {"x-slo-ttft-ms": "500", "x-slo-tpot-ms": "40"}
    # --time-scale 2: the pods run at half speed, so a target is twice as many wall milliseconds.
    assert cli._slo_headers(args, profile, 2.0) == {"x-slo-ttft-ms": "1000", "x-slo-tpot-ms": "80"}


def test_the_live_client_sends_them_with_every_request() -> None:
    """What reaches the gateway: the targets beside the request's own objective header."""
    from aiohttp import web

    from epp.bench import live
    from epp.bench.gateways import EppGateway
    from epp.bench.workload import Prompt

    seen: list[dict[str, str]] = []

    async def complete(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"text": "x"}]}\n\n')
        await resp.write(b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def main() -> None:
        import aiohttp

        app = web.Application()
        app.router.add_post("/v1/completions", complete)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        run = live.LiveRun(
            helpers.small(1), EppGateway(POLICIES["epp"]), profile=helpers.PROFILE, pods=2, seed=1,
            time_scale=1.0, workdir=Path("."), request_headers={"x-slo-ttft-ms": "800"},
        )  # fmt: skip
        try:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{port}/v1/completions"
                await run._send(session, url, Prompt([1, 2, 3], 1, "", 0, priority=2))
                await run._send(session, url, Prompt([1, 2, 3], 1, "", 0))
        finally:
            await runner.cleanup()
        assert [r.status for r in run.result.records] == [200, 200], run.errors

    asyncio.run(main())
    assert [h.get("x-slo-ttft-ms") for h in seen] == ["800", "800"]
    assert "priority-2" in seen[0].get("x-gateway-inference-objective", ""), seen[0]
    with pytest.raises(ValueError, match="need the epp client"):
        live.LiveRun(
            helpers.small(1), EppGateway(POLICIES["epp"]), profile=helpers.PROFILE, pods=2, seed=1,
            time_scale=1.0, workdir=Path("."), client="inference-perf", request_headers={"a": "b"},
        )  # fmt: skip
