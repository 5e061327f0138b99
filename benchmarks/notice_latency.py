"""Notice latency at scale: node taint -> every pod of each affected job hears the notice.

Against the local control plane (real kube-apiserver/etcd/controllers, no kubelets): 1,000 Node objects,
500 TrainingJobs x 20 pods = 10,000 pods as plain API objects (bound with nodeName, never run). The operator
runs as a local process with the chart's ServiceAccount token. Job k's pod j sits on node (20k + j) % 1000,
so each node hosts 10 pods of 10 different jobs, and tainting node 20t (t = 0..49) hits 10 fresh jobs.

Two delivery paths (docs/notices.md, "One write per job"), both in the same run with ``--path both``: the pods of
the jobs that even trials hit say they watch their job's notice object (``reprieve.dev/notice-watch``, what the runtime writes once
its watch listed; emulated: no runtime runs), so even trials measure one write per job; the other jobs' pods do not,
so odd trials measure the per-pod annotation (the fallback, and the path before the object existed). "Every pod
hears it" is watch-observed: for the object path, the watch event of ``j<k>-notice`` on one namespace-wide ConfigMap
watch of this process (each pod's runtime watches that one object by name, served from the API server's watch
cache: the same event); for the annotation path, the last of the job's 20 pods' watch events.

Reported per path: p50/p99/max over the jobs of (time every pod hears it) - (time the taint was written), API writes
per notice (objects and pods whose notice changed, watch-observed) and Events per notice; the operator's RSS (with
goodput accounting on: every job's pod 0 carries a live progress report and every job's status.goodput is kept) and
CPU; and the same latency for the peer "the benchmark patches the 20 pods itself right after the taint" (the API
floor for delivering to one job by patching its pods), as a ratio. Targets: object p99 <= 0.5x the peer's,
writes per notice <= affected jobs + a constant, RSS < 300 MB.

Nodes tainted at once, each beside its own peer (every pod of the hit jobs patched by hand from one start): ``--wave
0.1`` (a tenth of the nodes, instead of the trials: every job hit on two nodes) and ``--per-job`` (after the trials,
every job no trial hit, each on one node: one notice per job at once; figures prefixed ``per_job_``). The background
load (``--load``) is raw HTTP/1.1 keep-alive PATCHes from other processes; achieved and asked are both reported.

    python benchmarks/notice_latency.py [--nodes 1000 --jobs 500 --replicas 20 --trials 50] [--per-job | --wave 0.1]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "hack"), str(REPO / "tests" / "operator")]

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

NS = "bench"
TAINT = "cloud.google.com/impending-node-termination"
TOLERATE = [{"key": k, "operator": "Exists", "effect": "NoExecute"}
            for k in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def retried(call: Any, tries: int = 5) -> Any:
    """``call()``, asked again (after 1 s) when the loaded API server times it out or sheds it (5xx): as any client
    would; a bulk peer or floor of tens of thousands of writes met a 504 once and ended the run."""
    for attempt in range(tries):
        try:
            return call()
        except ApiException as err:
            if err.status is None or err.status < 500 or attempt == tries - 1:
                raise
            time.sleep(1.0)
    return None


def parallel(fn: Any, items: list[Any], workers: int = 16) -> None:
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(fn, items):
            pass


def rss_mb(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


class RssStages:
    """The operator's RSS sampled every 0.25 s, its peak per stage of the run (``stage``: the one now), so a run
    says where the peak came (priming and the first reconcile of every job, the goodput reports, the notices)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.stage, self.peaks = pid, "start-up", {"start-up": 0.0}
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.done.wait(0.25):
            if not self._sample():
                return

    def _sample(self) -> bool:
        try:
            rss = rss_mb(self.pid)[0]
        except (OSError, KeyError):  # the process has ended
            return False
        self.peaks[self.stage] = max(self.peaks.get(self.stage, 0.0), rss)
        return True

    def next(self, stage: str) -> None:
        self.stage = stage
        self._sample()  # a stage shorter than the period is there too

    def line(self) -> str:
        return ", ".join(f"{stage} {peak:.0f}" for stage, peak in self.peaks.items())


def pod_notice(obj: dict[str, Any]) -> str | None:
    return (obj["metadata"].get("annotations") or {}).get("reprieve.dev/notice")


