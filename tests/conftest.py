"""Shared fixtures: one local Kubernetes cluster per test session, a fresh namespace per test.

The cluster (real etcd, kube-apiserver, controller-manager, scheduler; process kubelets as nodes) starts
lazily, the first time a test asks for ``cluster``; unit tests never pay for it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

DEFAULT_NODES = ("worker-0", "worker-1")


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
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    if os.environ.get("REPRIEVE_KEEP_NAMESPACES") != "1":
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def api(cluster: Cluster):  # noqa: F821
    client = cluster.api_client()
    yield client
    client.close()
