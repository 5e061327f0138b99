"""Pod status as the process kubelet reports it (pure): container states, phase, conditions.

Exit codes follow container runtimes: a process killed by signal N reports ``exitCode: 128+N`` (SIGTERM 143,
SIGKILL 137) with ``signal: N``; reason ``Completed`` for 0, ``Error`` otherwise.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: datetime) -> str:
    """Kubernetes MicroTime (leases): microsecond precision, UTC."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class ContainerFacts:
    """What the kubelet knows about one container's process."""

    name: str
    image: str = ""
    pid: int | None = None
    started_at: datetime | None = None
    returncode: int | None = None     # Popen.returncode: >= 0 exit code, < 0 killed by signal -N
    finished_at: datetime | None = None
    restart_count: int = 0
    last_terminated: dict | None = None
    waiting_reason: str | None = None  # e.g. CreateContainerConfigError, ContainerCreating
    waiting_message: str | None = None
    reason: str | None = None          # overrides Completed/Error (e.g. StartError, ContainerStatusUnknown)
    message: str | None = None
    termination_message: str = ""      # what the container left in its terminationMessagePath file

    @property
    def running(self) -> bool:
        return self.started_at is not None and self.returncode is None

    @property
    def exit_code(self) -> int | None:
        if self.returncode is None:
            return None
        return 128 - self.returncode if self.returncode < 0 else self.returncode


MAX_TERMINATION_MESSAGE = 4096  # bytes the kubelet keeps of a termination message


