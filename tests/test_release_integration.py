"""Bad input to the release (hack/release.py) against the local cluster's real registry and package index: each
fails with the component's own message and what to do, and nothing that was pushed looks like a release.

The whole release path (build, push, install only from the registry and index, real pulls on a cold real node) is
tests/e2e/test_release_e2e.py."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))

from releaseio import Endpoint, Registry, build_wheels


@pytest.fixture
def registry(cluster: Any) -> Any:
    """The session cluster's registry and index (started once; its servers are real: docker-registry and
    pypiserver over TLS with basic auth): ``access`` and ``tools``, with the ``cluster`` they serve."""
    from localcluster.registry import RegistryError

    try:
        cluster.start_registry()
    except RegistryError as err:
        pytest.skip(f"RELEASE TOOLS NOT INSTALLED: {err}")
    return SimpleNamespace(access=cluster.registry.access, tools=cluster.registry.tools, cluster=cluster)


def release(reg: Any, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    a = reg.access
    base = {"REGISTRY_USERNAME": a.credentials.username, "REGISTRY_PASSWORD": a.credentials.password,
            "INDEX_USERNAME": a.credentials.username, "INDEX_PASSWORD": a.credentials.password}
    return subprocess.run([sys.executable, str(REPO / "hack" / "release.py"), *args], capture_output=True, text=True,
                          env={**os.environ, **base, **env}, timeout=150, check=False)


def publish(reg: Any, namespace: str, *extra: str, tag: str = "v0.1.0", registry: str = "",
            **env: str) -> subprocess.CompletedProcess[str]:
    a = reg.access
    return release(reg, "publish", "--tag", tag, "--index-url", a.index_url, "--builder", "local",
                   "--platforms", "linux/amd64", "--registry", registry or a.registry, "--namespace", namespace,
                   "--ca-file", str(a.ca_file), "--helm", str(reg.cluster.bin_dir / "helm"),
                   "--twine", str(reg.tools.twine), *extra, **env)


def pushed(reg: Any, namespace: str) -> list[str]:
    a = reg.access
    ep = Endpoint(a.registry, a.credentials.username, a.credentials.password, a.ca_file)
    return [r for r in Registry(ep).catalog() if r.startswith(f"{namespace}/")]


@pytest.mark.parametrize("case", ["version mismatch", "registry down", "wrong registry password",
                                  "wrong index password"])
def test_a_release_that_cannot_go_through_fails_before_pushing_anything(registry: Any, case: str) -> None:
    from localcluster.procs import free_port

    ns = f"t{uuid.uuid4().hex[:8]}"
    if case == "version mismatch":
        out, said = publish(registry, ns, tag="v0.1.1"), ["versions disagree", "(expected 0.1.1)"]
    elif case == "registry down":
        out = publish(registry, ns, registry=f"127.0.0.1:{free_port()}")
        said = ["registry login", "connection refused", "nothing was pushed"]
    elif case == "wrong registry password":
        out = publish(registry, ns, REGISTRY_PASSWORD="wrong")
        said = ["registry login", "invalid username/password", "check REGISTRY_USERNAME / REGISTRY_PASSWORD"]
    else:
        out = publish(registry, ns, INDEX_PASSWORD="wrong")
        said = ["the package index at", "refused the credentials (403)", "INDEX_USERNAME / INDEX_PASSWORD"]
    assert out.returncode == 2, out.stderr
    for s in said:
        assert s in out.stderr, out.stderr
    assert pushed(registry, ns) == []


def test_a_version_whose_wheel_the_index_has_is_refused_before_any_push(registry: Any, tmp_path: Path) -> None:
    """An index never replaces a file: pypiserver refuses a second upload (400, as PyPI's "File already exists");
    the release finds the wheel in its checks and pushes nothing."""
    a = registry.access
    build_wheels([REPO / "operator"], tmp_path, timeout=120)
    wheel = next(tmp_path.glob("reprieve_operator-*.whl"))
    env = {**os.environ, "TWINE_USERNAME": a.credentials.username, "TWINE_PASSWORD": a.credentials.password,
           "REQUESTS_CA_BUNDLE": str(a.ca_file)}  # requests prefers it over twine's --cert
    twine = [str(registry.tools.twine), "upload", "--non-interactive", "--disable-progress-bar", "--repository-url",
             a.index_url, "--cert", str(a.ca_file), str(wheel)]
    first = subprocess.run(twine, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert first.returncode == 0 or "400 Bad Request" in first.stdout, first.stdout + first.stderr
    again = subprocess.run(twine, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert again.returncode != 0 and "HTTPError: 400 Bad Request" in again.stdout, again.stdout + again.stderr
    ns = f"t{uuid.uuid4().hex[:8]}"
    out = publish(registry, ns)
    assert out.returncode == 2, out.stderr
    assert f"has {wheel.name} already" in out.stderr and "bump the version" in out.stderr, out.stderr
    assert pushed(registry, ns) == []


def test_a_partial_push_is_not_installed(registry: Any, tmp_path: Path) -> None:
    """A publish that stopped after the chart (no release record): install refuses it and says why."""
    a = registry.access
    ns = f"t{uuid.uuid4().hex[:8]}"
    helm = str(registry.cluster.bin_dir / "helm")
    pkg = subprocess.run([helm, "package", str(REPO / "charts" / "reprieve"), "-d", str(tmp_path)], check=True,
                         capture_output=True, text=True).stdout.strip().rsplit(": ", 1)[-1]
    subprocess.run([helm, "push", pkg, f"oci://{a.registry}/{ns}/charts", "--ca-file", str(a.ca_file),
                    "--username", a.credentials.username, "--password", a.credentials.password],
                   check=True, capture_output=True, text=True, timeout=60)
    assert pushed(registry, ns) == [f"{ns}/charts/reprieve"]
    out = release(registry, "install", "--version", "0.1.0", "--registry", a.registry, "--namespace", ns,
                  "--ca-file", str(a.ca_file), "--helm-release", "never", "--kubeconfig",
                  str(registry.cluster.kubeconfig))
    assert out.returncode == 1, out.stderr
    assert f"no release record {a.registry}/{ns}/reprieve-release:0.1.0" in out.stderr, out.stderr
    assert "Nothing was installed" in out.stderr
    assert registry.cluster.helm("list", "-A", "-q").stdout.split().count("never") == 0


# -- the chart's GPG signature (publish --sign-key/--keyring, install --verify-keyring) ------------------------------
@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.conftest import gpg_keys

    return gpg_keys(tmp_path_factory.mktemp("keys"), "release", "other")


@pytest.mark.parametrize("case", ["no keyring file", "key not in the keyring", "a public keyring"])
def test_a_key_that_cannot_sign_fails_before_pushing_anything(registry: Any, keys: dict[str, Path],
                                                              case: str) -> None:
    ns = f"t{uuid.uuid4().hex[:8]}"
    key, keyring, said = {
        "no keyring file": ("Reprieve release", str(keys["release.sec"]) + ".missing", "no such file"),
        "key not in the keyring": ("Nobody", str(keys["release.sec"]), "private key not found"),
        "a public keyring": ("Reprieve release", str(keys["release.pub"]), "holds public keys only"),
    }[case]
    out = publish(registry, ns, "--sign-key", key, "--keyring", keyring)
    assert out.returncode == 2, out.stderr
    assert said in out.stderr and "nothing was pushed" in out.stderr, out.stderr
    assert pushed(registry, ns) == []


def publish_chart(reg: Any, namespace: str, tmp: Path, sign_with: Path | None) -> str:
    """hack/release.py publish's own chart step (Publisher: the signing check, helm package [--sign], helm push)
    and its release record, without the images and wheels (the record names made-up digests): the version."""
    import release
    import releaseplan as plan

    a = reg.access
    ep = Endpoint(a.registry, a.credentials.username, a.credentials.password, a.ca_file)
    args = argparse.Namespace(helm=str(reg.cluster.bin_dir / "helm"), namespace=namespace, revision="test",
                              sign_key="Reprieve release" if sign_with else "", keyring=str(sign_with or ""))
    tmp.mkdir()
    p = release.Publisher(args, ep, ep, tmp)
    p.version = release.release_version.versions()["pyproject.toml"]
    p.signer = p._check_signing()
    digest = "sha256:" + "1" * 64
    rec = plan.record(p.version, registry=a.registry, namespace=namespace, images={"operator": digest,
                      "example": digest}, chart_digest=p.push_chart(digest),
                      wheels=dict.fromkeys(plan.wheel_files(p.version).values(), "ab"), index_url=a.index_url,
                      signer=p.signer)
    p.oci.push_record(namespace, p.version, rec)
    return str(p.version)


def test_a_signed_chart_installs_only_under_its_key(registry: Any, keys: dict[str, Path], tmp_path: Path) -> None:
    """Signed by the release key: verified (install --verify-keyring without --helm-release pulls and verifies
    the chart, the same code path as before helm install); under another key's keyring or unsigned: refused with
    helm's message and what to do, and nothing is installed."""
    a = registry.access
    signed, unsigned = f"t{uuid.uuid4().hex[:8]}", f"t{uuid.uuid4().hex[:8]}"
    version = publish_chart(registry, signed, tmp_path / "signed", keys["release.sec"])
    publish_chart(registry, unsigned, tmp_path / "unsigned", None)

    def install(ns: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return release(registry, "install", "--version", version, "--registry", a.registry, "--namespace", ns,
                       "--ca-file", str(a.ca_file), "--helm", str(registry.cluster.bin_dir / "helm"), *extra)

    ok = install(signed, "--verify-keyring", str(keys["release.pub"]))
    assert ok.returncode == 0, ok.stderr
    assert "verified: signed by Reprieve release test" in ok.stderr, ok.stderr
    unverified = install(signed)
    assert unverified.returncode == 0 and "WARNING: the chart is signed (key " in unverified.stderr, unverified.stderr
    into_cluster = ("--helm-release", "never-signed", "--kubeconfig", str(registry.cluster.kubeconfig))
    for ns, keyring, said in [(signed, keys["other.pub"], ["signature made by unknown entity", "not in"]),
                              (unsigned, keys["release.pub"], ["failed to fetch provenance", "published unsigned"])]:
        out = install(ns, "--verify-keyring", str(keyring), *into_cluster)
        assert out.returncode == 1, out.stderr
        for s in [*said, "Nothing was installed"]:
            assert s in out.stderr, out.stderr
    assert registry.cluster.helm("list", "-A", "-q").stdout.split().count("never-signed") == 0
