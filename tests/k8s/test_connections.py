"""Cluster configuration: kubeconfig and in-cluster service account."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from epp.k8s import connections
from tests.k8s import fake_apiserver as fake


async def _authorization(conn: connections.Connection) -> str | None:
    headers: dict[str, str] = (await conn.request_options())["headers"]
    return headers.get("Authorization")


async def test_kubeconfig_with_token(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(fake.kubeconfig("http://127.0.0.1:1234/", token="abc"))
    conn = connections.from_kubeconfig(path)
    assert conn.server == "http://127.0.0.1:1234"
    assert conn.ssl_context is None
    assert conn.namespace == "default"
    assert await _authorization(conn) == "Bearer abc"


async def test_kubeconfig_https_insecure_and_token_file(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("one\n")
    path = tmp_path / "config"
    path.write_text(
        "current-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://k:6443\n"
        "    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n"
        "users:\n- name: u\n  user: {tokenFile: tok}\n"
    )
    conn = connections.from_kubeconfig(path)
    assert isinstance(conn.ssl_context, ssl.SSLContext)
    assert conn.ssl_context.verify_mode == ssl.CERT_NONE
    assert await _authorization(conn) == "Bearer one"
    (tmp_path / "tok").write_text("two")  # rotated: read again on the next request
    assert await _authorization(conn) == "Bearer two"


@pytest.mark.parametrize(
    ("user", "error"),
    [
        ("  user: {exec: {command: aws}}\n", "missing key 'apiVersion'"),
        ("  user: {auth-provider: {name: gcp}}\n", "gke-gcloud-auth-plugin"),
        ("  user: {auth-provider: {name: azure}}\n", "kubelogin"),
        ("  user: {}\n", None),
    ],
)
async def test_kubeconfig_user_kinds(tmp_path: Path, user: str, error: str | None) -> None:
    path = tmp_path / "config"
    path.write_text(
        "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'http://k'}\n"
        f"contexts:\n- name: c\n  context: {{cluster: k, user: u}}\nusers:\n- name: u\n{user}"
    )
    if error:
        with pytest.raises(connections.ConfigError, match=error):
            connections.from_kubeconfig(path)
    else:
        assert await _authorization(connections.from_kubeconfig(path)) is None


def test_kubeconfig_errors(tmp_path: Path) -> None:
    with pytest.raises(connections.ConfigError, match="cannot read"):
        connections.from_kubeconfig(tmp_path / "missing")
    path = tmp_path / "config"
    path.write_text("current-context: nope\ncontexts: []\n")
    with pytest.raises(connections.ConfigError, match="no context named 'nope'"):
        connections.from_kubeconfig(path)


async def test_in_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(connections.ConfigError, match="not in a cluster"):
        connections.in_cluster(tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "namespace").write_text("inference")
    (tmp_path / "ca.crt").write_text(_self_signed_pem())
    conn = connections.in_cluster(tmp_path)
    assert conn.server == "https://10.96.0.1:443"
    assert conn.namespace == "inference"
    assert await _authorization(conn) == "Bearer sa-token"


def test_load_prefers_explicit_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config"
    path.write_text(fake.kubeconfig("http://a:1"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert connections.load(str(path)).server == "http://a:1"
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert connections.load().server == "http://a:1"


def _self_signed_pem() -> str:
    from epp.extproc import tls

    _, cert_pem = tls.self_signed()
    return cert_pem.decode()


async def test_kubeconfig_ca_data_client_certificate_and_tls_server_name(tmp_path: Path) -> None:
    """An https API server that demands a client certificate, with everything inline in the
    kubeconfig (`*-data`, as `kind` and cloud CLIs write them), and `tls-server-name` naming the
    certificate's DNS name while the server URL is an IP."""
    import base64

    import aiohttp

    from epp.extproc import tls

    server_key, server_cert = tls.self_signed()
    client_key, client_cert = tls.self_signed()
    (tmp_path / "server.key").write_bytes(server_key)
    (tmp_path / "server.crt").write_bytes(server_cert)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    server_ctx.load_verify_locations(cadata=client_cert.decode())
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    api = fake.FakeApiServer()
    url = await api.start(ssl_context=server_ctx)
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731

    def kubeconfig(user: str) -> Path:
        path = tmp_path / "config"
        path.write_text(
            "current-context: c\nclusters:\n- name: k\n  cluster:\n"
            f"    server: {url}\n    certificate-authority-data: {b64(server_cert)}\n"
            "    tls-server-name: localhost\n"
            f"contexts:\n- name: c\n  context: {{cluster: k, user: u}}\nusers:\n- name: u\n  user:\n{user}"
        )
        return path

    try:
        async with aiohttp.ClientSession() as session:
            with_cert = connections.from_kubeconfig(
                kubeconfig(
                    f"    client-certificate-data: {b64(client_cert)}\n"
                    f"    client-key-data: {b64(client_key)}\n"
                )
            )
            options = await with_cert.request_options()
            assert options["server_hostname"] == "localhost"
            async with session.get(url + "/api/v1/namespaces/default/pods", **options) as resp:
                assert resp.status == 200
            without = connections.from_kubeconfig(kubeconfig("    {}\n"))
            with pytest.raises(aiohttp.ClientError):  # the server refuses the handshake
                async with session.get(
                    url + "/api/v1/namespaces/default/pods", **(await without.request_options())
                ) as resp:
                    await resp.read()
    finally:
        await api.stop()


async def test_kubeconfig_oidc_id_token(tmp_path: Path) -> None:
    """An `oidc` auth-provider whose id-token is still valid is sent as is (no IdP contacted)."""
    import base64
    import json
    import time

    def part(doc: dict[str, object]) -> str:
        return base64.b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    id_token = f"{part({'alg': 'none'})}.{part({'exp': int(time.time()) + 3600})}.sig"
    path = tmp_path / "config"
    path.write_text(
        "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'http://k'}\n"
        "contexts:\n- name: c\n  context: {cluster: k, user: u}\nusers:\n- name: u\n  user:\n"
        "    auth-provider:\n      name: oidc\n"
        f"      config: {{client-id: epp, idp-issuer-url: 'https://idp', id-token: '{id_token}'}}\n"
    )
    assert await _authorization(connections.from_kubeconfig(path)) == f"Bearer {id_token}"
