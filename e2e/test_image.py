"""The container image, built by scripts/image from the Containerfile and run as a cluster runs it.

    client ──► Envoy (`epp envoy-config`: TLS to epp, its default) ──► simulated pods (this process)
                   │ ext_proc over TLS
                   ▼
              epp in a container of the image (podman, --network=host), given flags only, as
              GIE's chart gives them; read-only and without capabilities, as epp's chart runs it

Checked: the image's metadata (non-root numeric user, the three ports, `epp serve` as entrypoint);
that it holds this tree's code (no stale layer); requests routed through it, its /metrics, the
uid its process really runs as, and a clean exit on SIGTERM (the signal a kubelet sends; epp is
PID 1 in the container, with no init to help).

scripts/image runs once per module: a few seconds when nothing changed (podman's layer cache),
~20-30 s after a change to epp's code, ~1-2 min after one to pyproject.toml, ~3 min on a new
machine (it installs podman with apt-get and makes the Debian base image first). Without podman
the tests skip outside CI; in CI (CI=true) scripts/image installs podman, and a failure to build
is a test failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from e2e.harness import E2E_SIM, Cleanup, SimBackends, eventually, parse_prometheus, request, sse_events
from epp.gateway.processes import (
    HOST,
    EnvoyServer,
    EppPorts,
    ManagedProcess,
    free_ports,
    wait_grpc_health,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
MODEL = E2E_SIM.served_model
NONROOT_UID = 65532


# Digests of epp's package files, by path under the package (generated protobuf modules and the
# compiled C extensions left out: protoc's output may differ in a byte where the code does not, and
# the image compiles epp/kvcache/*.c with its own compiler).
DIGEST_SCRIPT = """
import hashlib, json, pathlib, sys
root = pathlib.Path(sys.argv[1])
print(json.dumps({
    str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(root.rglob("*"))
    if p.is_file() and "__pycache__" not in p.parts and "_pb2" not in p.name and p.suffix != ".so"
}))
"""


def tree_digests() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-c", DIGEST_SCRIPT, str(REPO / "epp")], capture_output=True, text=True, check=True
    )
    digests: dict[str, str] = json.loads(out.stdout)
    return digests


@dataclass(frozen=True)
class Image:
    name: str
    env: dict[str, str]  # the environment podman needs here (CONTAINERS_CONF)
    tree_before_build: dict[str, str]  # tree_digests() when scripts/image started

    def podman(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    in_ci = os.environ.get("CI") == "true"
    if shutil.which("podman") is None and not in_ci:
        pytest.skip("podman not installed: `bash scripts/image` installs it (apt-get) and builds the image")
    env = dict(os.environ)
    if not env.get("CONTAINERS_CONF"):
        # scripts/image writes the containers.conf this machine needs into its cache directory.
        env["EPP_IMAGE_CACHE"] = str(tmp_path_factory.mktemp("image-cache"))
    before = tree_digests()
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "image")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"scripts/image failed (exit {result.returncode}):\n{result.stderr[-6000:]}")
    if not env.get("CONTAINERS_CONF"):
        env["CONTAINERS_CONF"] = str(Path(env["EPP_IMAGE_CACHE"]) / "containers.conf")
    return Image(result.stdout.strip().splitlines()[-1], env, before)


def test_image_metadata(image: Image) -> None:
    inspected = image.podman("image", "inspect", image.name)
    assert inspected.returncode == 0, inspected.stderr
    config = json.loads(inspected.stdout)[0]["Config"]
    assert config["User"] == f"{NONROOT_UID}:{NONROOT_UID}"  # numeric: runAsNonRoot can verify it
    assert set(config["ExposedPorts"]) == {"9002/tcp", "9003/tcp", "9090/tcp"}
    # `epp serve`, so that GIE's chart, which gives only flags (`args:`), runs the picker.
    assert config["Entrypoint"] == ["/opt/epp/bin/epp", "serve"]
    assert not config.get("Cmd"), config.get("Cmd")  # nothing appended (the base's CMD is python3)
    # No pip, no build tools, no Envoy in the runtime image.
    listed = image.podman("run", "--rm", "--entrypoint", "ls", image.name, "/opt/epp/bin")
    assert listed.returncode == 0, listed.stderr
    assert "epp" in listed.stdout.split()
    assert not {"pip", "pip3", "envoy"} & set(listed.stdout.split()), listed.stdout


@dataclass
class ImageStack:
    sims: SimBackends
    epp: ManagedProcess  # `podman run`
    ports: EppPorts
    container: str
    url: str

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://{HOST}:{self.ports.metrics}/metrics", timeout=5) as resp:
            text: str = resp.read().decode()
        return text


def start_image_stack(image: Image, workdir: Path, cleanup: Cleanup) -> ImageStack:
    """Two sims, epp in a container from `image`, Envoy from `epp envoy-config` (both TLS by default)."""
    sims = SimBackends([E2E_SIM, E2E_SIM])
    cleanup.push("sims", sims.stop)
    sims.start()

    container = f"epp-e2e-{uuid.uuid4().hex[:10]}"
    cleanup.push(
        "container",
        lambda: image.podman("rm", "--force", "--ignore", "--time", "0", container).check_returncode(),
    )
    # `env` execs podman: the process Cleanup signals is podman itself, which (attached, with its
    # default --sig-proxy) passes SIGTERM on to epp, PID 1 in the container.
    podman_run = ["env", f"CONTAINERS_CONF={image.env['CONTAINERS_CONF']}", "podman", "run", "--rm"]
    podman_run += ["--name", container, "--network=host"]
    # The chart's securityContext: read-only root (and no writable /tmp: the chart mounts one, GIE's
    # does not), no capabilities, no privilege escalation.
    podman_run += [
        "--read-only",
        "--read-only-tmpfs=false",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
    ]
    # Flags only, as GIE's chart passes them (the entrypoint is `epp serve`), and epp's defaults
    # but the ports and address: TLS on the ext-proc port among them.
    ports = EppPorts.free()
    podman_run += [image.name, "--endpoints", ",".join(sims.addresses), "--bind-address", HOST]
    podman_run += ["--grpc-port", str(ports.grpc), "--grpc-health-port", str(ports.health)]
    podman_run += ["--metrics-port", str(ports.metrics), "--refresh-metrics-interval", "50ms"]
    epp = ManagedProcess("epp (container)", podman_run, workdir / "epp.log")
    cleanup.add_log("epp (container) log", epp.log_path)
    cleanup.push("epp", epp.stop)
    epp.start()
    # A loaded machine's first start of a container can be slow.
    wait_grpc_health(ports.health, proc=epp, timeout=90, what="epp (container)")

    listen, admin = free_ports(2)
    argv = [
        sys.executable,
        "-m",
        "epp",
        "envoy-config",
        "--epp",
        f"{HOST}:{ports.grpc}",
        "--listen-address",
        HOST,
    ]
    argv += [
        "--listen-port",
        str(listen),
        "--admin-port",
        str(admin),
        "--access-log",
        str(workdir / "access.log"),
    ]
    generated = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    envoy = EnvoyServer(workdir, yaml.safe_load(generated.stdout), admin_port=admin)
    cleanup.add_log("envoy log", envoy.log_path)
    cleanup.add_log("envoy access log", workdir / "access.log")
    cleanup.push("envoy", envoy.stop)
    envoy.start()
    return ImageStack(sims, epp, ports, container, f"http://{HOST}:{listen}")


def process_uids(image: Image, container: str) -> list[str]:
    """Real, effective, saved and filesystem uid of the container's main process, as the host sees it."""
    pid = image.podman("inspect", "--format", "{{.State.Pid}}", container)
    assert pid.returncode == 0, pid.stderr
    status = Path(f"/proc/{pid.stdout.strip()}/status").read_text()
    return next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))


