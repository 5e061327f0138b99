"""The release path end to end on this machine, with the script the release workflow runs (hack/release.py):
publish to the local cluster's registry and package index (TLS from the cluster's CA, basic auth), then install
only from them — the chart by ``helm install oci://…@digest`` onto a cold real node whose kubelet pulls the
operator image by digest, both distributions by ``pip install`` into fresh venvs, and the example TrainingJob
pulling the example image. Nothing comes from outside this machine: the index serves the dependencies (jax,
tensorstore, kopf, ...) from the release tools' wheelhouse (``make release-tier``), and ``install`` checks that pip
took every distribution from it. A job whose image tag the registry does not have says so (condition PodsReady,
the registry's "not found"). The chart is signed with a throwaway GPG key (``publish --sign-key``) and installed
with ``--verify-keyring`` (``helm install --verify``). The test prints the kubelet's cold pull time and size of each image (the numbers in
benchmarks/RESULTS.md, beside the 20 s that benchmarks/goodput.py emulates). Bad input to the release is
tests/test_release_integration.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import e2e_job, wait_tj

pytestmark = [pytest.mark.e2e, pytest.mark.realnodes, pytest.mark.timeout(1500)]
REPO = Path(__file__).resolve().parents[2]
POOL = {"reprieve.test/pool": "release"}


def cold_pulls(cluster: Any, *namespaces: str) -> dict[str, Any]:
    """Image reference -> its pull (seconds, bytes), from the kubelet's Pulled events in ``namespaces``."""
    from localcluster.pulls import pulls

    events = [ev for ns in namespaces
              for ev in json.loads(cluster.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]]
    return pulls(events)


