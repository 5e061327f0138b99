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


@pytest.mark.parametrize(("environ", "test"), [
    (b"PATH=/bin\0PYTEST_CURRENT_TEST=tests/e2e/test_x.py::test_a (call)\0HOME=/root\0", "tests/e2e/test_x.py::test_a"),
    (b"PYTEST_CURRENT_TEST=tests/e2e/test_x.py::test_a (setup)\0", "tests/e2e/test_x.py::test_a (setup)"),
    (b"PATH=/bin\0HOME=/root\0", None),
    (b"", None),
])
def test_a_process_is_charged_to_the_test_in_its_environment(environ: bytes, test: str | None) -> None:
    assert _module().test_of(environ) == test


def test_a_process_without_a_test_in_its_environment_is_charged_to_its_parents() -> None:
    """A live sample of a real /proc: this test's child inherits PYTEST_CURRENT_TEST (pytest sets it in
    ``os.environ``; a process's own /proc environment is the one it was started with), the grandchild it starts
    has it removed and is charged to the child's test."""
    import os
    import subprocess
    import sys

    m = _module()
    here = os.environ["PYTEST_CURRENT_TEST"].removesuffix(" (call)")
    child = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys, time\n"
        "env = {k: v for k, v in os.environ.items() if k != 'PYTEST_CURRENT_TEST'}\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], env=env)\n"
        "print(g.pid, flush=True)\n"
        "time.sleep(30)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        s = m.Sampler()
        s.sample()
        os.kill(grandchild, 9)
    finally:
        child.kill()
        child.wait()
    charged = {k[0]: t for k, t in s.tests.items()}
    assert charged.get(child.pid) == here
    assert charged.get(grandchild) == here, "the grandchild was not charged to its parent's test"