def test_image_holds_the_code_of_this_tree(image: Image) -> None:
    """The installed package is this work tree's: a stale layer cache would fail here (podman 4.3
    once reused an install layer after the code had changed; see the Containerfile)."""
    site = "/opt/epp/lib/python3.11/site-packages/epp"
    run = image.podman(
        "run", "--rm", "--entrypoint", "/opt/epp/bin/python", image.name, "-c", DIGEST_SCRIPT, site
    )
    assert run.returncode == 0, run.stderr
    installed: dict[str, str] = json.loads(run.stdout)

    def code(digests: dict[str, str]) -> dict[str, str]:
        # Every module, and the data files that were packaged (the tree also has files that are not).
        return {k: v for k, v in digests.items() if k.endswith(".py") or k in installed}

    # Another process may edit the tree while the image builds: either state of it will do.
    trees = [image.tree_before_build, tree_digests()]
    if all(code(tree) != installed for tree in trees):
        tree = trees[-1]
        differ = sorted(k for k in set(code(tree)) | set(installed) if code(tree).get(k) != installed.get(k))
        raise AssertionError(f"the image's epp differs from the work tree in: {differ[:20]}")
    assert any(k.startswith("tokenize/data/") for k in installed), sorted(installed)[:20]


async def test_image_routes_requests_and_stops_on_sigterm(
    image: Image, tmp_path: Path, cleanup: Cleanup, session: aiohttp.ClientSession
) -> None:
    stack = start_image_stack(image, tmp_path, cleanup)
    sims, epp = stack.sims, stack.epp
    assert process_uids(image, stack.container) == [str(NONROOT_UID)] * 4

    bodies: list[tuple[str, dict[str, Any]]] = [
        ("/v1/completions", {"model": MODEL, "prompt": f"Request {i}: once upon a time", "max_tokens": 3})
        for i in range(4)
    ]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    bodies.append(("/v1/chat/completions", chat))
    bodies.append(
        ("/v1/completions", {"model": MODEL, "prompt": "Stream it", "max_tokens": 3, "stream": True})
    )
    for path, body in bodies:
        reply = await request(session, "POST", stack.url + path, body=body)
        assert reply.status == 200, f"{path}: {reply.status} {reply.text[:300]}"
        # Served by a sim, the one epp named in the destination header.
        assert reply.served_by in sims.addresses, reply.headers
        assert reply.received_destination == reply.served_by, reply.headers
        if body.get("stream"):
            assert sse_events(reply.text)[-1] == "[DONE]"

    # epp counts a request when its ext-proc stream closes, which may trail the response a little.
    def picks() -> dict[str, float]:
        return parse_prometheus(stack.metrics_text(), "epp_endpoint_picks_total")

    await eventually(lambda: sum(picks().values()) >= len(bodies), within=10, what="picks in /metrics")
    assert all(any(address in labels for address in sims.addresses) for labels in picks()), picks()
    text = stack.metrics_text()
    assert sum(parse_prometheus(text, "inference_objective_request_total").values()) >= len(bodies)

    # SIGTERM, as a kubelet sends it: epp drains (nothing in flight) and exits 0 well within the
    # grace; podman run reports the container's own status.
    proc = epp.proc
    assert proc is not None
    started = time.monotonic()
    proc.terminate()
    code = await asyncio.to_thread(proc.wait, 30)
    elapsed = time.monotonic() - started
    assert code == 0, f"exit {code} after SIGTERM:\n{epp.log_text(4000)}"
    assert elapsed < 15, f"SIGTERM took {elapsed:.1f}s"
    gone = image.podman("container", "exists", stack.container)
    assert gone.returncode == 1, "the --rm container should be gone"
