"""Pure builders for the objects a TrainingJob owns: worker pods, the headless Service, the worker identity.

Everything here follows ``docs/contract.md`` ("Worker pods", "Identity and RBAC of worker pods").
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from .. import (
    ANNOTATION_EXIT,
    ANNOTATION_NOTICE,
    ANNOTATION_SUPERVISOR,
    ASSIGNMENT_LOSS_EVERY_KEY,
    ASSIGNMENT_RESIZE_KEY,
    CONTRACT_VERSION,
    LABEL_ATTEMPT,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_ROLE,
    NOTICE_OBJECT_KEY,
    NOTICE_OBJECT_SUFFIX,
    SUPERVISOR,
)
from ..models import GROUP, KIND, VERSION, TrainingJob
from .memorypeers import first_peers
from .pairing import MEMORY_PORT

NOTICE_DIR = "/etc/reprieve"
NOTICE_FILE = f"{NOTICE_DIR}/annotations"
SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PODINFO_VOLUME = "reprieve-podinfo"
# The memory tier (spec.checkpoint.memory; docs/memory.md): a medium-Memory emptyDir outlives the trainer process
# and a container restart, and counts against the pod's memory limit; reprieve-supervisor serves it on MEMORY_PORT.
MEMORY_VOLUME = "reprieve-memory"
MEMORY_DIR = "/var/run/reprieve/memory"
MEMORY_TOKEN_KEY = "token"  # the key of the job's Secret <job>-memory


def owner_reference(job: TrainingJob) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": job.name, "uid": job.uid,
            "controller": True, "blockOwnerDeletion": True}


def job_ref(body: dict[str, Any]) -> dict[str, Any]:
    """The reference an Event about the job names (from its body: a job whose spec does not parse has one too)."""
    meta = body["metadata"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": meta["name"],
            "namespace": meta["namespace"], "uid": meta.get("uid")}


def pod_name(job: TrainingJob, index: int) -> str:
    return f"{job.name}-{index}"


def worker_service_account(job: TrainingJob) -> str:
    """The pods' ServiceAccount: the user's if the template names one, else ``<job>-worker``."""
    return str(job.spec.template.get("spec", {}).get("serviceAccountName") or f"{job.name}-worker")


def owns_identity(job: TrainingJob) -> bool:
    return not job.spec.template.get("spec", {}).get("serviceAccountName")


def job_labels(job: TrainingJob) -> dict[str, str]:
    return {LABEL_JOB: job.name}


def assignment_name(job: TrainingJob) -> str:
    return f"{job.name}-assignment"


def notice_object_name(job: TrainingJob) -> str:
    return f"{job.name}{NOTICE_OBJECT_SUFFIX}"


def build_notice_object(job: TrainingJob, value: str) -> dict[str, Any]:
    """The ConfigMap ``<job>-notice``: the job's notice, the value a pod's ``reprieve.dev/notice`` would carry, in
    one object every pod of the job watches (docs/notices.md, "One write per job")."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": notice_object_name(job), "namespace": job.namespace, "labels": job_labels(job),
                         "ownerReferences": [owner_reference(job)]},
            "data": {NOTICE_OBJECT_KEY: value}}


def listed_notice_object(obj: Mapping[str, Any]) -> tuple[tuple[str, str], str | None] | None:
    """((namespace, job), its notice) of a ConfigMap listed at start when it is a job's notice object (named
    ``<job>-notice`` and owned by that TrainingJob, as ``build_notice_object`` makes it), else None."""
    meta = obj.get("metadata") or {}
    owners = [o.get("name") for o in meta.get("ownerReferences") or [] if o.get("kind") == "TrainingJob"]
    for owner in owners:
        if owner and meta.get("name") == f"{owner}{NOTICE_OBJECT_SUFFIX}":
            return (meta.get("namespace", ""), owner), (obj.get("data") or {}).get(NOTICE_OBJECT_KEY)
    return None


def in_place(job: TrainingJob) -> bool:
    return job.spec.mode == "InPlace"


