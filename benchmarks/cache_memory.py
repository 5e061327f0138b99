"""The operator's pod cache alone: how much memory N worker pods take once cached (no API server, no operator).

Each pod is the operator's own worker pod (``build_worker_pod``) as the API server returns it (status of a running
container, managed fields, the runtime's notice-watch annotation), serialised once and decoded per pod and per
update as the watch decodes it, then cached (``Cache.upsert_pod``: the compact pod and the node/job indices).
Prints the process's RSS before and after, and per pod.

    python benchmarks/cache_memory.py [--pods 50000 --replicas 20 --updates 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "hack"), str(REPO / "tests" / "operator")]


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pods", type=int, default=50000)
    ap.add_argument("--replicas", type=int, default=20)
    ap.add_argument("--updates", type=int, default=3, help="watch events per pod (each a freshly decoded body)")
    args = ap.parse_args()

    from conftest import job_manifest
    from reprieve_operator.cache import Cache
    from reprieve_operator.models import TrainingJob
    from reprieve_operator.policy.builders import build_worker_pod

    m = job_manifest("j0000", "bench", replicas=args.replicas)
    m["metadata"].update(uid="u" * 36, creationTimestamp="2026-01-01T00:00:00Z")
    pod = build_worker_pod(TrainingJob.from_body(m), 0, 1)
    fields = {"f:metadata": {"f:labels": {f"f:{k}": {} for k in pod["metadata"]["labels"]}}}
    pod["metadata"].update(namespace="bench", uid="x" * 36, resourceVersion="123456",
                           creationTimestamp="2026-01-01T00:00:00Z",
                           managedFields=[{"manager": "python", "operation": "Update", "apiVersion": "v1",
                                           "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                                           "fieldsV1": fields}] * 3)
    pod["metadata"].setdefault("annotations", {})["reprieve.dev/notice-watch"] = "j0000-notice"
    pod["status"] = {
        "phase": "Running", "podIP": "10.0.0.1", "hostIP": "10.0.0.2", "startTime": "2026-01-01T00:00:00Z",
        "qosClass": "BestEffort",
        "conditions": [{"type": t, "status": "True", "lastProbeTime": None,
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}
                       for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
        "containerStatuses": [{"name": "trainer", "ready": True, "restartCount": 0, "image": "x", "imageID": "y",
                               "containerID": "containerd://abc", "started": True,
                               "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
    raw = json.dumps(pod)
    gc.collect()
    before = rss_mb()
    cache = Cache()
    for i in range(args.pods):
        k, j = divmod(i, args.replicas)
        body = raw.replace("j0000", f"j{k:05d}")
        for _ in range(args.updates):
            p = json.loads(body)
            p["metadata"]["name"] = f"j{k:05d}-{j}"
            p["metadata"]["uid"] = f"{i:036d}"
            p["metadata"]["labels"]["reprieve.dev/replica-index"] = str(j)
            p["spec"]["nodeName"] = f"n{i % 5000:04d}"
            cache.upsert_pod(p)
    del p
    gc.collect()
    after = rss_mb()
    print(f"{args.pods} pods ({len(raw)} B bodies, {args.updates} updates each): RSS {before:.0f} -> {after:.0f} MB, "
          f"{(after - before) * 2**20 / args.pods:.0f} B a pod in the cache")

    # the jobs (one per ``replicas`` pods), with the status a running job's goodput accounting gives it
    m["status"] = {
        "phase": "Running", "attempt": 1, "ready": f"{args.replicas}/{args.replicas}",
        "startTime": "2026-01-01T00:00:00Z",
        "conditions": [{"type": t, "status": "True", "reason": "Ready", "message": "m" * 80,
                        "lastTransitionTime": "2026-01-01T00:00:00Z"} for t in ("Ready", "PodsReady")],
        "goodput": {"goodput": 0.9, "wallSeconds": 100.0, "productiveSeconds": 90.0, "lostSteps": 0,
                    "accounting": {"closed": {"productive": 0.0, "startup": 0.0}, "lostSteps": 0, "history": [],
                                   "open": [{"attempt": 1, "created": 1.0, "report": {
                                       "step": 500, "time": 1.0, "firstStep": 0, "firstStepTime": 1.0,
                                       "stepSeconds": 0.1, "restoreSeconds": 0.0, "saveBlockingSeconds": 0.0}}]}}}
    job_raw = json.dumps(m)
    jobs = args.pods // args.replicas
    for k in range(jobs):
        for _ in range(args.updates):
            cache.upsert_job(json.loads(job_raw.replace("j0000", f"j{k:05d}")))
    gc.collect()
    last = rss_mb()
    print(f"{jobs} jobs ({len(job_raw)} B bodies, {args.updates} updates each): RSS {after:.0f} -> {last:.0f} MB, "
          f"{(last - after) * 2**20 / jobs:.0f} B a job in the cache")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
