"""Where the Kubernetes API server is and how to authenticate: in-cluster or from a kubeconfig.

Configuration and credentials come from kubernetes_asyncio's config loader (the maintained Python
port of client-go's): kubeconfig parsing and merging, in-cluster service accounts, `exec`
credential plugins (EKS `aws eks get-token`, GKE `gke-gcloud-auth-plugin`, AKS `kubelogin`), OIDC,
tokens, basic auth, client certificates and CA data. epp keeps its own requests (list/watch,
Leases, Events, reviews) on its own aiohttp sessions; why is in `epp.k8s`'s docstring.

`Connection` is what those requests need: the server URL (known at `load()`), and per request
`await connection.request_options()` (the Authorization header, the SSL context and the TLS
server name), which refreshes credentials when they are due:

- an exec plugin's token is cached until its `expirationTimestamp` (less the library's 5 minutes'
  margin), then the plugin runs again (an asyncio subprocess: the event loop keeps routing while
  a slow plugin runs); a credential without expiry is kept until the server answers 401;
- a service account's projected token is re-read from its file once a minute (the library's
  in-cluster loader, as client-go); a kubeconfig `tokenFile` is re-read on every request;
- any 401 (`connection.unauthorized()`) makes the next request load the credentials afresh.

Sources, in order of `load()`:

1. an explicit kubeconfig path (`--kubeconfig`), else `$KUBECONFIG` (its files merged as kubectl
   merges them: the first file to name a cluster, context or user wins);
2. in-cluster: `$KUBERNETES_SERVICE_HOST`/`$KUBERNETES_SERVICE_PORT` with the service account's
   token and CA under /var/run/secrets/kubernetes.io/serviceaccount;
3. `~/.kube/config`.

The legacy `auth-provider` plugins other than `oidc` (gcp, azure: removed from kubectl 1.26) are
refused with the exec plugin to use instead, rather than silently connecting unauthenticated.
kubernetes_asyncio is imported on first use: it costs ~0.3 s and 850 modules, which an `epp serve`
with static endpoints should not pay.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config.kube_config import ConfigNode, KubeConfigLoader

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ConfigError(ValueError):
    """No usable cluster configuration or credentials; the message says what was tried or is wrong."""


class Credentials:
    """Static credentials: a fixed bearer token, or one read from a file on every request."""

    def __init__(self, token: str | None = None, token_file: Path | None = None) -> None:
        self.token = token
        self.token_file = token_file
        self.client_cert: tuple[str, str | None] | None = None  # (cert file, key file)

    async def authorization(self) -> str | None:
        """The Authorization header's value ("Bearer ..."), or None to send none."""
        token = self.token
        if self.token_file is not None:
            try:
                token = self.token_file.read_text(encoding="utf-8").strip()
            except OSError:
                pass  # keep the last known one; the server says 401 if it is stale
            else:
                self.token = token
        return f"Bearer {token}" if token else None

    def invalidate(self) -> None:
        """The server refused the credentials (401): obtain them afresh where that is possible."""


class Connection:
    """How to reach one API server, with credentials that refresh themselves."""

    def __init__(
        self,
        server: str,
        ssl_context: ssl.SSLContext | None = None,
        token: str | None = None,
        token_file: Path | None = None,
        namespace: str | None = None,
        *,
        credentials: Credentials | None = None,
        tls_server_name: str | None = None,
        ca_file: str | None = None,
        verify: bool = True,
    ) -> None:
        self.server = server  # "https://10.0.0.1:443" (no trailing slash)
        self.namespace = namespace  # the namespace the configuration names (in-cluster: our own)
        self.credentials = credentials or Credentials(token, token_file)
        self.tls_server_name = tls_server_name
        self._ssl_context = ssl_context
        self._ca_file = ca_file
        self._verify = verify
        self._cert: tuple[str, str | None] | None = None

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """None: plain HTTP, or the default context for https."""
        return self._ssl_context

    async def request_options(self, *, content_type: str | None = None) -> dict[str, Any]:
        """aiohttp request keyword arguments: headers (with Authorization), ssl, server_hostname.

        Raises ConfigError when credentials cannot be obtained (an exec plugin failed)."""
        authorization = await self.credentials.authorization()
        if self.credentials.client_cert != self._cert and self.server.startswith("https://"):
            # An exec plugin handed out (new) client certificates: a context that presents them.
            self._cert = self.credentials.client_cert
            self._ssl_context = _ssl_context(self._ca_file, self._cert, self._verify)
        headers = {"Accept": "application/json"}
        if authorization:
            headers["Authorization"] = authorization
        if content_type:
            headers["Content-Type"] = content_type
        options: dict[str, Any] = {"headers": headers}
        if self._ssl_context is not None:
            options["ssl"] = self._ssl_context
        if self.tls_server_name:
            options["server_hostname"] = self.tls_server_name
        return options

    def unauthorized(self) -> None:
        """Report a 401: the next request obtains credentials afresh (an exec plugin runs again)."""
        self.credentials.invalidate()


