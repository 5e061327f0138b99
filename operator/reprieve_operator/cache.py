"""In-memory indices of worker pods, nodes and jobs: node -> jobs, job -> pods, for O(affected) lookups.

Why not ``kopf.index``: kopf holds every handler back until every indexed object is indexed, and it does so
with one toggle per object, all waiters re-checking all toggles on every change. With 10,000 pods that start-up
is quadratic (minutes of CPU, and every pending event's body held in memory). This cache is primed by one
paginated LIST per kind at start-up (before kopf starts watching) and then kept current by the watch events
the handlers receive anyway. It stores only the few fields the operator reads (``policy.views.compact_pod``), each pod as one JSON text.
"""

from __future__ import annotations

import itertools
import json
import sys
import zlib
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

from . import LABEL_JOB
from .policy.views import VIEW_KEY, GonePod, ViewMemo, compact_pod, gone_pod, last_steps

Key = tuple[str, str]  # (namespace, name)
GONE_PER_JOB = 64  # deleted pods remembered per job (the newest; a job's pod names repeat across attempts)
SAID_PER_JOB = 16  # attempts whose deleted pods' last steps are remembered per job (the newest)


class CachedPod(ViewMemo):
    """One pod in the cache: its compact form (``policy.views.compact_pod``) as JSON text, deflated against a
    dictionary of the text compact pods share (``PACK_DICT``), and ``pod_view``'s parse of it (the ``ViewMemo``).
    A decoded compact pod is a tree of ~6 dicts and a dozen strings, ~2.3 KB; its text ~0.5 KB, deflated ~0.13 KB:
    at 50,000 pods the dicts were ~100 MB of the operator's memory, the deflated texts are ~7 MB. A read inflates
    and decodes a fresh copy (~4 us a pod) that carries this entry as its memo, so a job's reconciles parse each
    pod's annotations once."""

    __slots__ = ("packed",)

    def __init__(self, small: Mapping[str, Any]) -> None:
        super().__init__()
        text = json.dumps({k: v for k, v in small.items() if k != VIEW_KEY}, separators=(",", ":"))
        pack = zlib.compressobj(1, zlib.DEFLATED, -PACK_WINDOW_BITS, 2, zdict=PACK_DICT)
        self.packed = pack.compress(text.encode()) + pack.flush()

    def pod(self) -> dict[str, Any]:
        """A fresh compact pod (the caller may change it; the cache's entry is not)."""
        text = zlib.decompressobj(-PACK_WINDOW_BITS, zdict=PACK_DICT).decompress(self.packed)
        small: dict[str, Any] = json.loads(text)
        small[VIEW_KEY] = self
        return small


# What compact pods' texts share (keys, the labels and annotations the operator sets), most common last; a pod's text
# is deflated against it, in a window that holds it and a pod (in memory only: it may change in any release).
PACK_DICT = (b'{"metadata":{"name":"","namespace":"","uid":"","labels":{"reprieve.dev/role":"spare",'
             b'"reprieve.dev/job-name":"","reprieve.dev/attempt":"","reprieve.dev/replica-index":""},"annotations":'
             b'{"reprieve.dev/notice-watch":"-notice","reprieve.dev/exit":"{\\"attempt\\": ","reprieve.dev/progress":'
             b'""},"creationTimestamp":"2026-"},"spec":{"nodeName":""},"status":{"phase":"Running","podIP":"",'
             b'"containerStatuses":[{"name":"trainer","state":{"running":{"startedAt":"2026-')
PACK_WINDOW_BITS = 11  # 2 KiB