def worker_env(job: TrainingJob, index: int, attempt: int) -> list[dict[str, Any]]:
    s = job.spec
    plain = {
        "REPRIEVE_JOB": job.name,
        "REPRIEVE_NAMESPACE": job.namespace,
        "REPRIEVE_NUM_PROCESSES": str(s.replicas),
        "REPRIEVE_PROCESS_ID": str(index),
        "REPRIEVE_COORDINATOR_ADDRESS": f"{job.name}-0.{job.name}.{job.namespace}.svc:{s.coordinator_port}",
        "REPRIEVE_CHECKPOINT_URI": s.checkpoint.uri,
        "REPRIEVE_CHECKPOINT_INTERVAL_STEPS": str(s.checkpoint.interval_steps),
        "REPRIEVE_CHECKPOINT_INTERVAL_SECONDS": str(s.checkpoint.interval_seconds),
        "REPRIEVE_CHECKPOINT_KEEP": str(s.checkpoint.keep),
        "REPRIEVE_ATTEMPT": str(attempt),
        "REPRIEVE_RESTART_EXIT_CODE": str(s.restart_policy.restart_exit_code),
        "REPRIEVE_NOTICE_FILE": NOTICE_FILE,
        "REPRIEVE_TERMINATION_GRACE_SECONDS": str(s.termination_grace_period_seconds),
        "REPRIEVE_SERVICEACCOUNT_DIR": SERVICEACCOUNT_DIR,
        "REPRIEVE_CONTRACT": str(CONTRACT_VERSION),
    }
    env: list[dict[str, Any]] = [
        {"name": "REPRIEVE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "REPRIEVE_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    if s.elastic is not None and s.elastic.virtual_shards is not None:  # docs/contract.toml [elastic]
        plain["REPRIEVE_VIRTUAL_SHARDS"] = str(s.elastic.virtual_shards)
    env += [{"name": k, "value": v} for k, v in plain.items()]
    return env + memory_env(job, index)


def memory_env(job: TrainingJob, index: int = -1) -> list[dict[str, Any]]:
    """The memory tier's variables (docs/contract.toml [memory]); none without an enabled tier. Worker ``index``
    of a new gang gets its first attempt's peer (``memorypeers.first_peers``: a stable name, as the pods do not
    run yet); later attempts' peers and their nodes come with the assignment. The token comes from the job's
    Secret (:func:`build_memory_secret`)."""
    m = job.spec.checkpoint.memory
    if m is None or not m.enabled:
        return []
    plain = {"REPRIEVE_MEMORY_DIR": MEMORY_DIR, "REPRIEVE_MEMORY_LIMIT_BYTES": str(m.limit_bytes),
             "REPRIEVE_MEMORY_INTERVAL_STEPS": str(m.interval_steps),
             "REPRIEVE_MEMORY_INTERVAL_SECONDS": str(m.interval_seconds), "REPRIEVE_MEMORY_PORT": str(MEMORY_PORT)}
    if m.loss_every_seconds:
        plain["REPRIEVE_MEMORY_LOSS_EVERY_SECONDS"] = str(m.loss_every_seconds)
    peer = first_peers(job).get(index)
    if peer:
        plain["REPRIEVE_MEMORY_PEER"] = peer
    return [{"name": "REPRIEVE_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "REPRIEVE_MEMORY_TOKEN", "valueFrom": {"secretKeyRef": {"name": memory_secret_name(job),
                                                                             "key": MEMORY_TOKEN_KEY}}},
            *({"name": k, "value": v} for k, v in plain.items())]


def memory_secret_name(job: TrainingJob) -> str:
    return f"{job.name}-memory"