def _ssl_context(ca_file: str | None, cert: tuple[str, str | None] | None, verify: bool) -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
        if cert is not None:
            ctx.load_cert_chain(cert[0], cert[1])
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"TLS material: {e}") from None
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


# -- in-cluster ------------------------------------------------------------------------------------


class _ServiceAccount(Credentials):
    """The pod's projected token, re-read by the library's hook once a minute (tokens rotate)."""

    def __init__(self, configuration: Configuration) -> None:
        super().__init__()
        self._configuration = configuration

    async def authorization(self) -> str | None:
        value = await self._configuration.get_api_key_with_prefix("BearerToken")
        return str(value).strip() if value else None


def in_cluster(sa_dir: Path = SERVICE_ACCOUNT_DIR) -> Connection:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
        raise ConfigError("not in a cluster: KUBERNETES_SERVICE_HOST is not set")
    token_file = sa_dir / "token"
    if not token_file.exists():
        raise ConfigError(f"in-cluster: no service-account token at {token_file}")
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config import ConfigException, load_incluster_config

    configuration = Configuration()
    environ = {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": os.environ.get("KUBERNETES_SERVICE_PORT") or "443",
    }
    try:
        load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration,
            token_filename=str(token_file),
            cert_filename=str(sa_dir / "ca.crt"),
            environ=environ,
        )
    except (ConfigException, OSError) as e:
        raise ConfigError(f"in-cluster: {e}") from None
    ns_file = sa_dir / "namespace"
    namespace = ns_file.read_text(encoding="utf-8").strip() if ns_file.exists() else None
    return Connection(
        server=str(configuration.host),
        ssl_context=_ssl_context(configuration.ssl_ca_cert, None, True),
        namespace=namespace,
        credentials=_ServiceAccount(configuration),
        ca_file=configuration.ssl_ca_cert,
    )


# -- kubeconfig ------------------------------------------------------------------------------------

# Legacy auth-provider plugins kubectl no longer has, and what replaced them.
_EXEC_INSTEAD = {
    "gcp": "gke-gcloud-auth-plugin",
    "azure": "kubelogin",
}


class _KubeconfigUser(Credentials):
    """A kubeconfig user's credentials, loaded (and refreshed) by the library's KubeConfigLoader."""

    def __init__(self, loader: KubeConfigLoader, user: Mapping[str, Any], token_file: Path | None) -> None:
        super().__init__(token_file=token_file)
        self._loader = loader
        self._exec = "exec" in user
        self._header: str | None = None  # "Bearer ..." or "Basic ..." as the library made it
        self._loaded = False
        self._stale = False
        self._lock = asyncio.Lock()

    async def authorization(self) -> str | None:
        async with self._lock:  # one refresh at a time: concurrent requests wait for its result
            await self._refresh()
        if self.token_file is not None:
            return await super().authorization()
        return self._header

    async def _refresh(self) -> None:
        from kubernetes_asyncio.client import Configuration
        from kubernetes_asyncio.config import ConfigException

        loader = self._loader
        try:
            if not self._loaded or self._stale:
                if self._exec and self._stale:
                    # The library skips the plugin while its token has not expired: forget it.
                    loader.__dict__.pop("exec_plugin_expiry", None)
                configuration = Configuration()
                await loader.load_and_set(configuration)
                self._loaded, self._stale = True, False
                self._take(configuration.api_key.get("BearerToken"))
            elif self._exec and "exec_plugin_expiry" in loader.__dict__:
                # A plugin credential with an expiry: the library runs the plugin again only once
                # it has expired (less its margin). Without an expiry it is kept until a 401.
                before = (loader.exec_plugin_expiry, getattr(loader, "token", None))
                await loader.load_from_exec_plugin()
                if (loader.exec_plugin_expiry, getattr(loader, "token", None)) != before:
                    self._take(loader.token)
        except (ConfigException, OSError, ValueError) as e:
            raise ConfigError(f"kubeconfig credentials: {e}") from None

    def _take(self, header: Any) -> None:
        self._header = str(header) if header else None
        cert = getattr(self._loader, "cert_file", None)  # from the user, or the exec plugin's
        key = getattr(self._loader, "key_file", None)
        self.client_cert = (str(cert), str(key) if key else None) if cert else None

    def invalidate(self) -> None:
        self._stale = True


