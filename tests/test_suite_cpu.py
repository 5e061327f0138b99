"""benchmarks/suite_cpu.py: each process of a test run sorted into its kind by its command line (/proc's
NUL-separated form), and its sampler's totals counting only the CPU spent after it started."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.benchmark_module import load_benchmark

pytestmark = pytest.mark.unit


def _module() -> ModuleType:
    return load_benchmark("suite_cpu")


@pytest.mark.parametrize(("cmdline", "kind"), [
    ("/root/.cache/reprieve/bin/x/localkube\0kube-apiserver\0--etcd-servers=http://127.0.0.1:1\0", "kube-apiserver"),
    ("/root/.cache/reprieve/bin/x/localkube\0etcd\0--name=local\0", "etcd"),
    ("/usr/local/bin/kubelet\0--config=/tmp/k.yaml\0", "kubelet (real node)"),
    ("/usr/bin/containerd-shim-runc-v2\0-namespace\0k8s.io\0", "containerd"),
    ("/work/.venv/bin/python\0-m\0localcluster.kubelet\0--node\0n-0\0", "process kubelet"),
    ("/work/.venv/bin/python\0-m\0reprieve_operator\0--namespace\0x\0", "operator"),
    ("/usr/bin/python3\0/app/examples/train_lm.py\0", "trainer (JAX)"),
    ("/work/.venv/bin/python\0-c\0import sys;exec(eval(sys.stdin.readline()))\0", "pytest"),
    ("/tmp/v/bin/python\0-m\0pip\0install\0jax\0", "pip / venv"),
    ("podman\0push\0x\0", "image tools"),
    ("/bin/bash\0-c\0true\0", "other"),
])
def test_each_process_gets_its_kind_from_its_command_line(cmdline: str, kind: str) -> None:
    assert _module().kind_of(cmdline) == kind


def test_the_totals_count_only_what_was_spent_after_the_start() -> None:
    m = _module()
    s = m.Sampler()
    s.base = {(1, 10): 5.0}
    s.last = {(1, 10): ("etcd", 7.5), (2, 20): ("etcd", 1.0), (3, 30): ("operator", 2.0)}
    assert s.totals() == {"etcd": 3.5, "operator": 2.0}