def build_memory_secret(job: TrainingJob, token: str) -> dict[str, Any]:
    """The Secret ``<job>-memory``: the token every replica server of the job asks for (``token``: random, made
    by the caller). Owned by the job; created before its pods, which read it as ``REPRIEVE_MEMORY_TOKEN``."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": memory_secret_name(job), "namespace": job.namespace, "labels": job_labels(job),
                         "ownerReferences": [owner_reference(job)]},
            "stringData": {MEMORY_TOKEN_KEY: token}}


def _exclude_nodes(affinity: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """Add ``metadata.name NotIn [node]`` for each node to every required node selector term (terms are ORed,
    requirements within a term ANDed). One requirement per node: for node fields the API server accepts exactly
    one value with ``In``/``NotIn``."""
    affinity = copy.deepcopy(affinity)
    required = affinity.setdefault("nodeAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    exprs = [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in nodes]
    required["nodeSelectorTerms"] = [{**t, "matchFields": [*(t.get("matchFields") or []), *exprs]} for t in terms]
    return affinity


def build_worker_pod(job: TrainingJob, index: int, attempt: int,
                     exclude_nodes: Iterable[str] = (), *, name: str | None = None,
                     role: str = "worker") -> dict[str, Any]:
    """Worker pod ``index`` of gang ``attempt``; never scheduled onto ``exclude_nodes`` (``policy.placement``).

    Named ``<job>-<index>`` unless ``name`` is given; ``name`` ending in ``-`` is a ``generateName`` prefix
    (in-place replacements and spares, whose names the API server makes unique). ``role="spare"`` (in-place
    mode): no index (``index`` is ignored; its environment names process -1, which the runtime refuses, so a
    spare never trains on its own environment: only an assignment gives it an index)."""
    spare = role == "spare"
    if not spare and not 0 <= index < job.spec.replicas:
        raise ValueError(f"TrainingJob {job.namespace}/{job.name}: index must be in [0, {job.spec.replicas}), "
                         f"got {index}")
    template = copy.deepcopy(job.spec.template)
    meta = template.get("metadata") or {}
    spec = template["spec"]
    name = name or pod_name(job, index)
    labels = {**(meta.get("labels") or {}), LABEL_JOB: job.name, LABEL_ATTEMPT: str(attempt)}
    if spare:
        labels[LABEL_ROLE] = "spare"
    else:
        labels[LABEL_INDEX] = str(index)
        if in_place(job):
            labels[LABEL_ROLE] = "worker"
    ours_annotations = (ANNOTATION_NOTICE, ANNOTATION_EXIT, ANNOTATION_SUPERVISOR)
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in ours_annotations}
    # A spare, and in place a pod made to replace a worker (generated name), has no index of its own in its
    # environment (-1): its supervisor runs only what the assignment lists it for (docs/contract.md).
    unassigned = spare or (in_place(job) and name.endswith("-"))
    env = worker_env(job, -1 if unassigned else index, attempt)
    ours = {e["name"] for e in env}
    mount = {"name": PODINFO_VOLUME, "mountPath": NOTICE_DIR, "readOnly": True}
    if in_place(job):
        first = spec["containers"][0]
        first["command"] = [SUPERVISOR, "--", *first.get("command", []), *first.get("args", [])]
        first.pop("args", None)
    for c in spec["containers"]:
        c["env"] = [e for e in (c.get("env") or []) if e.get("name") not in ours] + env
        c["volumeMounts"] = [m for m in (c.get("volumeMounts") or []) if m.get("name") != PODINFO_VOLUME]
        c["volumeMounts"].append(mount)
    spec["volumes"] = [v for v in (spec.get("volumes") or []) if v.get("name") not in (PODINFO_VOLUME, MEMORY_VOLUME)]
    spec["volumes"].append({"name": PODINFO_VOLUME, "downwardAPI": {"items": [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}})
    memory = job.spec.checkpoint.memory
    if memory is not None and memory.enabled:
        first = spec["containers"][0]
        first["volumeMounts"] = [m for m in first["volumeMounts"] if m.get("name") != MEMORY_VOLUME]
        first["volumeMounts"].append({"name": MEMORY_VOLUME, "mountPath": MEMORY_DIR})
        spec["volumes"].append({"name": MEMORY_VOLUME, "emptyDir": {"medium": "Memory",
                                                                    "sizeLimit": memory.size_limit}})
    spec.update(hostname=name, subdomain=job.name, restartPolicy="Never",
                terminationGracePeriodSeconds=job.spec.termination_grace_period_seconds,
                serviceAccountName=worker_service_account(job))
    excluded = sorted(set(exclude_nodes))
    if excluded:
        spec["affinity"] = _exclude_nodes(spec.get("affinity") or {}, excluded)
    metadata: dict[str, Any] = {"namespace": job.namespace, "labels": labels,
                                "ownerReferences": [owner_reference(job)]}
    if name.endswith("-"):
        metadata["generateName"] = name
        spec.pop("hostname", None)  # the API server picks the name; hostname defaults to it
    else:
        metadata["name"] = name
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def build_service(job: TrainingJob) -> dict[str, Any]:
    """Headless Service ``J``: gives every worker the DNS name ``J-<i>.J.NS.svc``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": job.name, "namespace": job.namespace, "labels": job_labels(job),
                     "ownerReferences": [owner_reference(job)]},
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_JOB: job.name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "coordinator", "port": job.spec.coordinator_port,
                       "targetPort": job.spec.coordinator_port, "protocol": "TCP"}],
        },
    }