def test_a_release_published_here_installs_and_runs_only_from_the_registry_and_the_index(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Why this long: the images are pushed (1.3 GB, gzip on 2 cores: about 40 s), a cold node pulls and unpacks
    both (about a minute), and pip installs jax and kopf into two fresh venvs; the images themselves come from the
    content-keyed cache of hack/build-images.sh, the dependencies from the wheelhouse of ``make release-tier``."""
    from localcluster import Cluster
    from localcluster.realnodes import RealNodeError, prerequisites
    from localcluster.registry import RegistryError
    from localcluster.stack import OPERATOR_SELECTOR, RELEASE_NS, RESTRICTED

    from tests.conftest import _real_tier_unavailable, gpg_keys

    if prerequisites():
        _real_tier_unavailable(RealNodeError("; ".join(prerequisites())))
    tmp_path = tmp_path_factory.mktemp("rel")  # short: containerd's socket paths must stay under 104 characters
    with Cluster.start(tmp_path / "cluster") as c:
        try:
            c.real.ensure()
            access = c.start_registry()
        except (RealNodeError, RegistryError) as err:
            _real_tier_unavailable(err)
        reg = c.registry
        assert reg is not None
        if reg.tools.wheelhouse is None:
            pytest.skip("RELEASE TOOLS NOT INSTALLED: no wheelhouse of the locks' distributions for the local index "
                        "to serve (run `make release-tier` once; it downloads them from PyPI)")
        env = {**os.environ, "REGISTRY_USERNAME": access.credentials.username,
               "REGISTRY_PASSWORD": access.credentials.password, "INDEX_USERNAME": access.credentials.username,
               "INDEX_PASSWORD": access.credentials.password}
        keys = gpg_keys(tmp_path_factory.mktemp("keys"), "release")
        where = ["--registry", access.registry, "--namespace", "reprieve-dev", "--ca-file", str(access.ca_file)]
        t0 = time.monotonic()
        pub = subprocess.run([sys.executable, str(REPO / "hack/release.py"), "publish", "--tag", "v0.1.0",
                              "--index-url", access.index_url, "--builder", "local", "--platforms", "linux/amd64",
                              "--helm", str(c.bin_dir / "helm"), "--twine", str(reg.tools.twine), *where,
                              "--sign-key", "Reprieve release test", "--keyring", str(keys["release.sec"])],
                             capture_output=True, text=True, env=env, timeout=900, check=False)
        publish_s = time.monotonic() - t0
        assert pub.returncode == 0, pub.stderr
        assert "version 0.1.0 is released" in pub.stderr
        assert "signed by Reprieve release test" in pub.stderr, pub.stderr

        c.add_node("rel-0", POOL, kind="real", images=[])  # cold: only the pause image, the rest is pulled
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE_NS, "labels": RESTRICTED}}))
        t1 = time.monotonic()
        ins = subprocess.run([sys.executable, str(REPO / "hack/release.py"), "install", "--version", "0.1.0",
                              "--index-url", access.index_url,
                              "--helm-release", "reprieve", "--helm-namespace", RELEASE_NS, "--kubeconfig",
                              str(c.kubeconfig), "--helm", str(c.bin_dir / "helm"),
                              "--set", "nodeSelector.reprieve\\.test/pool=release", "--set", "replicaCount=1",
                              "--venv", f"{tmp_path / 'op'}=operator", "--venv", f"{tmp_path / 'rt'}=runtime",
                              "--record-out", str(tmp_path / "record.json"), *where,
                              "--verify-keyring", str(keys["release.pub"]),
                              # pip's byte-compiling of jax, kubernetes, ... is 3/4 of the installs' CPU and proves
                              # nothing about where they came from (the imports below compile what they use)
                              "--no-compile"],
                             capture_output=True, text=True, env=env, timeout=900, check=False)
        assert ins.returncode == 0, ins.stderr
        assert "verified: signed by Reprieve release test" in ins.stderr, ins.stderr
        rec = json.loads((tmp_path / "record.json").read_text())
        c.kubectl("wait", "--for=condition=Available", "deploy", "-l", OPERATOR_SELECTOR, "-n", RELEASE_NS,
                  "--timeout=600s", timeout=620)
        install_s = time.monotonic() - t1
        pod = json.loads(c.kubectl("get", "pods", "-n", RELEASE_NS, "-l", OPERATOR_SELECTOR, "-o", "json").stdout)
        [op] = pod["items"]
        assert op["spec"]["nodeName"] == "rel-0"
        assert op["spec"]["containers"][0]["image"] == rec["images"]["operator"]  # by digest, as rendered
        assert op["status"]["containerStatuses"][0]["imageID"].endswith(rec["images"]["operator"].split("@")[1])
        # the distributions installed from the index work
        subprocess.run([str(tmp_path / "op/bin/python"), "-c", "import reprieve_operator"], check=True, timeout=60)
        subprocess.run([str(tmp_path / "rt/bin/python"), "-c", "import reprieve, jax, tensorstore"], check=True,
                       timeout=120)

        # the example TrainingJob pulls the example image from the registry (by digest) on the cold node
        t2 = time.monotonic()
        body = e2e_job(c, "rel", replicas=1, steps=2, step_sleep=0, interval=0, checkpoint_dir=tmp_path / "ckpt",
                       node_selector=POOL, image=rec["images"]["example"],
                       requests={"cpu": "250m", "memory": "1Gi"})
        c.kubectl("create", "namespace", "rel")
        c.kubectl("apply", "-n", "rel", "-f", "-", input=json.dumps(body))
        wait_tj(c, "rel", "rel", lambda s: s.get("phase") == "Succeeded", 600, "the released example job to succeed")
        job_s = time.monotonic() - t2

        # a tag the registry does not have: the job says so (PodsReady, the kubelet's reason, the registry's words)
        missing = rec["images"]["example"].split("@")[0] + ":0.0.0-missing"
        bad = e2e_job(c, "nope", replicas=1, steps=1, step_sleep=0, interval=0, checkpoint_dir=tmp_path / "nope",
                      node_selector=POOL, image=missing, requests={"cpu": "250m", "memory": "1Gi"})
        c.kubectl("apply", "-n", "rel", "-f", "-", input=json.dumps(bad))
        said = wait_tj(c, "rel", "nope", lambda s: any(
            x.get("type") == "PodsReady" and x.get("status") == "False" for x in s.get("conditions") or []), 120,
            "PodsReady=False for a tag the registry does not have")["status"]
        [cond] = [x for x in said["conditions"] if x["type"] == "PodsReady"]
        assert said["phase"] == "Pending" and cond["reason"] == "ImagePullBackOff", said
        assert f'"{missing}"' in cond["message"] and "not found" in cond["message"], cond
        assert "x509" not in cond["message"], cond  # the registry's answer, not a fallback host's TLS error
        c.kubectl("delete", "tj", "nope", "-n", "rel", "--wait=false")
        pulls = cold_pulls(c, RELEASE_NS, "rel")
        assert set(pulls) == {rec["images"]["operator"], rec["images"]["example"]}, pulls
        assert all(p.size_bytes and not p.emulated for p in pulls.values()), pulls
        report = {"publish_s": round(publish_s, 1), "install_s": round(install_s, 1), "example_job_s": round(job_s, 1),
                  "cold_pull": {ref.split("/")[-1].split("@")[0]: {"s": round(p.seconds, 1), "bytes": p.size_bytes}
                                for ref, p in pulls.items()},
                  "emulated_pull_s": 20.0}
        print("release path:", json.dumps(report))
        (c.workdir.parent / "release-timings.json").write_text(json.dumps(report, indent=1))
