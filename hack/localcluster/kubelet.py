"""A process kubelet: a fake Node whose pods run as local processes (test/dev tooling).

Public interface (stable; the cluster launcher and the pytest fixtures code against it)::

    from localcluster.kubelet import Kubelet

    kubelet = Kubelet(
        api_client,                 # kubernetes.client.ApiClient with admin credentials
        "node-a",                   # Node name (also kubernetes.io/hostname)
        workdir / "node-a",         # per-node directory; pods live under <workdir>/pods/
        labels={"pool": "tpu"},     # extra Node labels (kubernetes.io/hostname etc. are added)
        capacity={"cpu": "8", "memory": "32Gi", "pods": "110"},  # defaults shown in DEFAULT_CAPACITY
        sync_period=1.0,            # reconcile period (process exits and watch events wake it earlier)
        heartbeat_period=10.0,      # Lease renewal + Node status heartbeat
        ca_file=cluster_ca_path,    # written as ca.crt into service-account mounts if kube-root-ca.crt is absent
        api_host="127.0.0.1",       # KUBERNETES_SERVICE_HOST seen by pods
        api_port=6443,              # KUBERNETES_SERVICE_PORT seen by pods (default: taken from api_client's host)
        parent_env=None,            # environment the passthrough variables come from (default os.environ)
    )
    kubelet.start()    # registers the Node (Ready), starts lease/heartbeat, node watch and pod watch threads
    kubelet.pids()     # {"ns/pod/container": pid} of running processes
    kubelet.log_path("ns", "pod", "container")   # where that container's stdout+stderr go
    kubelet.stop()     # SIGKILLs its processes, stops its threads; does NOT delete the Node object

or as its own process (so "the VM is gone" can be simulated by SIGKILLing it; its pods die with it)::

    python -m localcluster.kubelet --kubeconfig K --node NAME --workdir DIR [--label k=v ...]
        [--capacity cpu=8 --capacity memory=32Gi] [--ca-file F] [--sync-period 1.0] [--heartbeat-period 10]

SIGTERM/SIGINT stop it like ``stop()``; it exits by itself once its Node object is deleted. Behaviour, what
is emulated and what is not: docs/local-cluster.md, section "Process kubelet".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from localcluster import nodespec, podio
from localcluster.costs import PULL_ENV, START_ENV, EmulatedCosts
from localcluster.downward import FieldRefError
from localcluster.nodeagent import RETRY_DELAY_S, WATCH_TIMEOUT_S, NodeAgent
from localcluster.podio import REQUEST_TIMEOUT_S, find_log
from localcluster.podip import pod_ip
from localcluster.podspec import EnvContext, LaunchPlan, PodConfigError, PodPaths, launch_plan, token_requests
from localcluster.podstatus import (
    ContainerFacts,
    pod_status,
    read_termination_message,
    restart_delay,
    should_restart,
    terminated_state,
)

__all__ = ["DEFAULT_CAPACITY", "Kubelet", "find_log", "main"]

DEFAULT_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
log = logging.getLogger("localcluster.kubelet")

DEFAULT_GRACE_S = 30


def _now() -> datetime:
    return datetime.now(UTC)


def _status_key(status: dict) -> str:
    """Status without timestamps that change on every computation, to skip redundant patches."""
    s = dict(status)
    s["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in s["conditions"]]
    return json.dumps(s, sort_keys=True)


@dataclass
class _Pod:
    """Local state of one pod (by uid)."""

    pod: dict
    paths: PodPaths
    ip: str
    facts: list[ContainerFacts] = field(default_factory=list)
    init_facts: list[ContainerFacts] = field(default_factory=list)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    plans: dict[str, LaunchPlan] = field(default_factory=dict)
    objects: dict = field(default_factory=dict)
    tokens: dict = field(default_factory=dict)
    tokens_due: float = float("inf")  # monotonic time to renew the tokens (80 % of their lifetime)
    start_time: datetime = field(default_factory=_now)
    launched: bool = False
    lost: bool = False            # found running from a previous kubelet: reported failed, never started
    gone: bool = False            # the API object is deleted
    files_rv: str | None = None   # resourceVersion the file volumes were last written for
    term_at: float | None = None  # monotonic time SIGTERM was sent (deletion)
    kill_sent: bool = False
    delete_sent: bool = False
    last_status: str | None = None
    next_restart: dict[str, float] = field(default_factory=dict)
    ready_at: float = 0.0          # monotonic time the emulated image pull and container start are over

    @property
    def key(self) -> str:
        m = self.pod["metadata"]
        return f"{m['namespace']}/{m['name']}"

    @property
    def deleting(self) -> bool:
        return bool(self.pod["metadata"].get("deletionTimestamp"))


class Kubelet:
    """A fake Node whose pods run as local processes (see the module docstring for the interface)."""

    def __init__(self, api_client: client.ApiClient, node_name: str, workdir: Path, *,
                 labels: dict[str, str] | None = None, capacity: dict[str, str] | None = None,
                 sync_period: float = 1.0, heartbeat_period: float = 10.0, ca_file: str | Path | None = None,
                 api_host: str = "127.0.0.1", api_port: int | None = None,
                 parent_env: dict[str, str] | None = None, costs: EmulatedCosts | None = None,
                 address_space: str = "") -> None:
        self.api_client = api_client
        self.node_name = node_name
        self.address_space = address_space
        self.workdir = Path(workdir)
        self.labels = dict(labels or {})
        self.capacity = {**DEFAULT_CAPACITY, **(capacity or {})}
        self.sync_period = sync_period
        self.heartbeat_period = heartbeat_period
        self.ca_file = ca_file if ca_file is not None else api_client.configuration.ssl_ca_cert
        self.api_host = api_host
        self.api_port = api_port if api_port is not None else (urlparse(api_client.configuration.host).port or 443)
        env = dict(os.environ if parent_env is None else parent_env)
        # "python" in a pod is the interpreter running the kubelet (the project's venv).
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)])
        self.parent_env = env
        self.core = client.CoreV1Api(api_client)
        self.costs = costs or EmulatedCosts.from_env()
        self._pulled: dict[str, float] = {}  # image -> monotonic time its (emulated) pull on this node is done
        self._pods: dict[str, _Pod] = {}
        self._lock = threading.RLock()
        self._events: queue.Queue = queue.Queue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.node_deleted = threading.Event()
        self._node = NodeAgent(api_client, node_name, labels=self.labels, capacity=self.capacity,
                               heartbeat_period=heartbeat_period, stop=self._stop, on_deleted=self._on_node_deleted)

    # --- public ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Register the Node and start the loops. Raises ApiException if the Node cannot be registered."""
        (self.workdir / "pods").mkdir(parents=True, exist_ok=True)
        self._node.register()
        for target in (self._sync_loop, self._pod_watch_loop, *self._node.loops()):
            t = threading.Thread(target=target, name=f"kubelet-{self.node_name}-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)
        log.info("node %s registered (workdir %s)", self.node_name, self.workdir)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGKILL every process of this node and stop the loops (the Node object stays)."""
        self._stop.set()
        self._wake.set()
        self._kill_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            # Watch threads may sit in a blocking read until the server-side timeout: they are daemons, left
            # to end on their own; the loops that start processes or write to the API are waited for.
            if t is not threading.current_thread() and "watch" not in t.name:
                t.join(timeout=max(0.0, deadline - time.monotonic()))

    def pids(self) -> dict[str, int]:
        """``{"ns/pod/container": pid}`` of the processes running now."""
        with self._lock:
            return {f"{st.key}/{name}": p.pid for st in self._pods.values() for name, p in st.procs.items()
                    if p.poll() is None}

    def log_path(self, namespace: str, name: str, container: str | None = None) -> Path | None:
        """Where a container's stdout+stderr are written (the kubectl logs API is not served)."""
        return find_log(self.workdir, namespace, name, container)

    def _on_node_deleted(self) -> None:
        self.node_deleted.set()
        log.warning("node %s was deleted: killing all its processes (the VM is gone)", self.node_name)
        self._stop.set()
        self._kill_all()
        self._wake.set()

    def _kill_all(self) -> None:
        with self._lock:
            for st in self._pods.values():
                for p in st.procs.values():
                    podio.killpg(p.pid, signal.SIGKILL)

    # --- pod watch -------------------------------------------------------------------------------------------

    def _pod_watch_loop(self) -> None:
        selector = f"spec.nodeName={self.node_name}"
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    resp = self.core.list_pod_for_all_namespaces(field_selector=selector, _preload_content=False,
                                                                 _request_timeout=REQUEST_TIMEOUT_S)
                    data = json.loads(resp.data)  # type: ignore[attr-defined]  # raw urllib3 response
                    rv = data["metadata"]["resourceVersion"]
                    self._events.put(("LIST", data["items"]))
                    self._wake.set()
                w = watch.Watch()
                for ev in w.stream(self.core.list_pod_for_all_namespaces, field_selector=selector,
                                   resource_version=rv, allow_watch_bookmarks=True,
                                   timeout_seconds=WATCH_TIMEOUT_S, _request_timeout=WATCH_TIMEOUT_S + 10):
                    obj = ev["raw_object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._events.put((ev["type"], obj))
                        self._wake.set()
                    if self._stop.is_set():
                        w.stop()
                        break
            except ApiException as e:
                rv = None  # 410 Gone (too old) or anything else: relist
                if not self._stop.is_set() and e.status != 410:
                    log.info("pod watch on %s restarting after: %s %s", self.node_name, e.status, e.reason)
                    self._stop.wait(RETRY_DELAY_S)
            except Exception as e:  # noqa: BLE001
                rv = None
                if not self._stop.is_set():
                    log.info("pod watch on %s restarting after: %r", self.node_name, e)
                    self._stop.wait(RETRY_DELAY_S)

    def _drain_events(self) -> None:
        while True:
            try:
                kind, obj = self._events.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                if kind == "LIST":
                    present = {p["metadata"]["uid"] for p in obj}
                    for uid, st in self._pods.items():
                        if uid not in present:
                            st.gone = True
                    for p in obj:
                        self._upsert(p)
                elif kind == "DELETED":
                    known = self._pods.get(obj["metadata"]["uid"])
                    if known is not None:
                        known.pod, known.gone = obj, True
                else:
                    self._upsert(obj)

    def _upsert(self, pod: dict) -> None:
        meta = pod["metadata"]
        st = self._pods.get(meta["uid"])
        if st is None:
            paths = PodPaths.of(self.workdir, meta["namespace"], meta["name"], meta["uid"])
            self._pods[meta["uid"]] = _Pod(pod=pod, paths=paths, ip=pod_ip(pod, self.address_space))
        else:
            st.pod = pod

    # --- pod sync --------------------------------------------------------------------------------------------

    def _sync_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.sync_period)
            self._wake.clear()
            if self._stop.is_set():
                break
            self._drain_events()
            with self._lock:
                pods = list(self._pods.items())
            for uid, st in pods:
                if self._stop.is_set():
                    break
                try:
                    self._sync_pod(uid, st)
                except Exception:
                    log.exception("sync of pod %s on %s failed", st.key, self.node_name)

    def _sync_pod(self, uid: str, st: _Pod) -> None:
        if st.gone:
            for p in st.procs.values():
                podio.killpg(p.pid, signal.SIGKILL)
            with self._lock:
                self._pods.pop(uid, None)
            log.info("pod %s removed from the API; processes killed", st.key)
            return
        if st.deleting:
            self._sync_deleting(st)
            return
        status = st.pod.get("status") or {}
        if not st.launched:
            if status.get("phase") in ("Succeeded", "Failed") or st.lost:
                return
            if status.get("phase") == "Running" or any(
                    "running" in (c.get("state") or {}) for c in status.get("containerStatuses") or []):
                self._mark_lost(st)
                return
            self._launch(st)
        else:
            self._refresh_files(st)
            if any(f.started_at is None for f in st.init_facts + st.facts):
                self._advance(st)
            self._check_exits(st, restart=True)
        self._report(st)

    def _sync_deleting(self, st: _Pod) -> None:
        if st.launched:
            self._check_exits(st, restart=False)
            running = [p for p in st.procs.values() if p.poll() is None]
            if running:
                meta, spec = st.pod["metadata"], st.pod["spec"]
                grace = meta.get("deletionGracePeriodSeconds")
                if grace is None:
                    grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
                now = time.monotonic()
                if st.term_at is None:
                    log.info("pod %s deleted: SIGTERM, SIGKILL in %ss", st.key, grace)
                    for p in running:
                        # SIGTERM goes to the container's main process only, as containerd sends it to a
                        # container's init: a shell wrapper does not pass it on to its children.
                        podio.kill(p.pid, signal.SIGTERM)
                    st.term_at = now
                # A second delete may shorten the grace period; the deadline follows it.
                elif not st.kill_sent and now >= st.term_at + float(grace):
                    log.info("pod %s: grace period over, SIGKILL", st.key)
                    for p in running:
                        podio.killpg(p.pid, signal.SIGKILL)
                    st.kill_sent = True
                return
            for p in st.procs.values():
                podio.killpg(p.pid, signal.SIGKILL)  # leftovers of the process groups
            self._report(st, deleting=True)
        if not st.delete_sent:
            meta = st.pod["metadata"]
            try:
                self.core.delete_namespaced_pod(
                    meta["name"], meta["namespace"],
                    body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},  # type: ignore[arg-type]
                    _request_timeout=REQUEST_TIMEOUT_S)
            except ApiException as e:
                if e.status not in (404, 409):
                    raise
            st.delete_sent = True

    def _mark_lost(self, st: _Pod) -> None:
        """A pod this kubelet did not start claims to run here (kubelet restart): report it failed."""
        now = _now()
        st.facts = [ContainerFacts(name=c["name"], image=c.get("image", ""), started_at=now, returncode=137,
                                   finished_at=now, reason="ContainerStatusUnknown",
                                   message="The container could not be located when the pod was terminated")
                    for c in st.pod["spec"]["containers"]]
        st.lost = True
        log.warning("pod %s was running before this kubelet started: reported Failed", st.key)
        self._report(st, deleting=True)

    def _report(self, st: _Pod, deleting: bool = False) -> None:
        if not st.facts:
            return
        status = pod_status(st.pod, st.facts, pod_ip=st.ip, host_ip=nodespec.HOST_IP, start_time=st.start_time,
                            now=_now(), deleting=deleting, init_facts=st.init_facts)
        key = _status_key(status)
        if key == st.last_status:
            return
        if podio.patch_pod_status(self.core, st.pod, status):
            st.last_status = key

    # --- launching -------------------------------------------------------------------------------------------

    def _launch(self, st: _Pod) -> None:
        pod = st.pod
        spec = pod["spec"]
        containers = list(spec.get("initContainers") or []) + list(spec["containers"])
        if not st.facts:
            st.facts = [ContainerFacts(name=c["name"], image=c.get("image", "")) for c in spec["containers"]]
            st.init_facts = [ContainerFacts(name=c["name"], image=c.get("image", ""))
                             for c in spec.get("initContainers") or []]
        try:
            st.objects = podio.fetch_objects(self.core, pod)
            self._request_tokens(st)
            podio.make_dirs_and_mounts(pod, st.paths)
            self._write_files(st, only_dynamic=False)
            ctx = EnvContext(node_name=self.node_name, pod_ip=st.ip, api_host=self.api_host,
                             api_port=self.api_port, parent_env=self.parent_env,
                             subdomains=podio.subdomains(self.core, pod), address_space=self.address_space)
            st.plans = {c["name"]: launch_plan(pod, c, st.paths, ctx, st.objects) for c in containers}
        except (PodConfigError, FieldRefError) as e:
            if st.facts[0].waiting_message != str(e):
                log.warning("%s", e)
            for f in st.init_facts + st.facts:
                f.waiting_reason, f.waiting_message = "CreateContainerConfigError", str(e)
            return
        st.ready_at = self._emulate_pull_and_start(st, containers)
        for f in st.init_facts + st.facts:
            f.waiting_reason = "PodInitializing" if st.init_facts else None
            f.waiting_message = None
            if st.ready_at > time.monotonic():
                f.waiting_reason = "ContainerCreating"
        st.launched = True
        self._advance(st)

    def _emulate_pull_and_start(self, st: _Pod, containers: list[dict]) -> float:
        """When the pod's containers may start: after the emulated pull of every image this node has not
        pulled yet (one pull per node and image, shared by the pods that wait for it) and the emulated
        container start. Posts the Pulling/Pulled Events a real kubelet posts."""
        now = time.monotonic()
        ready = now
        for image in dict.fromkeys(c.get("image", "") for c in containers):
            done = self._pulled.get(image)
            if done is None:
                done = now + self.costs.pull_seconds
                self._pulled[image] = done
                if self.costs.pull_seconds > 0:
                    podio.post_event(self.core, st.pod, "Pulling", f"Pulling image \"{image}\" (emulated: "
                                     f"{self.costs.pull_seconds:g} s per node and image)")
                    pulled = f"Successfully pulled image \"{image}\" in {self.costs.pull_seconds:g}s (emulated)"
                    threading.Timer(self.costs.pull_seconds, podio.post_event,
                                    (self.core, st.pod, "Pulled", pulled)).start()
            ready = max(ready, done)
        ready += self.costs.start_seconds
        if ready > now:
            threading.Timer(ready - now, self._wake.set).start()
        return ready

    def _advance(self, st: _Pod) -> None:
        """Start the next init container, or once all of them exited 0, the containers (not yet started)."""
        if time.monotonic() < st.ready_at:
            return  # the emulated pull or container start is not over
        for f in st.init_facts:
            if f.exit_code == 0:
                continue
            if f.started_at is None:
                self._start_process(st, f)
            return  # running, failed (Never), or waiting for its restart
        for f in st.facts:
            if f.started_at is None:
                f.waiting_reason = None
                self._start_process(st, f)

    def _write_files(self, st: _Pod, only_dynamic: bool) -> None:
        podio.write_volume_files(st.pod, st.paths, objects=st.objects, tokens=st.tokens, pod_ip=st.ip,
                                 node_name=self.node_name, ca_pem=podio.read_text(self.ca_file),
                                 only_dynamic=only_dynamic)
        st.files_rv = st.pod["metadata"].get("resourceVersion")

    def _request_tokens(self, st: _Pod) -> None:
        requests = token_requests(st.pod)
        st.tokens = {req: podio.request_token(self.core, st.pod, *req) for req in requests}
        if requests:  # like the real kubelet: renew at 80 % of the shortest lifetime
            st.tokens_due = time.monotonic() + 0.8 * min(exp for _, exp in requests)

    def _refresh_files(self, st: _Pod) -> None:
        """Rewrite downwardAPI/projected files when the pod changed (annotations, labels) or tokens age."""
        try:
            if time.monotonic() >= st.tokens_due:
                st.tokens_due = time.monotonic() + 10.0  # retry then if the renewal fails
                self._request_tokens(st)
                st.files_rv = None
            if st.pod["metadata"].get("resourceVersion") != st.files_rv:
                self._write_files(st, only_dynamic=True)
        except (PodConfigError, FieldRefError, OSError, ApiException) as e:
            log.warning("pod %s: cannot refresh volume files: %s", st.key, e)

    def _start_process(self, st: _Pod, f: ContainerFacts) -> None:
        plan = st.plans[f.name]
        now = _now()
        f.started_at, f.finished_at, f.returncode, f.reason, f.message = now, None, None, None, None
        f.termination_message = ""
        term = st.paths.termination_log(f.name)
        term.parent.mkdir(parents=True, exist_ok=True)
        term.write_text("")  # a fresh file for each run of the container, as the kubelet mounts one
        try:
            proc = podio.spawn(plan, st.paths.log(f.name))
        except podio.StartError as e:
            f.pid, f.returncode, f.finished_at, f.reason, f.message = None, 128, now, "StartError", str(e)
            log.warning("pod %s container %s: %s", st.key, f.name, e)
            return
        f.pid = proc.pid
        with self._lock:
            st.procs[f.name] = proc
        log.info("pod %s container %s: pid %d ip %s: %s", st.key, f.name, proc.pid, st.ip,
                      " ".join(plan.argv)[:200].replace("\n", "\\n"))
        threading.Thread(target=self._wait_process, args=(proc,), daemon=True, name=f"wait-{proc.pid}").start()

    def _wait_process(self, proc: subprocess.Popen) -> None:
        try:
            proc.wait()
        finally:
            self._wake.set()

    def _check_exits(self, st: _Pod, restart: bool) -> None:
        policy = st.pod["spec"].get("restartPolicy") or "Always"
        init_ids = {id(f) for f in st.init_facts}
        for f in st.init_facts + st.facts:
            proc = st.procs.get(f.name)
            if proc is not None and f.returncode is None and f.started_at is not None:
                rc = proc.poll()
                if rc is None:
                    continue
                f.returncode, f.finished_at = rc, _now()
                podio.killpg(proc.pid, signal.SIGKILL)  # like a container: its other processes go with it
                f.termination_message = read_termination_message(st.paths.termination_log(f.name))
                log.info("pod %s container %s exited: %s", st.key, f.name, f.exit_code)
            if not restart or not should_restart(policy, f, init=id(f) in init_ids):
                continue
            due = st.next_restart.setdefault(f.name, time.monotonic() + restart_delay(f.restart_count))
            if time.monotonic() >= due:
                del st.next_restart[f.name]
                f.last_terminated = terminated_state(f)
                f.restart_count += 1
                self._start_process(st, f)
        if restart and st.init_facts:
            self._advance(st)


