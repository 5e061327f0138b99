"""The process kubelet's adapters for one pod: API reads, volume files on disk, processes, logs."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from localcluster.podspec import (
    LaunchPlan,
    PodConfigError,
    PodPaths,
    decode_secret,
    mounts_for,
    referenced_objects,
    volume_files,
)

log = logging.getLogger("localcluster.kubelet")

REQUEST_TIMEOUT_S = 15  # every non-watch API call


def kill(pid: int | None, sig: int, *, group: bool = False) -> None:
    """Signal one process (or its whole process group), ignoring one that is already gone."""
    if pid is None:
        return
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def killpg(pid: int | None, sig: int) -> None:
    """Signal a process group, ignoring one that is already gone."""
    kill(pid, sig, group=True)


def write_atomic(path: Path, content: str) -> bool:
    """Write ``content`` to ``path`` via temp file + rename; False if it already had that content."""
    try:
        if path.read_text() == content:
            return False
    except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(content)
    os.replace(tmp, path)
    return True


# --- API reads ----------------------------------------------------------------------------------------------

def fetch_objects(core: client.CoreV1Api, pod: dict) -> dict[tuple[str, str], dict[str, str]]:
    """The ConfigMaps/Secrets the pod references, decoded; absent ones are left out."""
    ns = pod["metadata"]["namespace"]
    objects: dict[tuple[str, str], dict[str, str]] = {}
    for kind, name in referenced_objects(pod):
        try:
            if kind == "ConfigMap":
                cm = core.read_namespaced_config_map(name, ns, _request_timeout=REQUEST_TIMEOUT_S)
                objects[(kind, name)] = dict(cm.data or {})
            else:
                secret = core.read_namespaced_secret(name, ns, _request_timeout=REQUEST_TIMEOUT_S)
                objects[(kind, name)] = decode_secret(secret.data)
        except ApiException as e:
            if e.status != 404:
                raise
    return objects


def request_token(core: client.CoreV1Api, pod: dict, audience: str, expiration: int) -> str:
    """A ServiceAccount token for the pod's account, bound to the pod (TokenRequest API)."""
    meta = pod["metadata"]
    spec: dict = {"expirationSeconds": expiration,
                  "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}}
    if audience:
        spec["audiences"] = [audience]
    sa = pod["spec"].get("serviceAccountName") or "default"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    resp = core.create_namespaced_service_account_token(  # the client sends a dict body as it is
        sa, meta["namespace"], body, _request_timeout=REQUEST_TIMEOUT_S)  # type: ignore[arg-type]
    if resp.status is None or not resp.status.token:
        raise RuntimeError(f"TokenRequest for {meta['namespace']}/{sa} (pod {meta['name']}) returned no token")
    return str(resp.status.token)


def subdomains(core: client.CoreV1Api, pod: dict) -> set[str]:
    """Names that count as headless-service subdomains for the pod's DNS rewriting."""
    names = {pod["spec"]["subdomain"]} if pod["spec"].get("subdomain") else set()
    try:
        services = core.list_namespaced_service(pod["metadata"]["namespace"], _request_timeout=REQUEST_TIMEOUT_S)
        names |= {str(s.metadata.name) for s in services.items if s.metadata}
    except ApiException as e:
        log.info("cannot list services for DNS names: %s %s", e.status, e.reason)
    return names


def patch_pod_status(core: client.CoreV1Api, pod: dict, status: dict) -> bool:
    """Strategic-merge ``status`` into this very pod; False if it is gone or was replaced by a namesake.

    The patch carries ``metadata.uid``, which the API server refuses to change (422 "field is immutable"), so a
    late report about a deleted pod never lands on a new pod of the same name (the real kubelet does the same).
    """
    meta = pod["metadata"]
    body = {"metadata": {"uid": meta["uid"]}, "status": status}
    try:
        core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body, _request_timeout=REQUEST_TIMEOUT_S)
        return True
    except ApiException as e:
        if e.status in (404, 409) or (e.status == 422 and "metadata.uid" in str(e.body)):
            log.info("status of pod %s/%s (uid %s) not written: %s %s", meta["namespace"], meta["name"],
                     meta["uid"], e.status, e.reason)
            return False
        raise


