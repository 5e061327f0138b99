"""Real image pulls on real nodes: the example image pushed to the cluster's own registry (TLS, basic auth), so that
nodes started cold (``add_node(..., kind="real", images=[])``) pull it when their first pod lands; and the pulls
the kubelets then report (``Pulled`` events, read by :mod:`localcluster.pulls`). Shared by ``hack/demo.py
--real-pulls`` and ``benchmarks/goodput.py --real-nodes --real-pulls``."""

from __future__ import annotations

import json

from localcluster.cluster import Cluster
from localcluster.pulls import Pull, pulls


def push_example(cluster: Cluster, repo: str, tag: str, flag: str = "--real-pulls") -> str:
    """Start the cluster's registry and push the built example image to ``<registry>/<repo>:<tag>``; return the
    reference by digest that pods name. Call it before adding the cold nodes (they are set up to trust and log in
    to the registry when they start). Exits naming ``flag`` where there is no registry to pull from."""
    from localcluster.registry import RegistryError

    try:
        cluster.start_registry()
        assert cluster.registry is not None
        return cluster.registry.push_image(cluster.real.images["example"].ref, repo, tag)
    except RegistryError as err:
        raise SystemExit(f"{flag}: no registry to pull from: {err}") from None


def describe(ref: str, nodes: str = "cold nodes") -> str:
    """The run's pull mode in words, for its log and results ("" ref: the images were imported, no pull)."""
    return (f"real image pulls: {nodes} pull {ref} from the cluster's registry" if ref
            else "no image pull: the images are imported into every node's containerd beforehand")


def node_pulls(cluster: Cluster, namespace: str, ref: str) -> list[tuple[str, Pull]]:
    """(node, pull) for every kubelet pull of ``ref`` in ``namespace`` (its ``Pulled`` events), oldest first."""
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    out = []
    for ev in sorted(events, key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or ""):
        if ev.get("reason") == "Pulled":
            p = pulls([ev]).get(ref)
            if p is not None:
                out.append((ev.get("source", {}).get("host") or ev["involvedObject"].get("name", "?"), p))
    return out


def pull_line(node: str, pull: Pull) -> str:
    size = f"{pull.size_bytes / 1e6:.0f} MB" if pull.size_bytes else "size not reported"
    return f"real pull on {node}: {pull.seconds:.1f}s ({size})"