def read_termination_message(path: Path) -> str:
    """What a finished container left in its termination message file (at most the kubelet's 4096 bytes)."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_TERMINATION_MESSAGE).decode(errors="replace")
    except OSError:
        return ""


def terminated_state(f: ContainerFacts) -> dict:
    """The ``state.terminated`` of a finished container."""
    code = f.exit_code
    assert code is not None, f"container {f.name} has not finished"
    state: dict = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "containerID": f"process://{f.pid}",
    }
    if f.returncode is not None and f.returncode < 0:
        state["signal"] = -f.returncode
        try:
            state["message"] = f"killed by signal {_signal.Signals(-f.returncode).name}"
        except ValueError:
            state["message"] = f"killed by signal {-f.returncode}"
    if f.reason:
        state["reason"] = f.reason
    if f.message:
        state["message"] = f.message
    if f.termination_message:  # terminationMessagePolicy File: the file's content is the message
        state["message"] = f.termination_message
    if f.started_at:
        state["startedAt"] = rfc3339(f.started_at)
    if f.finished_at:
        state["finishedAt"] = rfc3339(f.finished_at)
    return state


def container_status(f: ContainerFacts) -> dict:
    status: dict = {
        "name": f.name,
        "image": f.image or "none",
        "imageID": "",
        "restartCount": f.restart_count,
        "ready": f.running,
        "started": f.running,
    }
    if f.running:
        status["containerID"] = f"process://{f.pid}"
        status["state"] = {"running": {"startedAt": rfc3339(f.started_at)}}  # type: ignore[arg-type]
    elif f.returncode is not None:
        status["containerID"] = f"process://{f.pid}"
        status["state"] = {"terminated": terminated_state(f)}
    else:
        waiting = {"reason": f.waiting_reason or "ContainerCreating"}
        if f.waiting_message:
            waiting["message"] = f.waiting_message
        status["state"] = {"waiting": waiting}
    if f.last_terminated:
        status["lastState"] = {"terminated": f.last_terminated}
    return status


def init_progress(restart_policy: str, init_facts: list[ContainerFacts]) -> str:
    """``done`` (every init container exited 0), ``failed`` (one failed under ``Never``) or ``running``."""
    for f in init_facts:
        if f.exit_code == 0:
            continue
        if f.exit_code is not None and restart_policy == "Never":
            return "failed"
        return "running"
    return "done"


def pod_phase(restart_policy: str, facts: list[ContainerFacts], *, init_facts: list[ContainerFacts] | None = None,
              deleting: bool = False) -> str:
    """Kubernetes pod phase from the containers' states.

    ``deleting``: the pod is being deleted and its processes are gone; like the real kubelet (>= 1.27) it
    gets a terminal phase whatever its restartPolicy.
    """
    init = init_progress(restart_policy, init_facts or [])
    if init == "failed":
        return "Failed"
    if init == "running":
        return "Failed" if deleting and not any(f.running for f in init_facts or []) else "Pending"
    if not facts or any(f.started_at is None for f in facts):
        return "Pending"
    if any(f.running for f in facts):
        return "Running"
    all_ok = all(f.exit_code == 0 for f in facts)
    if deleting:
        return "Succeeded" if all_ok else "Failed"
    if restart_policy == "Always":
        return "Running"
    if restart_policy == "OnFailure":
        return "Succeeded" if all_ok else "Running"
    return "Succeeded" if all_ok else "Failed"


def should_restart(restart_policy: str, f: ContainerFacts, *, init: bool = False) -> bool:
    """Whether a finished container is started again (the pod is not being deleted).

    An init container is retried after a failure unless the policy is ``Never``; one that succeeded never runs
    again.
    """
    if f.returncode is None:
        return False
    if init:
        return restart_policy != "Never" and f.exit_code != 0
    return restart_policy == "Always" or (restart_policy == "OnFailure" and f.exit_code != 0)


def restart_delay(restart_count: int) -> float:
    """Back-off before restart number ``restart_count + 1`` (kubelet: 10 s doubling to 300 s; here 1 s to 10 s)."""
    return float(min(10, 2 ** restart_count))


def _condition(kind: str, ok: bool, now: str, old: dict[str, dict], reason: str | None = None,
               true_reason: str | None = None) -> dict:
    value = "True" if ok else "False"
    prev = old.get(kind)
    since = prev["lastTransitionTime"] if prev and prev.get("status") == value and prev.get(
        "lastTransitionTime") else now
    cond = {"type": kind, "status": value, "lastTransitionTime": since, "lastProbeTime": None}
    if reason and not ok:
        cond["reason"] = reason
    if true_reason and ok:
        cond["reason"] = true_reason
    return cond


def pod_status(pod: dict, facts: list[ContainerFacts], *, pod_ip: str, host_ip: str, start_time: datetime,
               now: datetime, deleting: bool = False, init_facts: list[ContainerFacts] | None = None) -> dict:
    """The ``status`` to patch (strategic merge) for ``pod`` given its containers' facts."""
    spec = pod.get("spec") or {}
    policy = spec.get("restartPolicy") or "Always"
    phase = pod_phase(policy, facts, init_facts=init_facts, deleting=deleting)
    initialized = init_progress(policy, init_facts or []) == "done"
    old = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    ts = rfc3339(now)
    terminal = phase in ("Succeeded", "Failed")
    ready = phase == "Running" and all(f.running for f in facts)
    # as the real kubelet (v1.35) reports them: PodFailed / PodCompleted once terminal, and Initialized carries
    # PodCompleted on a Succeeded pod
    not_ready_reason = {"Failed": "PodFailed", "Succeeded": "PodCompleted"}.get(phase, "ContainersNotReady")
    started = any(f.started_at is not None for f in facts)
    status = {
        "observedGeneration": (pod.get("metadata") or {}).get("generation", 1),  # 1.35 PodObservedGenerationTracking
        "phase": phase,
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": rfc3339(start_time),
        "conditions": [
            _condition("PodReadyToStartContainers", not terminal, ts, old),
            _condition("Initialized", initialized, ts, old, "ContainersNotInitialized",
                       "PodCompleted" if phase == "Succeeded" else None),
            _condition("Ready", ready, ts, old, not_ready_reason if started else "ContainersNotReady"),
            _condition("ContainersReady", ready, ts, old, not_ready_reason if started else "ContainersNotReady"),
        ],
        "containerStatuses": [container_status(f) for f in facts],
    }
    if init_facts:
        # a finished init container that succeeded counts as ready, like the real kubelet reports it
        status["initContainerStatuses"] = [{**container_status(f), "ready": f.running or f.exit_code == 0}
                                           for f in init_facts]
    return status