def _entry(merged: ConfigNode, what: str, name: str, path: Path) -> tuple[Mapping[str, Any], Path]:
    """The `what` (context, cluster, user) named `name`, and the directory of the file defining it."""
    from kubernetes_asyncio.config import ConfigException

    try:
        found = merged[what + "s"].get_with_name(name)
    except ConfigException:
        found = None
    if found is None:
        raise ConfigError(f"kubeconfig {path}: no {what} named {name!r}")
    body = found.safe_get(what)
    # Relative paths are relative to the file that defined the entry (kubectl's rule).
    return (body if isinstance(body, Mapping) else {}), Path(found.path or path).parent


def from_kubeconfig(path: str | os.PathLike[str], context: str | None = None) -> Connection:
    """The connection a kubeconfig names; `path` may list several files (os.pathsep), merged."""
    from kubernetes_asyncio.config import ConfigException
    from kubernetes_asyncio.config.exec_provider import ExecProvider
    from kubernetes_asyncio.config.kube_config import (
        ConfigNode,
        FileOrData,
        KubeConfigLoader,
        KubeConfigMerger,
    )

    paths = [Path(p).expanduser() for p in str(path).split(os.pathsep) if p]
    if len(paths) > 1:  # a $KUBECONFIG list: kubectl skips the files that do not exist
        paths = [p for p in paths if p.is_file()] or paths[:1]
    first = paths[0] if paths else Path(str(path))
    if not first.is_file():
        raise ConfigError(f"kubeconfig {first}: cannot read: no such file")
    try:
        merger = KubeConfigMerger(os.pathsep.join(str(p) for p in paths))
    except (OSError, ValueError, AttributeError, TypeError) as e:  # yaml errors are ValueErrors
        raise ConfigError(f"kubeconfig {first}: cannot read: {e}") from None
    merged = merger.config
    if not isinstance(merged, ConfigNode) or not isinstance(merged.value, Mapping):
        raise ConfigError(f"kubeconfig {first}: not a mapping")
    # kubectl takes the first file's current-context (the library's merge keeps the last one's).
    current = (merger.config_files.get(str(p)) or {} for p in paths)
    ctx_name = context or next((c["current-context"] for c in current if c.get("current-context")), None)
    if not ctx_name:
        raise ConfigError(f"kubeconfig {first}: no current-context")
    ctx, _ = _entry(merged, "context", str(ctx_name), first)
    cluster, cluster_dir = _entry(merged, "cluster", str(ctx.get("cluster")), first)
    user, user_dir = (
        _entry(merged, "user", str(ctx["user"]), first) if ctx.get("user") else ({}, first.parent)
    )
    server = str(cluster.get("server", "")).rstrip("/")
    if not server.startswith(("http://", "https://")):
        raise ConfigError(f"kubeconfig {first}: cluster server {server!r} is not an http(s) URL")
    provider = (user.get("auth-provider") or {}).get("name")
    if "auth-provider" in user and provider != "oidc":
        instead = _EXEC_INSTEAD.get(str(provider), "the provider's exec plugin")
        raise ConfigError(
            f"kubeconfig {first}: auth-provider {provider!r} is not supported (kubectl removed it); "
            f"use an exec credential plugin ({instead})"
        )
    https = server.startswith("https://")
    try:
        loader = KubeConfigLoader(config_dict=merged, active_context=str(ctx_name), config_base_path=None)
        if "exec" in user:
            ExecProvider(ConfigNode("exec", user["exec"]))  # validates command and apiVersion now
        ca = FileOrData(cluster, "certificate-authority", file_base_path=str(cluster_dir)) if https else None
        ca_file = ca.as_file() if ca is not None else None
    except ConfigException as e:
        raise ConfigError(f"kubeconfig {first}: {e}") from None
    verify = not cluster.get("insecure-skip-tls-verify")
    token_file = user.get("tokenFile")
    if user.get("token") or "exec" in user:
        token_file = None  # the library's precedence: exec, then token, then tokenFile
    return Connection(
        server=server,
        ssl_context=_ssl_context(ca_file, None, verify) if https else None,
        namespace=ctx.get("namespace"),
        credentials=_KubeconfigUser(loader, user, (user_dir / str(token_file)) if token_file else None),
        tls_server_name=cluster.get("tls-server-name"),
        ca_file=ca_file,
        verify=verify,
    )


def load(kubeconfig: str | None = None, context: str | None = None) -> Connection:
    """The connection to use (order in the module docstring); ConfigError if there is none."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or ""
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