def object_notice(obj: dict[str, Any]) -> str | None:
    return (obj.get("data") or {}).get("notice") if obj["metadata"]["name"].endswith("-notice") else None


class Notices:
    """Watch the namespace's pods (``pod_notice``) or ConfigMaps (``object_notice``), as a pod's runtime would
    (watch events from the API server's watch cache); record when each object first shows a notice, and count the
    writes that changed one (API writes per notice). Events are decoded as plain JSON (a client model per event could
    not keep up with a burst's tens of thousands: the API server then ended the watch); a watch the API server ends
    is resumed from the last event (bookmarks keep that recent), and one whose place expired (410) is listed again:
    a notice first seen in such a listing is counted in ``relisted`` (its time is the listing's, later than the
    event's), and a run that needed one says so."""

    def __init__(self, list_fn: Any, notice: Any) -> None:
        self.list_fn, self.notice = list_fn, notice
        self.seen: dict[str, float] = {}
        self.values: dict[str, str] = {}
        self.writes = 0
        self.relists = 0  # listings after a 410
        self.relisted = 0  # notices first seen in one
        self.cond = threading.Condition()
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _see(self, obj: dict[str, Any], listed: bool = False) -> None:
        value = self.notice(obj)
        if value:
            with self.cond:
                name = obj["metadata"]["name"]
                if name not in self.seen:
                    self.seen[name] = time.monotonic()
                    self.relisted += listed
                if self.values.get(name) != value:
                    self.values[name] = value
                    self.writes += 1
                self.cond.notify_all()

    def _list(self) -> str:
        token, rv = None, ""
        while True:
            page = self.list_fn(NS, limit=500, _continue=token, _preload_content=False)
            body = json.loads(page.data)
            for obj in body.get("items") or []:
                self._see(obj, listed=True)
            rv, token = body["metadata"]["resourceVersion"], body["metadata"].get("continue")
            if not token:
                return rv

    def _run(self) -> None:
        rv = self.list_fn(NS, limit=1).metadata.resource_version
        while not self.stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.list_fn, NS, resource_version=rv, timeout_seconds=60, deserialize=False,
                                   allow_watch_bookmarks=True):
                    obj = ev["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] != "BOOKMARK":
                        self._see(obj)
            except ApiException as err:
                if self.stop.is_set():
                    return
                if err.status != 410:
                    raise
                self.relists += 1
                rv = self._list()
            except (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError):
                if self.stop.is_set():  # the cluster going away at the end is not an error
                    return
            except Exception:
                if not self.stop.is_set():
                    raise

    def wait(self, names: list[str], timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(n in self.seen for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [n for n in names if n not in self.seen]
                    raise TimeoutError(f"{len(missing)} object(s) never got the notice, e.g. {missing[:3]}")
                self.cond.wait(left)
            return {n: self.seen[n] for n in names}


LOAD = r"""
import http.client, json, ssl, sys, threading, time
from urllib.parse import urlsplit
# The cheapest client this machine has: raw HTTP/1.1 keep-alive connections, one per thread, the response read and
# dropped (the kubernetes client's request validation and response models were most of a load process's CPU).
cfg = json.load(open(sys.argv[1]))
rate, ns, proc = float(sys.argv[2]), sys.argv[3], sys.argv[4]
cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
tls.load_cert_chain(user["client-certificate"], user["client-key"])
server = urlsplit(cluster["server"])
def connection():
    return http.client.HTTPSConnection(server.hostname, server.port, context=tls, timeout=30)
def call(conn, method, path, body, content_type):
    conn.request(method, path, body=json.dumps(body), headers={"Content-Type": content_type,
                                                               "Accept": "application/json"})
    resp = conn.getresponse()
    resp.read()
    return resp.status
names = [f"bench-load-{proc}-{i}" for i in range(64)]
setup = connection()
for n in names:
    status = call(setup, "POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": n}, "data": {"i": "0"}},
                  "application/json")
    assert status in (201, 409), f"creating ConfigMap {ns}/{n}: HTTP {status}"
sent, failed, lock, t0 = [0], [0], threading.Lock(), time.monotonic()
def writer():
    conn = connection()
    while True:
        with lock:  # paced: the n-th write is due at t0 + n / rate
            n = sent[0]
            sent[0] += 1
        delay = t0 + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            if call(conn, "PATCH", f"/api/v1/namespaces/{ns}/configmaps/{names[n % len(names)]}",
                    {"data": {"i": str(n)}}, "application/merge-patch+json") != 200:
                failed[0] += 1
        except (OSError, http.client.HTTPException):  # a dropped connection: a new one
            failed[0] += 1
            conn.close()
            conn = connection()
for _ in range(64):  # writes in flight: a write waits ~0.1 s on a loaded API server, 16 connections made ~230/s
    threading.Thread(target=writer, daemon=True).start()
while True:
    time.sleep(10)
    print(f"load {proc}: {sent[0] / (time.monotonic() - t0):.0f} writes/s due, {failed[0]} failed", flush=True)
"""
LOAD_PER_PROCESS = 250.0  # writes/s one load process is asked for (raw keep-alive HTTP; the client's was 125)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_writes(core: client.CoreV1Api) -> int:
    """The background load's writes so far: per load process, the highest write number its ConfigMaps carry (+1)."""
    top: dict[str, int] = {}
    for c in core.list_namespaced_config_map(NS).items:
        if c.metadata.name.startswith("bench-load-"):
            proc = c.metadata.name.rsplit("-", 1)[0]
            top[proc] = max(top.get(proc, 0), int((c.data or {}).get("i", 0)) + 1)
    return sum(top.values())


def event_count(core: client.CoreV1Api) -> int:
    """The namespace's Events, listed in pages of raw JSON (tens of thousands after a wave: one LIST decoded into
    client models timed out under load); a page the loaded API server times out (5xx) is asked again."""
    count, token = 0, None
    while True:
        for attempt in range(5):
            try:
                page = json.loads(core.list_namespaced_event(NS, limit=500, _continue=token,
                                                             _preload_content=False).data)
                break
            except ApiException as err:
                if err.status is None or err.status < 500 or attempt == 4:
                    raise
                time.sleep(1.0)
        count += len(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return count


def wait_statuses(custom: Any, op: subprocess.Popen[bytes], field: str, jobs: int, limit_s: float, what: str) -> None:
    """Until every one of the ``jobs`` TrainingJobs has ``status.<field>``; fails after ``limit_s`` or when the
    operator ``op`` has ended (``what``: how the count is named in that error)."""
    t0 = time.monotonic()
    while True:
        items = custom.list_namespaced_custom_object("reprieve.dev", "v1alpha1", NS, "trainingjobs")["items"]
        done = sum(1 for i in items if (i.get("status") or {}).get(field))
        if done == jobs:
            return
        if op.poll() is not None or time.monotonic() - t0 > limit_s:
            raise RuntimeError(f"after {time.monotonic() - t0:.0f}s: {done}/{jobs} {what}")
        time.sleep(1)


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the cluster is stopped on `timeout`
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--replicas", type=int, default=20)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--load", type=float, default=0.0,
                    help="background writes/s from other clients (processes of at most 250 writes/s each, raw HTTP/1.1 "
                         "keep-alive connections, each patching 64 ConfigMaps of its own) during the trials and "
                         "the peer")
    ap.add_argument("--path", choices=("both", "object", "annotation"), default="both",
                    help="which jobs' pods say they watch their job's notice object (the runtime's "
                         "reprieve.dev/notice-watch): both = the jobs of even trials (one write per job) and "
                         "not those of odd trials (the per-pod annotation, the fallback)")
    ap.add_argument("--wave", type=float, default=0.0,
                    help="instead of the one-node trials: taint this fraction of the nodes at once, spread evenly "
                         "(0.1: every tenth node, so every job is hit on two of its nodes), and time each hit job "
                         "from the first taint to every pod hearing it")
    ap.add_argument("--per-job", action="store_true",
                    help="after the trials: one notice per job, every job not yet hit at once (the trials' nodes "
                         "no trial struck, tainted together: each job hit on one node), beside its own peer "
                         "(every pod of those jobs patched by hand from one start)")
    args = ap.parse_args()
    if args.wave and args.per_job:
        ap.error("--wave and --per-job: one scenario of nodes tainted at once per run")
    if args.nodes % args.replicas or args.jobs * args.replicas % args.nodes:
        ap.error("need nodes % replicas == 0 and jobs*replicas % nodes == 0")

    def watching(k: int) -> bool:  # trial t hits the jobs k = t (mod nodes / replicas): even t, the object path
        return args.path == "object" or (args.path == "both" and k % (args.nodes // args.replicas) % 2 == 0)

    from conftest import job_manifest
    from localcluster import Cluster
    from localcluster.stack import OPERATOR_SA, RELEASE_NS, bench_namespace

    work = Path(tempfile.mkdtemp(prefix="reprieve-bench-"))
    with Cluster.start(work / "cluster") as cluster:
        t0 = time.monotonic()
        api = bench_namespace(cluster, NS, pool=32)  # the operator runs here as a local process
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)

        parallel(lambda i: core.create_node({"metadata": {"name": f"n{i:04d}", "labels": {"bench": "1"}}}),
                 list(range(args.nodes)))
        uids: dict[int, str] = {}

        def make_job(k: int) -> None:
            m = job_manifest(f"j{k:03d}", NS, replicas=args.replicas)
            m["spec"]["template"]["spec"]["tolerations"] = TOLERATE
            m["spec"]["template"]["spec"]["serviceAccountName"] = "default"  # no per-job identity objects
            uids[k] = custom.create_namespaced_custom_object("reprieve.dev", "v1alpha1", NS, "trainingjobs",
                                                             m)["metadata"]["uid"]

        parallel(make_job, list(range(args.jobs)))

        # The operator's own builder makes the pods, exactly as it would; we only bind them to nodes.
        from reprieve_operator.models import TrainingJob
        from reprieve_operator.policy.builders import build_worker_pod

        def make_pods(k: int) -> None:
            body = custom.get_namespaced_custom_object("reprieve.dev", "v1alpha1", NS, "trainingjobs", f"j{k:03d}")
            job = TrainingJob.from_body(body)
            for j in range(args.replicas):
                pod = build_worker_pod(job, j, 1)
                pod["spec"]["nodeName"] = f"n{(args.replicas * k + j) % args.nodes:04d}"
                if watching(k):  # what the pod's runtime says once its watch of the job's object listed
                    pod["metadata"].setdefault("annotations", {})["reprieve.dev/notice-watch"] = f"j{k:03d}-notice"
                core.create_namespaced_pod(NS, pod)
            custom.patch_namespaced_custom_object_status(
                "reprieve.dev", "v1alpha1", NS, "trainingjobs", f"j{k:03d}",
                {"status": {"phase": "Pending", "attempt": 1, "startTime": "2026-01-01T00:00:00Z"}})

        parallel(make_pods, list(range(args.jobs)))
        print(f"created {args.nodes} nodes, {args.jobs} jobs, {args.jobs * args.replicas} pods "
              f"in {time.monotonic() - t0:.0f}s")

        kubeconfig = cluster.token_kubeconfig(RELEASE_NS, OPERATOR_SA)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["KUBECONFIG"] = str(kubeconfig)
        log = open(work / "operator.log", "wb")  # noqa: SIM115
        op = subprocess.Popen([sys.executable, "-m", "reprieve_operator", "--namespace", NS, "--metrics-port", "0"], stdout=log, stderr=subprocess.STDOUT, env=env)
        stages = RssStages(op.pid)
        achieved = achieved_notices = None
        load: list[subprocess.Popen[bytes]] = []
        try:
            t1 = time.monotonic()  # ready: every job reconciled once (status.ready written)
            wait_statuses(custom, op, "ready", args.jobs, 900, f"jobs reconciled; see {log.name}")
            stages.next("goodput")
            print(f"operator reconciled all jobs in {time.monotonic() - t1:.0f}s; RSS {rss_mb(op.pid)[0]:.0f} MB")
            # Goodput accounting on for every job: process 0's live progress report (docs/contract.md) on each
            # job's pod 0, as a running job has it; wait until every status carries status.goodput.
            t2 = time.monotonic()
            now = time.time()

            def report(k: int) -> None:
                value = {"attempt": 1, "step": 500, "committedStep": -1, "time": "2026-01-01T00:00:00Z",
                         "stepAt": now, "stepSeconds": 0.1, "firstStep": 0, "firstStepAt": now - 50.0,
                         "restoreSeconds": 0.0, "saveBlockingSeconds": 0.0}
                core.patch_namespaced_pod(f"j{k:03d}-0", NS, {"metadata": {"annotations": {
                    "reprieve.dev/progress": json.dumps(value)}}})

            parallel(report, list(range(args.jobs)))
            wait_statuses(custom, op, "goodput", args.jobs, 600, f"jobs with goodput accounting; see {log.name}")
            print(f"goodput accounting on for all {args.jobs} jobs in {time.monotonic() - t2:.0f}s; "
                  f"RSS {rss_mb(op.pid)[0]:.0f} MB")
            stages.next("notices")
            procs = math.ceil(args.load / LOAD_PER_PROCESS)
            for proc in range(procs):  # each its share of the rate
                load.append(subprocess.Popen(
                    [sys.executable, "-c", LOAD, str(cluster.kubeconfig), str(args.load / procs), NS, str(proc)],
                    stdout=open(work / f"load-{proc}.log", "wb"), stderr=subprocess.STDOUT))  # noqa: SIM115
            time.sleep(3)
            on_pods = Notices(core.list_namespaced_pod, pod_notice)
            on_objects = Notices(core.list_namespaced_config_map, object_notice)
            time.sleep(1)
            # per path: latency per job (every pod hears it), writes per notice (objects and pods written, Events)
            per_job: dict[str, list[float]] = {"object": [], "annotation": []}
            writes: dict[str, list[int]] = {"object": [], "annotation": []}
            events: dict[str, list[int]] = {"object": [], "annotation": []}
            cpu0, t_load, load_w0 = cpu_seconds(op.pid), time.monotonic(), load_writes(core)
            wave = wave_nodes(args.nodes, args.wave) if args.wave else []

            def strike(nodes: list[int], what: str) -> Scenario:
                """Taint ``nodes`` at once (32 threads); each hit job timed from the first taint to every pod
                hearing it, per path; the writes and Events of the whole."""
                got_s = Scenario()
                struck = set(nodes)
                got_s.hit = sorted({k for k in range(args.jobs) for j in range(args.replicas)
                                    if (args.replicas * k + j) % args.nodes in struck})
                o0, p0, e0 = on_objects.writes, on_pods.writes, event_count(core)
                start = time.monotonic()
                parallel(lambda n: core.patch_node(f"n{n:04d}", {"spec": {"taints": [
                    {"key": TAINT, "value": "true", "effect": "NoSchedule"}]}}), nodes, workers=32)
                tainted = time.monotonic() - start
                by_path = {p: [k for k in got_s.hit if (p == "object") == watching(k)] for p in ("object", "annotation")}
                limit = 120 + 0.02 * len(by_path["annotation"]) * args.replicas  # the fallback writes every pod
                if by_path["object"]:
                    got = on_objects.wait([f"j{k:03d}-notice" for k in by_path["object"]], limit)
                    got_s.per_job["object"] += [got[f"j{k:03d}-notice"] - start for k in by_path["object"]]
                if by_path["annotation"]:
                    got = on_pods.wait([f"j{k:03d}-{j}" for k in by_path["annotation"] for j in range(args.replicas)],
                                       limit)
                    got_s.per_job["annotation"] += [max(got[f"j{k:03d}-{j}"] for j in range(args.replicas)) - start
                                                    for k in by_path["annotation"]]
                time.sleep(2.0)  # the writes and Events that follow
                # writes per path: the objects written (one write per job) and the pods annotated (the fallback)
                got_s.writes["object"].append(on_objects.writes - o0)
                got_s.writes["annotation"].append(on_pods.writes - p0)
                got_s.events["object"].append(event_count(core) - e0)
                print(f"{what}: {len(nodes)} nodes tainted in {tainted:.2f} s, {len(got_s.hit)} jobs hit "
                      f"({len(by_path['object'])} watching their object): {on_objects.writes - o0} objects and "
                      f"{on_pods.writes - p0} pods written, {event_count(core) - e0} Events")
                return got_s

            if wave:
                burst = strike(wave, "wave")
                per_job, writes, events = burst.per_job, burst.writes, burst.events
            for t in range(0 if wave else args.trials):
                node = (args.replicas * t) % args.nodes
                jobs = sorted({(node + args.nodes * m) // args.replicas
                               for m in range(args.jobs * args.replicas // args.nodes)})
                path = "object" if watching(jobs[0]) else "annotation"
                assert all(watching(k) == watching(jobs[0]) for k in jobs), "a node's jobs all on one path"
                names = {k: [f"j{k:03d}-{j}" for j in range(args.replicas)] for k in jobs}
                w0, e0 = on_pods.writes + on_objects.writes, event_count(core)
                start = time.monotonic()
                core.patch_node(f"n{node:04d}", {"spec": {"taints": [{"key": TAINT, "value": "true",
                                                                      "effect": "NoSchedule"}]}})
                if path == "object":  # every pod of job k hears it with the watch event of j<k>-notice
                    got = on_objects.wait([f"j{k:03d}-notice" for k in jobs], 30)
                    per_job[path] += [got[f"j{k:03d}-notice"] - start for k in jobs]
                else:
                    got = on_pods.wait([n for ns in names.values() for n in ns], 30)
                    per_job[path] += [max(got[n] for n in names[k]) - start for k in jobs]
                time.sleep(1.0)  # the writes and Events that follow the notice (the pods' Events, the job's)
                writes[path].append(on_pods.writes + on_objects.writes - w0)
                events[path].append(event_count(core) - e0)
            cpu = cpu_seconds(op.pid) - cpu0
            if load:  # during the trials (or the wave) alone
                achieved_notices = (load_writes(core) - load_w0) / (time.monotonic() - t_load)
            each = None
            if args.per_job:
                stages.next("one notice per job")
                each = strike(per_job_nodes(args.nodes, args.replicas, args.trials), "one notice per job")
                each.cpu = cpu_seconds(op.pid) - cpu0 - cpu
            rss, peak = rss_mb(op.pid)
            stages.done.set()
            on_pods.stop.set()
            on_objects.stop.set()

            # Peer: the same deliveries done by hand, straight after a taint: patch every pod of the jobs on
            # one node (32 threads, job by job, like the operator's pool), time per job from the taint.
            peer: list[float] = []

            def peer_at_once(hit: list[int]) -> list[float]:
                """Every pod of the ``hit`` jobs patched by hand (32 threads) from one start, timed per job."""
                start, finished_w = time.monotonic(), {}

                def patch_w(kj: tuple[int, int]) -> None:
                    retried(lambda: core.patch_namespaced_pod(f"j{kj[0]:03d}-{kj[1]}", NS, {"metadata": {
                        "annotations": {"bench/peer": "at-once"}}}))
                    finished_w[kj[0]] = max(finished_w.get(kj[0], 0.0), time.monotonic())

                parallel(patch_w, [(k, j) for k in hit for j in range(args.replicas)], workers=32)
                return [finished_w[k] - start for k in hit]

            def floor_at_once(hit: list[int], tag: str) -> list[float]:
                """The API server's floor for a burst's object path: one ConfigMap created per job of ``hit`` (as the
                operator's first write of a job's object) by hand, 32 threads from one start, timed per job."""
                start, done = time.monotonic(), {}

                def create(k: int) -> None:
                    def once() -> None:
                        try:
                            core.create_namespaced_config_map(NS, {"metadata": {"name": f"floor-{tag}-j{k:03d}"},
                                                                   "data": {"notice": "{}"}})
                        except ApiException as err:
                            if err.status != 409:  # a retried create whose first try had been done
                                raise

                    retried(once)
                    done[k] = time.monotonic()

                parallel(create, hit, workers=32)
                return [done[k] - start for k in hit]

            # The floors first (one create a job), then the one-node peers, the bursts' peers last: at 50,000 pods a
            # burst's peer (tens of thousands of patches from 32 threads) has taken this VM's API server past its
            # memory, so the operator's figures are printed before it, and a peer that fails leaves them standing.
            floors: dict[str, list[float]] = {}
            if wave:
                floors[""] = floor_at_once([k for k in burst.hit if watching(k)], "wave")
            if each is not None:
                floors["per_job_"] = floor_at_once([k for k in each.hit if watching(k)], "each")
            for t in range(0 if wave else min(5, args.trials)):
                node = (args.replicas * t) % args.nodes
                jobs = sorted({(node + args.nodes * m) // args.replicas
                               for m in range(args.jobs * args.replicas // args.nodes)})
                start = time.monotonic()
                core.patch_node(f"n{node:04d}", {"metadata": {"labels": {"bench-peer": str(t)}}})
                finished: dict[int, float] = {}

                def patch(kj: tuple[int, int], t: int = t, finished: dict[int, float] = finished) -> None:
                    k, j = kj
                    retried(lambda: core.patch_namespaced_pod(f"j{k:03d}-{j}", NS, {"metadata": {"annotations": {
                        "bench/peer": str(t)}}}))
                    finished[k] = max(finished.get(k, 0.0), time.monotonic())

                parallel(patch, [(k, j) for k in jobs for j in range(args.replicas)], workers=32)
                peer += [finished[k] - start for k in jobs]
            each_peer: list[float] = []
            peer_failed: str | None = None
            if wave or each is not None:
                print("before the bursts' peer:")
                summarize(figures(per_job, writes, events, peer, each, [], floors, args), wave, rss, peak, cpu,
                          args.trials, stages.line())
                try:
                    if wave:  # the wave's peer: every pod of every hit job patched by hand, from one start
                        peer += peer_at_once(burst.hit)
                    if each is not None:
                        each_peer = peer_at_once(each.hit)
                except Exception as err:  # noqa: BLE001 - the operator's figures above stand; said, and exit 1
                    peer_failed = f"{type(err).__name__}: {str(err)[:300]}"
                    print(f"the bursts' peer failed ({peer_failed}): its figures are missing below")
            if load:
                achieved = (load_writes(core) - load_w0) / (time.monotonic() - t_load)
                for proc in load:
                    proc.terminate()
                print(f"background load: {achieved:.0f} writes/s achieved over the run, {achieved_notices:.0f} during "
                      f"the {'wave' if wave else 'trials'} (asked {args.load:.0f}/s, {len(load)} processes)")
        finally:
            for proc in [op, *load]:  # the load too when the run failed (they outlived the cluster once)
                proc.terminate()
            op.wait(30)
            log.close()
        report = figures(per_job, writes, events, peer, each, each_peer, floors, args)
        report.update(operator_rss_mb=round(rss, 1), operator_peak_rss_mb=round(peak, 1),
                      operator_peak_rss_mb_by_stage={k: round(v, 1) for k, v in stages.peaks.items()},
                      operator_cpu_s_per_notice=round(cpu / args.trials, 4),
                      load_writes_per_s_asked=args.load, load_writes_per_s_achieved=achieved and round(achieved),
                      load_writes_per_s_achieved_notices=achieved_notices and round(achieved_notices),
                      observer_relists=on_pods.relists + on_objects.relists,
                      observer_notices_first_seen_in_a_relist=on_pods.relisted + on_objects.relisted)
        print(json.dumps(report, indent=1))
        if report["observer_relists"]:
            print(f"note: the watch that times the notices expired {report['observer_relists']} time(s) and was "
                  f"listed again; {report['observer_notices_first_seen_in_a_relist']} notice(s) were first seen in "
                  f"such a listing (their times are the listing's, later than the API server's event)")
        summarize(report, wave, rss, peak, cpu, args.trials, stages.line())
        if peer_failed:
            print(f"the bursts' peer failed: {peer_failed}")
            return 1
    return 0


def figures(per_job: dict[str, list[float]], writes: dict[str, list[int]], events: dict[str, list[int]],
            peer: list[float], each: Scenario | None, each_peer: list[float], floors: dict[str, list[float]],
            args: argparse.Namespace) -> dict[str, Any]:
    """The latency figures of a run (the trials' or the wave's, one notice per job's, the floors)."""
    report = notice_report(per_job, writes, events, peer, args.jobs * args.replicas // args.nodes)
    if each is not None:  # one notice per job: its own figures, its own peer, beside the trials'
        report.update({f"per_job_{k}": v for k, v in notice_report(
            each.per_job, each.writes, each.events, each_peer, 1).items() if k != "jobs_per_notice"})
        report.update(per_job_jobs_hit=len(each.hit), per_job_operator_cpu_s=round(each.cpu, 1))
    for prefix, xs in floors.items():
        report.update({f"{prefix}object_floor_p50_s": round(pct(xs, 0.5), 4),
                       f"{prefix}object_floor_p99_s": round(pct(xs, 0.99), 4)})
    return report


def summarize(report: dict[str, Any], wave: list[int], rss: float, peak: float, cpu: float, trials: int,
              stages: str) -> None:
    """A line per scenario and path (with the peer's ratio where the peer ran), the floors', the operator's."""
    for scenario, prefix in (("one node" if not wave else "wave", ""), ("one notice per job", "per_job_")):
        peer_p50, peer_p99 = report.get(f"{prefix}peer_direct_patch_p50_s"), report.get(f"{prefix}peer_direct_patch_p99_s")
        for path in ("object", "annotation"):
            if f"{prefix}{path}_p50_s" in report:
                p50, p99 = report[f"{prefix}{path}_p50_s"], report[f"{prefix}{path}_p99_s"]
                ratio = (f"{p50 / peer_p50:.2f}x / {p99 / peer_p99:.2f}x the peer's p50/p99"
                         if peer_p50 and peer_p99 else "the peer not run")
                print(f"{scenario}, {path}: taint -> every pod of a job hears the notice: p50 {p50 * 1000:.0f} ms, "
                      f"p99 {p99 * 1000:.0f} ms, max {report[f'{prefix}{path}_max_s'] * 1000:.0f} ms; {ratio}; "
                      f"{report[f'{prefix}{path}_writes_per_notice']} writes and "
                      f"{report[f'{prefix}{path}_events_per_notice']} Events per notice "
                      f"({report.get('jobs_per_notice') if not prefix else report[f'{prefix}{path}_jobs_measured']}"
                      f" jobs)")
        if f"{prefix}object_floor_p99_s" in report and f"{prefix}object_p50_s" in report:
            fp50, fp99 = report[f"{prefix}object_floor_p50_s"], report[f"{prefix}object_floor_p99_s"]
            print(f"{scenario}, the API server's floor for the object path (one ConfigMap a job created by hand, 32 "
                  f"threads, one start): p50 {fp50 * 1000:.0f} ms, p99 {fp99 * 1000:.0f} ms; the object path "
                  f"{report[f'{prefix}object_p50_s'] / fp50:.2f}x / {report[f'{prefix}object_p99_s'] / fp99:.2f}x it")
    print(f"operator RSS {rss:.0f} MB, peak {peak:.0f} MB (target < 300 MB: {'PASS' if peak < 300 else 'FAIL'}); "
          f"CPU {cpu:.1f} s over {trials} notices; peak RSS by stage (MB): {stages}")


class Scenario:
    """Nodes tainted at once: the jobs hit, and per path the jobs' latencies, the writes and the Events."""

    def __init__(self) -> None:
        self.hit: list[int] = []
        self.per_job: dict[str, list[float]] = {"object": [], "annotation": []}
        self.writes: dict[str, list[int]] = {"object": [], "annotation": []}
        self.events: dict[str, list[int]] = {"object": [], "annotation": []}
        self.cpu = 0.0  # the operator's CPU seconds over it


def per_job_nodes(nodes: int, replicas: int, trials: int) -> list[int]:
    """The one-node trials' nodes no trial struck (20t, t >= trials): tainted at once, each hits its 10 jobs and no
    job twice, so with the trials every job of the run has had one notice of its own."""
    return [replicas * t for t in range(trials, nodes // replicas)]


def wave_nodes(nodes: int, fraction: float) -> list[int]:
    """``fraction`` of the nodes, spread evenly and clear of the one-node trials' nodes (multiples of 20)."""
    step = max(1, round(1 / fraction))
    return [n for n in range(step // 2, nodes, step)]


def notice_report(per_job: dict[str, list[float]], writes: dict[str, list[int]], events: dict[str, list[int]],
                  peer: list[float], jobs_per_notice: int) -> dict[str, Any]:
    """The figures of a run: per path (``object``: one write per job; ``annotation``: one per pod) p50/p99/max of
    taint -> every pod of a job hears it, the writes (objects and pods whose notice changed) and Events per notice;
    the direct-patch peer's p50/p99."""
    out: dict[str, Any] = {"jobs_measured": sum(len(v) for v in per_job.values()), "jobs_per_notice": jobs_per_notice}
    for path, xs in per_job.items():
        if xs:
            out.update({f"{path}_jobs_measured": len(xs), f"{path}_p50_s": round(statistics.median(xs), 4),
                        f"{path}_p99_s": round(pct(xs, 0.99), 4), f"{path}_max_s": round(max(xs), 4),
                        f"{path}_writes_per_notice": round(statistics.mean(writes[path]), 1) if writes[path] else None,
                        f"{path}_events_per_notice": round(statistics.mean(events[path]), 1) if events[path] else None})
    if peer:
        out.update(peer_direct_patch_p50_s=round(statistics.median(peer), 4),
                   peer_direct_patch_p99_s=round(pct(peer, 0.99), 4))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
