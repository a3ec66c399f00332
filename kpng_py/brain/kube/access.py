"""How `kpng-py kube` reaches the Kubernetes API server: its URL, the CA that
signed its certificate, and the client's credentials (a bearer token, read
from its file at each request so that a rotated service-account token is
used, or a client certificate).

From, in this order: `--kubeconfig`; `--server` alone; the pod's service
account (KUBERNETES_SERVICE_HOST and _PORT, and the files under
/var/run/secrets/kubernetes.io/serviceaccount); $KUBECONFIG; ~/.kube/config.
`--server`, `--token-file` and `--certificate-authority` override what the
kubeconfig or the service account says. A kubeconfig's `exec` and
`auth-provider` users (plugins that fetch credentials) are not supported:
the error says so and what to give instead.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

import yaml

from kpng_py.brain.settings import KubeAccessError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")


@dataclass(frozen=True)
class AccessFlags:
    """What the `kube` command's flags say (None: not given)."""

    kubeconfig: Path | None = None
    server: str | None = None
    token_file: Path | None = None
    certificate_authority: Path | None = None


@dataclass(frozen=True)
class ApiServerAccess:
    """The API server's URL and what a client needs to be trusted by it and
    to trust it. `ca_pem` None: the system's CAs."""

    url: str
    ca_pem: str | None = None
    token: str | None = None  # given as such (a kubeconfig's `token`)
    token_file: Path | None = None  # read at each request
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    origin: str = ""  # where this came from, for messages

    def authorization(self) -> str | None:
        """The Authorization header's value (None: no token)."""
        token = self.token
        if self.token_file is not None:
            try:
                token = self.token_file.read_text().strip()
            except OSError as err:
                raise KubeAccessError(f"token file {self.token_file}: {err.strerror}") from err
        return f"Bearer {token}" if token else None

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.ca_pem)
        if self.client_cert_pem is not None and self.client_key_pem is not None:
            _load_client_certificate(context, self.client_cert_pem, self.client_key_pem)
        return context


def resolve(flags: AccessFlags, environ: Mapping[str, str] = os.environ,
            service_account: Path = SERVICE_ACCOUNT) -> ApiServerAccess:
    """The access the flags, the environment and the pod say; KubeAccessError
    naming what is missing or wrong, and the flag to give."""
    host = environ.get("KUBERNETES_SERVICE_HOST")
    if flags.kubeconfig is not None:
        access = from_kubeconfig(flags.kubeconfig)
    elif flags.server is not None:
        access = ApiServerAccess(flags.server, origin="--server")
    elif host:
        access = in_cluster(host, environ.get("KUBERNETES_SERVICE_PORT", "443"), service_account)
    elif environ.get("KUBECONFIG"):
        access = from_kubeconfig(Path(environ["KUBECONFIG"].split(os.pathsep)[0]))
    elif DEFAULT_KUBECONFIG.expanduser().is_file():
        access = from_kubeconfig(DEFAULT_KUBECONFIG.expanduser())
    else:
        raise KubeAccessError("no API server to watch: give --kubeconfig PATH or --server URL "
                              "(in a pod, its service account is used)")
    return _overridden(access, flags)


def _overridden(access: ApiServerAccess, flags: AccessFlags) -> ApiServerAccess:
    if flags.server is not None:
        access = replace(access, url=flags.server)
    if flags.token_file is not None:
        access = replace(access, token=None, token_file=flags.token_file)
    if flags.certificate_authority is not None:
        access = replace(access, ca_pem=_read_text(flags.certificate_authority,
                                                    "--certificate-authority"))
    if not access.url.startswith(("https://", "http://")):
        raise KubeAccessError(f"{access.origin}: server {access.url!r} is not an http(s):// URL "
                              "(e.g. https://10.96.0.1:443)")
    return access


def in_cluster(host: str, port: str, service_account: Path = SERVICE_ACCOUNT) -> ApiServerAccess:
    """The pod's service account, as client-go's rest.InClusterConfig."""
    token_file, ca = service_account / "token", service_account / "ca.crt"
    if not token_file.is_file():
        raise KubeAccessError(f"in a pod (KUBERNETES_SERVICE_HOST={host}) without a service "
                              f"account token at {token_file}: mount one "
                              "(automountServiceAccountToken) or give --kubeconfig")
    host = f"[{host}]" if ":" in host else host
    return ApiServerAccess(f"https://{host}:{port}", _read_text(ca, "the service account's CA"),
                           token_file=token_file, origin=f"the service account ({service_account})")


def from_kubeconfig(path: Path) -> ApiServerAccess:
    """The current context's cluster and user of a kubeconfig."""
    what = f"kubeconfig {path}"
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as err:
        raise KubeAccessError(f"{what}: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise KubeAccessError(f"{what}: not YAML: {err}") from err
    if not isinstance(config, dict):
        raise KubeAccessError(f"{what}: not a kubeconfig (a mapping with clusters, users and "
                              "contexts)")
    context_name = config.get("current-context") or ""
    context = _named(config, "contexts", "context", context_name, what)
    cluster = _named(config, "clusters", "cluster", context.get("cluster", ""), what)
    user = (_named(config, "users", "user", context["user"], what)
            if context.get("user") else {})
    if not cluster.get("server"):
        raise KubeAccessError(f"{what}: cluster {context.get('cluster')!r} has no server")
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise KubeAccessError(f"{what}: user {context.get('user')!r} gets its credentials "
                                  f"from an {plugin} plugin, which kpng-py does not run: give a "
                                  "kubeconfig with a token or a client certificate, or "
                                  "--token-file")
    base = path.parent
    token_file = user.get("tokenFile")
    return ApiServerAccess(
        url=cluster["server"],
        ca_pem=_pem(cluster, "certificate-authority", base, what),
        token=user.get("token"),
        token_file=base / token_file if token_file else None,
        client_cert_pem=_bytes(_pem(user, "client-certificate", base, what)),
        client_key_pem=_bytes(_pem(user, "client-key", base, what)),
        origin=what)


def _named(config: dict, section: str, member: str, name: str, what: str) -> dict:
    for entry in config.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get(member) or {}
    raise KubeAccessError(f"{what}: no {member} named {name!r} in {section}"
                          + ("; set current-context" if member == "context" else ""))


def _pem(section: dict, key: str, base: Path, what: str) -> str | None:
    """`key-data` (base64) or the file `key` names (relative to the kubeconfig)."""
    data = section.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(data, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as err:
            raise KubeAccessError(f"{what}: {key}-data is not base64 of a PEM text") from err
    if section.get(key):
        return _read_text(base / section[key], f"{what}: {key}")
    return None


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise KubeAccessError(f"{what} {path}: {err.strerror}") from err


def _load_client_certificate(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a certificate chain from files only: written to a private
    directory, loaded, and removed at once."""
    with tempfile.TemporaryDirectory(prefix="kpng-py-kube-") as directory:
        cert_file, key_file = Path(directory) / "client.crt", Path(directory) / "client.key"
        for path, data in ((cert_file, cert), (key_file, key)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as out:
                out.write(data)
        try:
            context.load_cert_chain(cert_file, key_file)
        except ssl.SSLError as err:
            raise KubeAccessError(f"the client certificate or key cannot be used: {err}") from err