class Cache:
    def __init__(self) -> None:
        self._pods: dict[Key, dict[str, CachedPod]] = defaultdict(dict)  # job -> pod name -> its compact pod
        self._pod_node: dict[Key, str] = {}  # (namespace, pod) -> node
        self._node_jobs: dict[str, dict[Key, int]] = defaultdict(dict)  # node -> job -> pods of it there
        self._pod_job: dict[Key, str] = {}  # (namespace, pod) -> job
        self._gone: dict[Key, dict[str, GonePod]] = defaultdict(dict)  # job -> pod name -> a deleted pod
        self._said: dict[Key, dict[int, tuple[int, float]]] = defaultdict(dict)  # job -> attempt -> last step, when
        self.nodes: dict[str, dict[str, Any]] = {}  # name -> observe.compact_node
        self.jobs = JobBodies()
        self.primed = False
        self._changed: dict[Key, int] = {}  # job -> the sequence number of its pods' last change (``pods_changed``)
        self.pods_seen: str | None = None  # the resourceVersion the pod watch last applied (a fresh LIST's floor)
        self._seq = itertools.count(1)

    # --- pods ---
    def upsert_pod(self, pod: Mapping[str, Any]) -> Key | None:
        """Record a worker pod; returns its job key (None if it is not a worker pod)."""
        if not ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_JOB):
            return None
        small = compact_pod(pod, sys.intern)  # the indices hold its interned strings
        meta = small["metadata"]
        job = meta["labels"][LABEL_JOB]
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        self.delete_pod(pod)
        key = (ns, job)
        if key in self._gone:
            self._gone[key].pop(name, None)
        self._pods[key][name] = CachedPod(small)
        self._changed[key] = next(self._seq)
        self._pod_job[(ns, name)] = job
        node = small["spec"].get("nodeName")
        if node:
            self._pod_node[(ns, name)] = node
            self._node_jobs[node][key] = self._node_jobs[node].get(key, 0) + 1
        return key

    def delete_pod(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        self._forget(str(meta.get("namespace")), str(meta.get("name")))

    def _forget(self, ns: str, name: str) -> None:
        job = self._pod_job.pop((ns, name), None)
        if job is None:
            return
        key = (ns, job)
        self._pods[key].pop(name, None)
        self._changed[key] = next(self._seq)
        if not self._pods[key]:
            del self._pods[key]
            del self._changed[key]
        node = self._pod_node.pop((ns, name), None)
        if node is not None:
            left = self._node_jobs[node].get(key, 0) - 1
            if left > 0:
                self._node_jobs[node][key] = left
            else:
                self._node_jobs[node].pop(key, None)
                if not self._node_jobs[node]:
                    del self._node_jobs[node]

    def pod_gone(self, pod: Mapping[str, Any]) -> None:
        """The watch saw ``pod`` deleted: forget it, and remember where it ran (``gone_of``)."""
        self.delete_pod(pod)
        job = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_JOB)
        if job:
            self._remember_said(str((pod.get("metadata") or {}).get("namespace")), job, pod)
        gone = gone_pod(pod)
        if not job or gone is None:
            return
        ns = str(pod["metadata"].get("namespace"))
        remembered = self._gone[(ns, job)]
        remembered.pop(gone.name, None)
        remembered[gone.name] = gone
        while len(remembered) > GONE_PER_JOB:
            del remembered[next(iter(remembered))]

    def _remember_said(self, namespace: str, job: str, pod: Mapping[str, Any]) -> None:
        """Keep the last steps a deleted pod's processes said (its final state: the kubelet posts the terminated
        containers before it removes the pod), for the goodput accounting (``said_of``)."""
        said = last_steps([pod])
        if not said:
            return
        known = self._said[(namespace, job)]
        for attempt, step, at in said:
            if attempt not in known or (step, at) > known[attempt]:
                known[attempt] = (step, at)
        for attempt in sorted(known)[:-SAID_PER_JOB]:
            del known[attempt]

    def said_of(self, namespace: str, job: str) -> tuple[tuple[int, int, float], ...]:
        """The last steps (attempt, step, when) the job's deleted pods said (``policy.views.last_steps``)."""
        return tuple((a, step, at) for a, (step, at) in sorted(self._said.get((namespace, job), {}).items()))

    def gone_of(self, namespace: str, job: str) -> tuple[GonePod, ...]:
        """The job's pods the watch saw deleted, not since replaced by a pod of the same name (oldest first)."""
        return tuple(self._gone.get((namespace, job), {}).values())

    def relist(self, namespace: str | None = None) -> Relist:
        """A re-list of every pod (of ``namespace``, or all), to be taken in a page at a time (``Relist``)."""
        return Relist(self, namespace)

    def keep_only(self, pods: set[Key], namespace: str | None = None) -> set[Key]:
        """Forget every pod (of ``namespace``, or all) but ``pods`` ((namespace, name)); the jobs that had pods."""
        jobs = {k for k in self._pods if namespace is None or k[0] == namespace}
        for key in [k for k in self._pod_job if (namespace is None or k[0] == namespace) and k not in pods]:
            self._forget(*key)
        return jobs

    def pods_changed(self, namespace: str, job: str) -> int | None:
        """A mark of the job's pods' last change in the cache (a watch event, this operator's own write, a LIST):
        equal marks before and after an awaited LIST mean nothing changed them meanwhile (None: no pods)."""
        return self._changed.get((namespace, job))

    def replace_job_pods(self, namespace: str, job: str, pods: list[dict[str, Any]]) -> None:
        """Make the job's pods exactly ``pods`` (from a LIST)."""
        for old in list(self._pods.get((namespace, job), {})):
            self._forget(namespace, old)
        for p in pods:
            self.upsert_pod(p)

    def pods_of(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The job's compact pods (``policy.views.compact_pod``), each a fresh copy whose ``pod_view`` parse the
        cache keeps for as long as the pod is unchanged."""
        return [entry.pod() for entry in self._pods.get((namespace, job), {}).values()]

    def jobs_on(self, node: str) -> list[Key]:
        return sorted(self._node_jobs.get(node, {}))

    # --- nodes (written by ``NodeSignals``, which keeps their signals' bookkeeping beside them) ---
    def put_node(self, node: dict[str, Any]) -> bool:
        """Record a compact Node (``policy.views.compact_node``); True if it differs from what was cached."""
        name = node["metadata"]["name"]
        if self.nodes.get(name) == node:
            return False
        self.nodes[name] = node
        return True

    def drop_node(self, name: str) -> None:
        self.nodes.pop(name, None)

    # --- jobs ---
    def upsert_job(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        self.jobs.put(key, {
            "metadata": {"name": key[1], "namespace": key[0], "uid": meta.get("uid"),
                         "generation": meta.get("generation")},
            "spec": dict(body.get("spec") or {}), "status": dict(body.get("status") or {})})

    def merge_job_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """A status patch this operator just wrote: deliveries before its watch event must see it."""
        body = self.jobs.get((namespace, name))
        if body is not None:
            body["status"] = {**(body.get("status") or {}), **patch}
            self.jobs.put((namespace, name), body)

    def delete_job(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        self.jobs.drop(key)
        self._gone.pop(key, None)
        self._said.pop(key, None)

    def mark_primed(self) -> None:
        """Every kind was listed once: from now on the cache is read instead of the API."""
        self.primed = True

    def unfinished_jobs(self) -> list[Key]:
        return sorted(k for k in self.jobs if self.jobs.phase(k) not in ("Succeeded", "Failed"))

    def stats(self) -> dict[str, int]:
        return {"pods": len(self._pod_job), "jobs": len(self.jobs), "nodes": len(self.nodes)}


class Relist:
    """A re-list of the pods after the watch's resourceVersion expired (410), taken into the cache a LIST page at a
    time, as the priming is: :meth:`page` replaces each listed pod's entry, :meth:`end` forgets the pods of the scope
    that no page listed. Never a compact copy of every pod beside the cache's own (that doubled the memory at the
    relist). Between pages each pod is at its cached or its listed state and none is missing that still exists;
    the jobs are kicked once, at the end. Constructed anywhere; ``page`` and ``end`` run where the cache is written
    (the event loop)."""

    def __init__(self, cache: Cache, namespace: str | None) -> None:
        self.cache, self.namespace = cache, namespace
        self._listed: set[Key] = set()  # (namespace, pod): the cache's interned strings, a tuple each

    def page(self, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            if self.cache.upsert_pod(pod) is not None:
                meta = pod["metadata"]
                self._listed.add((sys.intern(str(meta.get("namespace"))), sys.intern(str(meta.get("name")))))

    def end(self) -> set[Key]:
        """Forget the scope's pods no page listed; the jobs that had or have pods (each to be reconciled)."""
        jobs = self.cache.keep_only(self._listed, self.namespace)
        self._listed.clear()
        return jobs


class JobBodies:
    """The jobs' bodies as the watch last gave them (metadata's name, namespace, uid and generation; spec; status),
    each kept as one JSON string: a decoded body is a tree of small objects several times its text's size, and
    2,500 of them were tens of MB of the operator's memory. ``get`` decodes a fresh copy (a caller may change it);
    the phase is kept apart for the resync's scan."""

    def __init__(self) -> None:
        self._text: dict[Key, str] = {}
        self._phase: dict[Key, str | None] = {}

    def put(self, key: Key, body: Mapping[str, Any]) -> None:
        self._text[key] = json.dumps(body, separators=(",", ":"))
        self._phase[key] = (body.get("status") or {}).get("phase")

    def get(self, key: Key) -> dict[str, Any] | None:
        text = self._text.get(key)
        return None if text is None else json.loads(text)

    def __getitem__(self, key: Key) -> dict[str, Any]:
        return json.loads(self._text[key])

    def drop(self, key: Key) -> None:
        self._phase.pop(key, None)
        self._text.pop(key, None)

    def phase(self, key: Key) -> str | None:
        return self._phase.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._text

    def __iter__(self) -> Iterator[Key]:
        return iter(list(self._text))

    def __len__(self) -> int:
        return len(self._text)
