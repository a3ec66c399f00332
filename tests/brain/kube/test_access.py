"""Where `kpng-py kube` finds the API server and its credentials."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from kpng_py.brain.kube.access import AccessFlags, ApiServerAccess, resolve
from kpng_py.brain.settings import KubeAccessError

CA = "-----BEGIN CERTIFICATE-----\nnot checked here\n-----END CERTIFICATE-----\n"


def _kubeconfig(path: Path, user: dict, cluster: dict | None = None) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": cluster or {
            "server": "https://127.0.0.1:6443", "certificate-authority": "ca.crt"}}],
        "users": [{"name": "admin", "user": user}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "admin"}}]}))
    return path


def test_a_kubeconfig_with_a_token_and_a_ca_file_beside_it(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text(CA)
    config = _kubeconfig(tmp_path / "config", {"token": "t0k3n"})
    access = resolve(AccessFlags(kubeconfig=config), environ={})
    assert (access.url, access.ca_pem, access.authorization()) == (
        "https://127.0.0.1:6443", CA, "Bearer t0k3n")


def test_a_kubeconfig_with_data_and_a_client_certificate(tmp_path: Path) -> None:
    def data(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    config = _kubeconfig(tmp_path / "config",
                         {"client-certificate-data": data("CERT"), "client-key-data": data("KEY")},
                         {"server": "https://10.0.0.1:6443",
                          "certificate-authority-data": data(CA)})
    access = resolve(AccessFlags(kubeconfig=config), environ={})
    assert (access.ca_pem, access.client_cert_pem, access.client_key_pem) == (
        CA, b"CERT", b"KEY")
    assert access.authorization() is None


def test_the_flags_override_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text(CA)
    (tmp_path / "other-ca.crt").write_text("OTHER")
    (tmp_path / "token").write_text("from-file\n")
    config = _kubeconfig(tmp_path / "config", {"token": "t0k3n"})
    access = resolve(AccessFlags(config, "https://[fd00::1]:443", tmp_path / "token",
                                 tmp_path / "other-ca.crt"), environ={})
    assert (access.url, access.ca_pem, access.authorization()) == (
        "https://[fd00::1]:443", "OTHER", "Bearer from-file")


def test_in_a_pod_its_service_account_and_a_rotated_token(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first")
    (tmp_path / "ca.crt").write_text(CA)
    access = resolve(AccessFlags(), environ={"KUBERNETES_SERVICE_HOST": "fd00:10:96::1",
                                             "KUBERNETES_SERVICE_PORT": "443"},
                     service_account=tmp_path)
    assert (access.url, access.ca_pem, access.authorization()) == (
        "https://[fd00:10:96::1]:443", CA, "Bearer first")
    (tmp_path / "token").write_text("rotated")  # as the kubelet does, within the hour
    assert access.authorization() == "Bearer rotated"


def test_the_kubeconfig_environment_variable(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text(CA)
    config = _kubeconfig(tmp_path / "config", {"tokenFile": "token"})
    (tmp_path / "token").write_text("abc")
    access = resolve(AccessFlags(), environ={"KUBECONFIG": str(config)})
    assert access.token_file == tmp_path / "token" and access.authorization() == "Bearer abc"


@pytest.mark.parametrize("user, cluster, message", [
    ({"exec": {"command": "aws"}}, None,
     "user 'admin' gets its credentials from an exec plugin, which kpng-py does not run"),
    ({}, {"certificate-authority-data": "x"}, "cluster 'lab' has no server"),
    ({}, {"server": "10.0.0.1:6443"}, "server '10.0.0.1:6443' is not an http(s):// URL"),
    ({}, {"server": "https://x", "certificate-authority-data": "%%%"},
     "certificate-authority-data is not base64 of a PEM text"),
])
def test_a_kubeconfig_that_cannot_be_used_is_named_with_the_fix(
        tmp_path: Path, user: dict, cluster: dict | None, message: str) -> None:
    (tmp_path / "ca.crt").write_text(CA)
    config = _kubeconfig(tmp_path / "config", user, cluster)
    with pytest.raises(KubeAccessError, match=f"kubeconfig {config}: .*{_escaped(message)}"):
        resolve(AccessFlags(kubeconfig=config), environ={})


def _escaped(text: str) -> str:
    return text.replace("(", r"\(").replace(")", r"\)")


def test_nothing_to_watch_says_which_flags_to_give(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeAccessError, match="no API server to watch: give --kubeconfig PATH "
                                              "or --server URL"):
        resolve(AccessFlags(), environ={})


def test_a_pod_without_a_token_says_so(tmp_path: Path) -> None:
    with pytest.raises(KubeAccessError, match="without a service account token"):
        resolve(AccessFlags(), environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
                service_account=tmp_path)


def test_a_token_file_gone_is_an_error_naming_it(tmp_path: Path) -> None:
    access = ApiServerAccess("https://x", token_file=tmp_path / "gone")
    with pytest.raises(KubeAccessError, match=f"token file {tmp_path / 'gone'}: No such file"):
        access.authorization()
