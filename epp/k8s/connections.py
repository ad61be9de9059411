"""Where the Kubernetes API server is and how to authenticate: in-cluster or from a kubeconfig.

`Connection` is everything the watchers need to make requests: the server URL, an SSL context
(or None for plain HTTP, as the test API server uses) and a bearer token, read from a file on
every request when it comes from the service account, because projected tokens rotate (about
hourly) under a running process.

Sources, in order of `load()`:

1. an explicit kubeconfig path (`--kubeconfig`), else `$KUBECONFIG` (first file of the list);
2. in-cluster: `$KUBERNETES_SERVICE_HOST`/`$KUBERNETES_SERVICE_PORT` with the service account's
   token and CA under /var/run/secrets/kubernetes.io/serviceaccount;
3. `~/.kube/config`.

From a kubeconfig, the current context's cluster (`server`, `certificate-authority[-data]`,
`insecure-skip-tls-verify`) and user (`token`, `tokenFile`, `client-certificate[-data]` with
`client-key[-data]`) are used. `exec` and `auth-provider` plugins are not supported: the error says
so, rather than silently connecting unauthenticated.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ConfigError(ValueError):
    """No usable cluster configuration; the message says what was tried or what is wrong."""


@dataclasses.dataclass(frozen=True)
class Connection:
    """How to reach one API server."""

    server: str  # "https://10.0.0.1:443" (no trailing slash)
    ssl_context: ssl.SSLContext | None = None  # None: plain HTTP, or the default for https
    token: str | None = None  # a fixed bearer token
    token_file: Path | None = None  # a bearer token re-read per request (service accounts)
    namespace: str | None = None  # the namespace the configuration names (in-cluster: our own)

    def headers(self) -> dict[str, str]:
        token = self.token
        if self.token_file is not None:
            try:
                token = self.token_file.read_text(encoding="utf-8").strip()
            except OSError:
                token = self.token  # keep the last known one; the server will say 401 if stale
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers


def in_cluster(sa_dir: Path = SERVICE_ACCOUNT_DIR) -> Connection:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ConfigError("not in a cluster: KUBERNETES_SERVICE_HOST is not set")
    token_file = sa_dir / "token"
    if not token_file.exists():
        raise ConfigError(f"in-cluster: no service-account token at {token_file}")
    ctx = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
    host = f"[{host}]" if ":" in host else host
    ns_file = sa_dir / "namespace"
    namespace = ns_file.read_text(encoding="utf-8").strip() if ns_file.exists() else None
    return Connection(
        server=f"https://{host}:{port}", ssl_context=ctx, token_file=token_file, namespace=namespace
    )


def _named(items: Any, name: str, what: str, path: Path) -> Mapping[str, Any]:
    for item in items or []:
        if isinstance(item, Mapping) and item.get("name") == name:
            body = item.get(what)
            return body if isinstance(body, Mapping) else {}
    raise ConfigError(f"kubeconfig {path}: no {what} named {name!r}")


def _material(entry: Mapping[str, Any], key: str, base: Path) -> str | None:
    """A file path for `key` (`key-data` is written to a private temp file: ssl wants files)."""
    data = entry.get(f"{key}-data")
    if data:
        fd, name = tempfile.mkstemp(prefix="epp-kube-", suffix=".pem")
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(data))
        return name
    value = entry.get(key)
    if value:
        return str((base / str(value)).resolve())
    return None


def from_kubeconfig(path: str | os.PathLike[str], context: str | None = None) -> Connection:
    path = Path(path).expanduser()
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"kubeconfig {path}: cannot read: {e}") from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"kubeconfig {path}: not a mapping")
    ctx_name = context or doc.get("current-context")
    if not ctx_name:
        raise ConfigError(f"kubeconfig {path}: no current-context")
    ctx = _named(doc.get("contexts"), ctx_name, "context", path)
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster")), "cluster", path)
    user = _named(doc.get("users"), str(ctx.get("user")), "user", path) if ctx.get("user") else {}
    server = str(cluster.get("server", "")).rstrip("/")
    if not server.startswith(("http://", "https://")):
        raise ConfigError(f"kubeconfig {path}: cluster server {server!r} is not an http(s) URL")
    if "exec" in user or "auth-provider" in user:
        raise ConfigError(f"kubeconfig {path}: exec and auth-provider credentials are not supported")
    base = path.parent
    ssl_context: ssl.SSLContext | None = None
    if server.startswith("https://"):
        ssl_context = ssl.create_default_context(cafile=_material(cluster, "certificate-authority", base))
        if cluster.get("insecure-skip-tls-verify"):
            ssl_context.check_hostname = False
            ssl_context.verify_mode = ssl.CERT_NONE
        cert = _material(user, "client-certificate", base)
        if cert:
            ssl_context.load_cert_chain(cert, _material(user, "client-key", base))
    token_file = user.get("tokenFile")
    return Connection(
        server=server,
        ssl_context=ssl_context,
        token=user.get("token"),
        token_file=(base / str(token_file)) if token_file else None,
        namespace=ctx.get("namespace"),
    )


def load(kubeconfig: str | None = None, context: str | None = None) -> Connection:
    """The connection to use (order in the module docstring); ConfigError if there is none."""
    path = kubeconfig or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0]
    if path:
        return from_kubeconfig(path, context)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster()
    default = Path("~/.kube/config").expanduser()
    if default.exists():
        return from_kubeconfig(default, context)
    raise ConfigError(
        "no Kubernetes configuration: not in a cluster, and no --kubeconfig, $KUBECONFIG or ~/.kube/config"
    )