def post_event(core: client.CoreV1Api, pod: dict, reason: str, message: str) -> None:
    """A Normal Event on ``pod`` from this kubelet (best effort: a failure is only logged)."""
    from datetime import UTC, datetime

    meta = pod["metadata"]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {"metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "reason": reason, "message": message, "type": "Normal",
            "source": {"component": "kubelet", "host": pod["spec"].get("nodeName", "")},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1}
    try:
        core.create_namespaced_event(meta["namespace"], body, _request_timeout=REQUEST_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - Events are best effort, like the real kubelet's
        log.info("event %s on pod %s/%s not posted: %s", reason, meta["namespace"], meta["name"], e)


def read_text(path: str | Path | None) -> str | None:
    try:
        return Path(path).read_text() if path else None
    except OSError:
        return None


# --- files ---------------------------------------------------------------------------------------------------

def write_volume_files(pod: dict, paths: PodPaths, *, objects: Mapping, tokens: Mapping, pod_ip: str,
                       node_name: str, ca_pem: str | None, only_dynamic: bool) -> None:
    """Write the file-backed volumes (only downwardAPI/projected when ``only_dynamic``), atomically."""
    for v in pod["spec"].get("volumes") or []:
        if only_dynamic and "downwardAPI" not in v and "projected" not in v:
            continue
        files = volume_files(pod, v, objects=objects, tokens=tokens, pod_ip=pod_ip, node_name=node_name,
                             ca_pem=ca_pem)
        if files is None:
            continue
        d = paths.volume(v["name"])
        d.mkdir(parents=True, exist_ok=True)
        for rel, content in files.items():
            write_atomic(d / rel, content)


def make_dirs_and_mounts(pod: dict, paths: PodPaths) -> None:
    """emptyDir and hostPath directories, the pod's root, and root/<mountPath> symlinks.

    Raises:
        PodConfigError: a hostPath of type Directory/File/... does not exist.
    """
    for v in pod["spec"].get("volumes") or []:
        if "emptyDir" in v:
            paths.volume(v["name"]).mkdir(parents=True, exist_ok=True)
        elif "hostPath" in v:
            path, kind = Path(v["hostPath"]["path"]), v["hostPath"].get("type") or ""
            if kind in ("", "DirectoryOrCreate"):
                path.mkdir(parents=True, exist_ok=True)
            elif kind == "FileOrCreate":
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch(exist_ok=True)
            elif not path.exists():
                meta = pod["metadata"]
                raise PodConfigError(f"Pod {meta['namespace']}/{meta['name']}: volume {v['name']!r}: hostPath "
                                     f"{path} of type {kind} does not exist")
    paths.root.mkdir(parents=True, exist_ok=True)
    for c in list(pod["spec"].get("initContainers") or []) + list(pod["spec"]["containers"]):
        for m in mounts_for(pod, c, paths):
            if not m.target.exists():
                m.target.mkdir(parents=True, exist_ok=True)  # a subPath
            if m.link.is_symlink() or m.link.exists():
                continue
            m.link.parent.mkdir(parents=True, exist_ok=True)
            m.link.symlink_to(m.target)


# --- processes and logs --------------------------------------------------------------------------------------

def _die_with_parent_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL --``: the pod's process gets SIGKILL when the kubelet thread that started it
    dies (a SIGKILLed kubelet is a vanished VM). Without util-linux's setpriv, pods outlive a SIGKILLed kubelet."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        log.warning("setpriv not found: pod processes will outlive a SIGKILLed kubelet")
        return []
    return [setpriv, "--pdeathsig", "KILL", "--"]


_DIE_WITH_PARENT = _die_with_parent_prefix()


class StartError(Exception):
    """The container's executable cannot be run (reported as exit 128, reason StartError)."""


def spawn(plan: LaunchPlan, log_file: Path) -> subprocess.Popen:
    """Start the container's process in its own session, stdout+stderr appended to ``log_file``.

    Raises:
        StartError: ``argv[0]`` is not an executable (on the pod's PATH).
    """
    argv0 = plan.argv[0]
    exe = argv0 if "/" in argv0 else shutil.which(argv0, path=plan.env.get("PATH", ""))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    if exe is None or not os.access(exe, os.X_OK):
        message = f'exec: "{argv0}": executable file not found in $PATH'
        with open(log_file, "a") as out:
            out.write(message + "\n")
        raise StartError(message)
    plan.cwd.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        # setpriv execs the command in the same process, so the pid is the pod process's.
        return subprocess.Popen([*_DIE_WITH_PARENT, exe, *plan.argv[1:]], env=plan.env, cwd=plan.cwd,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def kill_groups(procs: Mapping[str, subprocess.Popen], sig: int = signal.SIGKILL) -> None:
    for p in procs.values():
        killpg(p.pid, sig)


def find_log(workdir: str | Path, namespace: str, name: str, container: str | None = None) -> Path | None:
    """The log file of the newest pod ``namespace/name`` under a kubelet ``workdir`` (None if none).

    ``container`` defaults to the alphabetically first container with a log.
    """
    pods = [p for p in (Path(workdir) / "pods" / namespace).glob(f"{name}-*")
            if len(p.name) == len(name) + 9 and p.name[len(name) + 1:].isalnum()]
    if not pods:
        return None
    logs = max(pods, key=lambda p: p.stat().st_mtime) / "logs"
    if container is not None:
        return logs / f"{container}.log"
    found = sorted(logs.glob("*.log"))
    return found[0] if found else None