def _parse_pairs(pairs: list[str], what: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"kubelet: {what} must be KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.kubelet", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True, help="admin kubeconfig of the cluster")
    parser.add_argument("--node", required=True, help="Node name")
    parser.add_argument("--workdir", required=True, help="directory for this node's pods")
    parser.add_argument("--label", action="append", default=[], help="extra Node label KEY=VALUE (repeatable)")
    parser.add_argument("--capacity", action="append", default=[], help="capacity RESOURCE=QUANTITY (repeatable)")
    parser.add_argument("--ca-file", default=None, help="cluster CA (default: the kubeconfig's)")
    parser.add_argument("--address-space", default="",
                        help="salt of the pods' loopback addresses: unique per cluster on a host (podip.address_space)")
    parser.add_argument("--sync-period", type=float, default=1.0)
    parser.add_argument("--heartbeat-period", type=float, default=10.0)
    parser.add_argument("--emulate-pull-seconds", type=float, default=None,
                        help=f"seconds an image takes to pull, once per node and image (default: "
                             f"${PULL_ENV} or 0)")
    parser.add_argument("--emulate-start-seconds", type=float, default=None,
                        help=f"seconds a container takes to start (default: ${START_ENV} or 0)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s kubelet[{args.node}] %(levelname)s %(message)s")
    from kubernetes import config

    if not Path(args.kubeconfig).is_file():
        parser.error(f"--kubeconfig {args.kubeconfig}: no such file")
    api_client = config.new_client_from_config(config_file=args.kubeconfig)
    kubelet = Kubelet(api_client, args.node, Path(args.workdir), labels=_parse_pairs(args.label, "--label"),
                      capacity=_parse_pairs(args.capacity, "--capacity"), sync_period=args.sync_period,
                      heartbeat_period=args.heartbeat_period, ca_file=args.ca_file,
                      costs=EmulatedCosts.from_env(args.emulate_pull_seconds, args.emulate_start_seconds),
                      address_space=args.address_space)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        kubelet.start()
    except Exception as e:  # noqa: BLE001 - any failure to register ends this kubelet with a clear message
        log.error("cannot register Node %s with the API server at %s: %s (is the cluster up, is the kubeconfig "
                  "an admin one?)", args.node, api_client.configuration.host, e)
        return 1
    while not done.wait(1.0) and not kubelet.node_deleted.is_set():
        pass
    kubelet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