def worker_role(job: TrainingJob, pod_names: Iterable[str] | None = None) -> dict[str, Any]:
    """The Role ``<job>-worker``: each worker may watch and annotate only the job's pods (``pod_names``, by
    default ``<job>-0 … <job>-(N-1)``), read the job's notice ConfigMap and, in place, its assignment."""
    meta = {"namespace": job.namespace, "labels": job_labels(job), "ownerReferences": [owner_reference(job)]}
    names = sorted(pod_names) if pod_names is not None else [pod_name(job, i) for i in range(job.spec.replicas)]
    # get/list/watch: the runtime watches its own pod (fieldSelector metadata.name) for the notice;
    # patch: process 0 writes its progress annotation, the supervisor its exit reports. resourceNames keeps it
    # to this job's pods.
    rules: list[dict[str, Any]] = [{"apiGroups": [""], "resources": ["pods"], "resourceNames": names,
                                    "verbs": ["get", "list", "watch", "patch"]}]
    # read only: every runtime watches the job's notice object; in place, the supervisors the assignment too
    configmaps = [notice_object_name(job), *([assignment_name(job)] if in_place(job) else [])]
    rules.append({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": sorted(configmaps),
                  "verbs": ["get", "list", "watch"]})
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": f"{job.name}-worker", **meta}, "rules": rules}


def build_identity(job: TrainingJob, pod_names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The workers' identity: a Role + RoleBinding letting each worker watch and annotate only the job's pods,
    bound to the template's own ``serviceAccountName`` (workload identity: GKE, EKS IRSA) or to the
    ServiceAccount ``<job>-worker`` created here (with ``spec.serviceAccount`` annotations and labels)."""
    sa = worker_service_account(job)
    name = f"{job.name}-worker"
    meta = {"namespace": job.namespace, "labels": job_labels(job), "ownerReferences": [owner_reference(job)]}
    objects: list[dict[str, Any]] = []
    if owns_identity(job):
        extra = job.spec.service_account
        sa_meta: dict[str, Any] = {"name": sa, **meta, "labels": {**extra.labels, **job_labels(job)}}
        if extra.annotations:
            sa_meta["annotations"] = dict(extra.annotations)
        objects.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": sa_meta})
    return [
        *objects,
        worker_role(job, pod_names),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name, **meta},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": job.namespace}]},
    ]


def build_assignment(job: TrainingJob, attempt: int, processes: dict[str, int], coordinator: str,
                     memory_peers: dict[int, str | None] | None = None,
                     memory_peer_nodes: dict[int, str] | None = None, resize: str | None = None,
                     loss_every: int | None = None) -> dict[str, Any]:
    """The ConfigMap ``<job>-assignment`` of ``attempt`` (``docs/contract.md``, "In-place restarts"); with
    ``memory_peers`` (the memory tier, ``policy.memorypeers``) its ``memoryPeers``: process index -> the replica
    server holding its copies (a process left out has none: own copies only), and ``memoryPeerNodes``: process
    index -> that server's node, where known. ``numProcesses`` is the processes listed: ``spec.replicas``, fewer
    while an elastic job trains shrunk. ``resize``: ``RESIZE_GROW`` for a grow (key ``resize``: the supervisors
    stop the running trainers with the resize signal, docs/contract.md "Elastic jobs"). ``loss_every``: the job's
    mean seconds between losses without notice so far (key ``lossEverySeconds``, ``policy.memorypeers.loss_every``:
    the memory tier spaces its copies for it)."""
    import json

    data = {"memoryPeers": json.dumps({str(i): a for i, a in sorted(memory_peers.items()) if a is not None},
                                      separators=(",", ":"))} if memory_peers else {}
    if memory_peer_nodes:
        data["memoryPeerNodes"] = json.dumps({str(i): n for i, n in sorted(memory_peer_nodes.items())},
                                             separators=(",", ":"))
    if resize is not None:
        data[ASSIGNMENT_RESIZE_KEY] = resize
    if loss_every is not None:
        data[ASSIGNMENT_LOSS_EVERY_KEY] = str(loss_every)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": assignment_name(job), "namespace": job.namespace, "labels": job_labels(job),
                         "ownerReferences": [owner_reference(job)]},
            "data": {"contract": str(CONTRACT_VERSION), "attempt": str(attempt),
                     "numProcesses": str(len(processes)), "coordinator": coordinator,
                     "processes": json.dumps(dict(sorted(processes.items())), separators=(",", ":")), **data}}
