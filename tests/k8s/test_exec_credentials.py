"""kubeconfig `exec` credential plugins (EKS, GKE, AKS from a laptop), run for real.

The plugin is a small script written by each test: it counts its runs in a file and prints an
ExecCredential whose token names the run ("tok-1", "tok-2", ...), with an expiry the test chooses.
The fake API server accepts one token at a time, as a real one stops accepting an expired token.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import pytest

from epp.k8s import connections, operator
from tests.k8s import fake_apiserver as fake
from tests.k8s.conftest import FAST, wait_for

PLUGIN = """\
import datetime, json, os, sys
from pathlib import Path

runs = Path(sys.argv[1])
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])  # the client must say what it wants
assert info["kind"] == "ExecCredential", info
if os.environ.get("PLUGIN_FAIL"):
    sys.stderr.write("plugin: no credentials for you")
    sys.exit(3)
status = {"token": f"tok-{n}"}
if sys.argv[2] != "none":
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=float(sys.argv[2]))
    status["expirationTimestamp"] = expiry.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status}
print(json.dumps(credential))
"""

# kubernetes_asyncio treats a credential as expired 5 minutes before its expirationTimestamp (the
# same margin for every plugin): a lifetime of 300 s + MARGIN is valid for MARGIN seconds here.
LIBRARY_MARGIN_S = 300.0
VALID_S = 3.0  # generous: the machine is shared, requests must fit well inside it


def exec_kubeconfig(tmp_path: Path, url: str, lifetime: str, env: dict[str, str] | None = None) -> Path:
    script = tmp_path / "plugin.py"
    script.write_text(PLUGIN)
    env_yaml = "".join(f"      - {{name: {k}, value: '{v}'}}\n" for k, v in (env or {}).items())
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters:\n- name: k\n  cluster:\n    server: {url}\n"
        "contexts:\n- name: c\n  context: {cluster: k, user: u, namespace: default}\n"
        "users:\n- name: u\n  user:\n    exec:\n"
        "      apiVersion: client.authentication.k8s.io/v1\n"
        f"      command: {sys.executable}\n"
        f"      args: ['{script}', '{tmp_path / 'runs'}', '{lifetime}']\n"
        "      interactiveMode: Never\n" + (f"      env:\n{env_yaml}" if env_yaml else "")
    )
    return path


def runs(tmp_path: Path) -> int:
    path = tmp_path / "runs"
    return int(path.read_text()) if path.exists() else 0


async def list_pods(session: aiohttp.ClientSession, conn: connections.Connection) -> int:
    options = await conn.request_options()
    async with session.get(conn.server + "/api/v1/namespaces/default/pods", **options) as resp:
        await resp.read()
        if resp.status == 401:
            conn.unauthorized()
        return resp.status


async def test_exec_token_is_cached_then_refreshed_after_expiry(
    api: fake.FakeApiServer, tmp_path: Path
) -> None:
    conn = connections.from_kubeconfig(exec_kubeconfig(tmp_path, api.url, str(LIBRARY_MARGIN_S + VALID_S)))
    assert runs(tmp_path) == 0  # loading the kubeconfig runs nothing; the first request does
    api.token = "tok-1"
    async with aiohttp.ClientSession() as session:
        assert [await list_pods(session, conn) for _ in range(5)] == [200] * 5
        assert runs(tmp_path) == 1  # cached while valid
        await asyncio.sleep(VALID_S + 0.2)
        api.token = "tok-2"  # the server no longer takes the expired token
        assert await list_pods(session, conn) == 200
        assert runs(tmp_path) == 2
        assert await list_pods(session, conn) == 200
        assert runs(tmp_path) == 2
    assert api.authorizations == ["Bearer tok-1"] * 5 + ["Bearer tok-2"] * 2


async def test_exec_token_without_expiry_is_kept_until_a_401(api: fake.FakeApiServer, tmp_path: Path) -> None:
    conn = connections.from_kubeconfig(exec_kubeconfig(tmp_path, api.url, "none"))
    api.token = "tok-1"
    async with aiohttp.ClientSession() as session:
        assert [await list_pods(session, conn) for _ in range(3)] == [200] * 3
        assert runs(tmp_path) == 1
        api.token = "tok-2"  # revoked server-side
        assert await list_pods(session, conn) == 401  # ... which makes the next request re-run it
        assert await list_pods(session, conn) == 200
        assert runs(tmp_path) == 2
    assert api.authorizations[-2:] == ["Bearer tok-1", "Bearer tok-2"]


async def test_concurrent_requests_run_the_plugin_once(api: fake.FakeApiServer, tmp_path: Path) -> None:
    conn = connections.from_kubeconfig(exec_kubeconfig(tmp_path, api.url, "3600"))
    api.token = "tok-1"
    async with aiohttp.ClientSession() as session:
        statuses = await asyncio.gather(*(list_pods(session, conn) for _ in range(8)))
    assert statuses == [200] * 8
    assert runs(tmp_path) == 1


async def test_a_failing_plugin_is_a_clear_error(tmp_path: Path) -> None:
    conn = connections.from_kubeconfig(
        exec_kubeconfig(tmp_path, "http://127.0.0.1:1", "3600", env={"PLUGIN_FAIL": "1"})
    )
    with pytest.raises(connections.ConfigError, match=r"process returned 3\. plugin: no credentials for you"):
        await conn.request_options()


async def test_the_operator_follows_the_plugin_through_expiry(
    api: fake.FakeApiServer, tmp_path: Path
) -> None:
    """Through the reflector: lists and watches carry the plugin's token, and its successor after
    expiry (the watch reconnects with fresh credentials)."""
    from epp.datastore import endpoints

    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("a", "10.0.0.1"))
    api.token = "tok-1"
    conn = connections.from_kubeconfig(exec_kubeconfig(tmp_path, api.url, str(LIBRARY_MARGIN_S + VALID_S)))
    datastore = endpoints.Datastore()
    op = operator.PoolOperator(
        datastore, connection=conn, namespace="default", pool_name="pool", settings=FAST
    )
    await op.start()
    try:
        await asyncio.wait_for(op.wait_synced(), 5.0)
        assert [ep.hostport for ep in datastore.endpoints()] == ["10.0.0.1:8000"]
        assert runs(tmp_path) == 1
        await asyncio.sleep(VALID_S + 0.2)
        api.token = "tok-2"
        api.drop_watches()  # the watches reconnect, now with the refreshed token
        api.create("pods", fake.pod("b", "10.0.0.2"))
        await wait_for(lambda: len(datastore.endpoints()) == 2, 5.0)
    finally:
        await op.stop()
    assert runs(tmp_path) == 2
    assert set(api.authorizations) == {"Bearer tok-1", "Bearer tok-2"}
    assert api.authorizations[-1] == "Bearer tok-2"


def test_kubeconfig_list_merges_as_kubectl(tmp_path: Path) -> None:
    """$KUBECONFIG with several files: merged, the first to name an entry wins, missing files skipped."""
    a = tmp_path / "a"
    a.write_text(fake.kubeconfig("http://first:1", token="x"))
    b = tmp_path / "b"
    b.write_text(
        "current-context: other\nclusters:\n- name: fake\n  cluster: {server: 'http://second:2'}\n"
        "- name: o\n  cluster: {server: 'http://other:3'}\n"
        "contexts:\n- name: other\n  context: {cluster: o, namespace: ns2}\nusers: []\n"
    )
    merged = connections.from_kubeconfig(f"{a}:{tmp_path / 'missing'}:{b}")
    assert merged.server == "http://first:1"  # a's current-context and a's cluster "fake"
    assert connections.from_kubeconfig(f"{a}:{b}", context="other").namespace == "ns2"
