"""``python -m localcluster``: build the tools, run a local cluster, or show it running a pod.

    python -m localcluster tools                 # build/cache localkube + helm, print the bin dir
    python -m localcluster up --nodes 3          # start and keep running until Ctrl-C; prints KUBECONFIG
    python -m localcluster up --real-nodes 2     # ... with real nodes (upstream kubelet, containerd, runc)
    python -m localcluster up --registry         # ... and a registry + package index they pull from
    python -m localcluster smoke                 # start, run one pod as a process, show it finish, stop
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from .cluster import Cluster, ClusterError, ensure_tools
from .realnodes import RealNodeError
from .registry import RegistryError


def _up(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    with Cluster.start(Path(args.dir) if args.dir else None) as cluster:
        if args.registry:
            access = cluster.start_registry()
            print(f"registry {access.registry} and package index {access.index_url} (TLS from "
                  f"{access.ca_file}; user and password in {cluster.workdir / 'registry' / 'access.json'})")
        for i in range(args.nodes):
            cluster.add_node(f"node-{i}")
        for i in range(args.real_nodes):
            cluster.add_node(f"real-{i}", kind="real")
        print(f"local cluster ready in {time.monotonic() - t0:.1f}s with {args.nodes} process node(s) and "
              f"{args.real_nodes} real node(s)")
        print(f"export KUBECONFIG={cluster.kubeconfig} PATH={cluster.bin_dir}:$PATH")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    return 0


SMOKE_POD = """
apiVersion: v1
kind: Pod
metadata: {name: hello}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: python:3.11  # ignored by the process kubelet: it runs the command on the host
    command: ["python3", "-c"]
    args: ["import os, time; print('hello from', os.environ['POD_NAME'], 'on', os.environ['NODE']); time.sleep(2)"]
    env:
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
"""


def _smoke(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    with Cluster.start() as cluster:
        print(f"[{time.monotonic() - t0:5.1f}s] control plane up at {cluster.server}")
        cluster.add_node("node-0")
        print(f"[{time.monotonic() - t0:5.1f}s] node-0 Ready (a process kubelet)")
        cluster.kubectl("apply", "-f", "-", input=SMOKE_POD)
        print(f"[{time.monotonic() - t0:5.1f}s] pod/hello applied")
        last = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            phase = cluster.kubectl("get", "pod", "hello", "-o", "jsonpath={.status.phase}").stdout
            if phase != last:
                print(f"[{time.monotonic() - t0:5.1f}s] pod/hello phase: {phase or 'Pending'}")
                last = phase
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(0.2)
        print(cluster.kubectl("get", "pods", "-o", "wide").stdout)
        logs = sorted(cluster.workdir.glob("nodes/node-0/**/main.log"))
        if logs:
            print("pod output:", logs[0].read_text().strip())
        return 0 if last == "Succeeded" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("tools")
    up = sub.add_parser("up")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--real-nodes", type=int, default=0)
    up.add_argument("--dir", default=None)
    up.add_argument("--registry", action="store_true",
                    help="also an OCI registry and a package index on loopback (TLS, basic auth); real nodes pull "
                         "from the registry")
    sub.add_parser("smoke")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        if args.cmd == "tools":
            print(ensure_tools())
            return 0
        if args.cmd == "up":
            return _up(args)
        return _smoke(args)
    except (ClusterError, RealNodeError, RegistryError) as err:
        print(f"localcluster: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
