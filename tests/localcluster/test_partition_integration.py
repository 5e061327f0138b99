"""The soak's ``partition`` fault on a real network namespace (issue #25): ``injectors.cut_netns``/``heal_netns``.

The test makes two network namespaces joined by a veth pair (a pod's and its node's, as the CNI bridge joins
them), a listener in the "pod", and cuts the pod's namespace off by a process in it, as the soak does with a pod's
sandbox: a connection from the node is then unanswered (dropped, not refused), the pod still reaches itself on
loopback and keeps its interface and address; healed, the node connects again, and no rule of ours is left. The
soak's Ctrl-C (``Injectors.stop``) heals a partition still in force.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
from localcluster.injectors import PARTITION_CHAIN, Injectors, cut_netns, heal_netns

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(c) for c in ("ip", "nsenter", "iptables-restore")),
                       reason="needs root, ip, nsenter and iptables-restore (network namespaces, netfilter rules)"),
]

LISTEN = """
import socket, sys
s = socket.create_server(("0.0.0.0", 7000))
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hi")
    c.close()
"""

CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2])) as c:
        print(c.recv(2).decode())
except OSError as err:
    print(type(err).__name__)
"""


class Netns:
    """A named network namespace (``ip netns``), removed by :meth:`delete`."""

    def __init__(self, name: str) -> None:
        self.name = name
        subprocess.run(["ip", "netns", "add", name], check=True)
        self.run("ip", "link", "set", "lo", "up")

    def run(self, *cmd: str, timeout: float = 30) -> str:
        return subprocess.run(["ip", "netns", "exec", self.name, *cmd], check=True, capture_output=True, text=True,
                              timeout=timeout).stdout

    def connect(self, address: str, timeout: float = 1.0) -> str:
        """What a TCP connection to ``address``:7000 from here got: "hi", or the error's name."""
        return self.run("python3", "-c", CONNECT, address, str(timeout)).strip()

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], check=False, capture_output=True)


@pytest.fixture
def pod_and_node() -> Iterator[tuple[Netns, Netns, subprocess.Popen[str]]]:
    tag = f"rpvpart{os.getpid()}"
    pod, node = Netns(f"{tag}-pod"), Netns(f"{tag}-node")
    listener: subprocess.Popen[str] | None = None
    try:
        subprocess.run(["ip", "link", "add", f"{tag}a", "netns", pod.name, "type", "veth", "peer", "name",
                        f"{tag}b", "netns", node.name], check=True)
        pod.run("ip", "addr", "add", "10.77.0.2/24", "dev", f"{tag}a")
        pod.run("ip", "link", "set", f"{tag}a", "up")
        node.run("ip", "addr", "add", "10.77.0.1/24", "dev", f"{tag}b")
        node.run("ip", "link", "set", f"{tag}b", "up")
        listener = subprocess.Popen(["ip", "netns", "exec", pod.name, "python3", "-c", LISTEN], stdout=subprocess.PIPE,
                                    text=True)
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        yield pod, node, listener
    finally:
        if listener is not None:
            listener.kill()
            listener.wait()
        pod.delete()
        node.delete()


def test_a_cut_pod_namespace_drops_traffic_keeps_loopback_and_interfaces_and_heals(
        pod_and_node: tuple[Netns, Netns, subprocess.Popen[str]]) -> None:
    pod, node, listener = pod_and_node
    assert node.connect("10.77.0.2") == "hi"
    fd = cut_netns(listener.pid, not_those_of=[os.getpid()])
    try:
        assert node.connect("10.77.0.2") == "TimeoutError"  # dropped: no refusal, no reset, nothing
        assert pod.connect("127.0.0.1") == "hi"               # loopback is left alone
        assert "10.77.0.2/24" in pod.run("ip", "addr", "show")  # its interface and address are kept
        assert PARTITION_CHAIN in pod.run("iptables", "-S")
    finally:
        heal_netns(fd)
        os.close(fd)
    assert node.connect("10.77.0.2", timeout=5.0) == "hi"
    assert PARTITION_CHAIN not in pod.run("iptables", "-S")


def test_the_namespace_of_the_node_or_host_is_never_cut(
        pod_and_node: tuple[Netns, Netns, subprocess.Popen[str]]) -> None:
    pod, _node, listener = pod_and_node
    with pytest.raises(RuntimeError, match="shares the network namespace"):
        cut_netns(os.getpid(), not_those_of=[listener.pid, os.getpid()])
    with pytest.raises(RuntimeError, match="shares the network namespace"):
        cut_netns(listener.pid, not_those_of=[listener.pid])
    assert PARTITION_CHAIN not in pod.run("iptables", "-S")
    assert PARTITION_CHAIN not in subprocess.run(["iptables", "-S"], check=True, capture_output=True,
                                                  text=True).stdout


def test_stop_heals_a_partition_still_in_force(pod_and_node: tuple[Netns, Netns, subprocess.Popen[str]]) -> None:
    pod, node, listener = pod_and_node
    inj = Injectors(None, None, "soak", "soak", pool_labels={}, node_kind="real", rng=random.Random(1),
                    attempt=lambda: 1)
    before = time.time()
    what = inj.cut(100.0, "soak-1", listener.pid, 600.0, not_those_of=[os.getpid()])
    assert what == "soak-1 cut off for 600.0s" and inj.partitioned == {"soak-1"}
    assert node.connect("10.77.0.2") == "TimeoutError"
    assert inj.stop() == ["partition healed: soak-1 cut off for 600.0s ended early"]  # Ctrl-C, long before 600 s
    assert node.connect("10.77.0.2", timeout=5.0) == "hi"
    assert PARTITION_CHAIN not in pod.run("iptables", "-S")
    assert inj.partitioned == set() and inj.partitions == {}
    assert inj.partition_until[100.0] < before + 600.0  # when it ended, for the record: at the stop
