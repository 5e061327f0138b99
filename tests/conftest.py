"""Shared fixtures: one local Kubernetes cluster per test session, a fresh namespace per test.

The cluster (real etcd, kube-apiserver, controller-manager, scheduler; process kubelets as nodes) starts
lazily, the first time a test asks for ``cluster``; unit tests never pay for it.

``real_cluster`` is a second cluster whose nodes are real (upstream kubelet, containerd, runc; images built with
hack/build-images.sh), for the tests marked ``realnodes``. Where that tier cannot be set up, its tests are skipped
with the reason and the summary ends with a ``REAL-NODE TIER: NOT RUN`` block saying what is missing; with
``REPRIEVE_REQUIRE_REAL_NODES=1`` (CI) they fail instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DEFAULT_NODES = ("worker-0", "worker-1")
REAL_WORKERS = 3
_real_tier: dict[str, str] = {}  # "not_run": why; "ran": node names


def _real_tier_unavailable(err: Exception) -> None:
    _real_tier["not_run"] = str(err)
    message = f"REAL-NODE TIER NOT RUN: {err}"
    if os.environ.get("REPRIEVE_REQUIRE_REAL_NODES") == "1":
        pytest.fail(message + " (REPRIEVE_REQUIRE_REAL_NODES=1)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:  # noqa: F821
    """A cluster of real nodes: ``real-sys-0`` (pool ``system``: the operator, and a steady job) and
    ``REAL_WORKERS`` worker nodes in pool ``realw`` (kept topped up by ``real_workers``)."""
    from localcluster import Cluster, ClusterError
    from localcluster.realnodes import RealNodeError, prerequisites
    from localcluster.stack import SYSTEM_POOL

    if "not_run" in _real_tier:
        _real_tier_unavailable(RealNodeError(_real_tier["not_run"]))
    if prerequisites():
        _real_tier_unavailable(RealNodeError("; ".join(prerequisites())))
    workdir = tmp_path_factory.mktemp("realcluster")
    try:
        c = Cluster.start(workdir)
    except ClusterError as err:
        _real_tier_unavailable(err)
    try:
        try:
            c.real.ensure()
            c.add_node("real-sys-0", {"reprieve.test/pool": SYSTEM_POOL}, kind="real")
        except (RealNodeError, ClusterError) as err:
            _real_tier_unavailable(err)
        _real_tier["ran"] = "yes"
        yield c
    finally:
        c.stop()


@pytest.fixture
def real_workers(real_cluster: Cluster) -> list[str]:  # noqa: F821
    """The worker pool's live real nodes (``REAL_WORKERS`` of them, untainted): nodes lost by an earlier test are
    replaced by new ones first."""
    from localcluster.stack import WORKER_POOL
    from localcluster.testing import untaint_node

    names = [n for n in real_cluster.node_names() if n.startswith("real-w")]
    i = 0
    while len(names) < REAL_WORKERS:
        name = f"real-w{i}"
        i += 1
        if name in real_cluster.node_names():
            continue
        real_cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=true")
        # every built image, as on real-sys-0: the same image set is the same node template (hard-linked in
        # seconds), where a set of its own re-imported the example image (~150 s) whenever the images changed
        real_cluster.add_node(name, {"reprieve.test/pool": WORKER_POOL}, kind="real")
        names.append(name)
    api = real_cluster.api_client()
    try:
        for name in names:
            for key in ("cloud.google.com/impending-node-termination",):
                untaint_node(api, name, key)
    finally:
        api.close()
    return sorted(names)


_dashboard_tier: dict[str, str] = {}  # "not_run": why


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """Prometheus for the dashboard test (``make test`` installs Debian's package: hack/install-prometheus.sh).
    Missing: the test is skipped and the summary says DASHBOARD TIER: NOT RUN (REPRIEVE_REQUIRE_PROMETHEUS=1:
    it fails instead)."""
    import shutil

    path = shutil.which("prometheus")
    if path is None:
        _dashboard_tier["not_run"] = ("no `prometheus` on PATH (hack/install-prometheus.sh installs Debian's "
                                      "package as root; see its log under ~/.cache/reprieve)")
        message = f"DASHBOARD TIER NOT RUN: {_dashboard_tier['not_run']}"
        if os.environ.get("REPRIEVE_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(message + " (REPRIEVE_REQUIRE_PROMETHEUS=1)", pytrace=False)
        pytest.skip(message)
    return path


NOT_RUN_TIERS = {"REAL-NODE TIER NOT RUN": "REAL-NODE TIER", "DASHBOARD TIER NOT RUN": "DASHBOARD TIER"}
HOW_TO = {"REAL-NODE TIER": "Its tests (marker 'realnodes') were skipped. On Debian 12 as root `make test` installs "
                            "what the tier needs; see docs/local-cluster.md, section 'Real nodes'."}
_not_run: dict[str, str] = {}  # tier -> why, gathered from the reports (so it works under pytest-xdist too)


def pytest_configure(config: pytest.Config) -> None:
    from tests.budget import BudgetPlugin

    if not hasattr(config, "workerinput"):  # the xdist controller (or a plain run) reports; workers only run
        config.pluginmanager.register(BudgetPlugin(config), "reprieve-budget")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from tests.budget import check_tiers, why_long

    check_tiers(items)
    for item in items:
        item.user_properties.append(("why_long", why_long(item)))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the real-node modules as one group: one real-node cluster per run (its network
    namespace, a containerd per node, the images), on one worker. (pytest 9 no longer lets pytest-xdist suffix a
    nodeid with its ``xdist_group`` mark, so the group is made here, from the test's module.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    from tests.budget import scope_of

    class RealNodesTogether(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid) or super()._split_scope(nodeid)

    return RealNodesTogether(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not (report.skipped or report.failed) or not report.longrepr:
        return
    # a skip's longrepr is (path, line, "Skipped: <message>"); a failure's renders to text
    text = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    for marker, tier in NOT_RUN_TIERS.items():
        if marker + ": " in text:
            _not_run.setdefault(tier, text.split(marker + ": ", 1)[1].splitlines()[0])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for tier, why in _not_run.items():
        terminalreporter.section(f"{tier}: NOT RUN", sep="!", red=True, bold=True)
        terminalreporter.line(why)
        if tier in HOW_TO:
            terminalreporter.line(HOW_TO[tier])


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:  # noqa: F821
    from localcluster import Cluster

    workdir = tmp_path_factory.mktemp("cluster")
    with Cluster.start(workdir) as c:
        for name in DEFAULT_NODES:
            c.add_node(name)
        yield c


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:  # noqa: F821
    """A fresh namespace with its ``default`` ServiceAccount (a pod created before the controller-manager made it is
    refused: "serviceaccount default not found"). It takes well under a second; the 90 s is for a loaded run
    (an apiserver restart once left the controller-manager's informers in client-go's back-off for a minute:
    Cluster.restart_apiserver now restarts the controllers, see Cluster._restart_controllers)."""
    from localcluster.testing import wait_for

    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    wait_for(lambda: cluster.read("sa", "default", name, missing_ok=True) is not None, 90,
             f"the controller-manager to create ServiceAccount default in {name}")
    yield name
    if os.environ.get("REPRIEVE_KEEP_NAMESPACES") != "1":
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def api(cluster: Cluster):  # noqa: F821
    client = cluster.api_client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def kueue(cluster: Cluster) -> Iterator[Any]:  # noqa: F821
    """Real Kueue (built once by hack/build-kueue.sh, cached by version) against the session cluster, with its
    CRDs and webhooks; started the first time a test asks for it (docs/kueue.md, "Kueue in the local cluster")."""
    from localcluster.kueue import start_kueue

    kq = start_kueue(cluster)
    yield kq
    kq.stop()


def gpg_keys(out: Path, *who: str) -> dict[str, Path]:
    """Throwaway GPG keys (ed25519, no passphrase) in a GNUPGHOME of their own under ``out``, exported as helm reads
    them: ``<who>.sec`` a legacy secret keyring (gpg --export-secret-keys), ``<who>.pub`` a public one (gpg
    --export); user id ``Reprieve <who> test <<who>@reprieve.invalid>``. Skips without gpg."""
    if not shutil.which("gpg"):
        pytest.skip("RELEASE TOOLS NOT INSTALLED: gpg (hack/install-release-tools.sh installs gnupg)")
    home = out / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    files = {}
    for name in who:
        uid = f"Reprieve {name} test <{name}@reprieve.invalid>"
        subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never"],
                       env=env, check=True, capture_output=True, timeout=60)
        for kind, flag in (("sec", "--export-secret-keys"), ("pub", "--export")):
            files[f"{name}.{kind}"] = out / f"{name}.{kind}"
            files[f"{name}.{kind}"].write_bytes(subprocess.run(["gpg", "--batch", flag, uid], env=env, check=True,
                                                               capture_output=True, timeout=60).stdout)
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False, capture_output=True, timeout=30)
    return files
