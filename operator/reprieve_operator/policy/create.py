"""Pure decision: what an API refusal of a worker pod means for the job (``classify_refusal``).

The operator dry-runs the first worker pod of every new attempt (``dryRun=All``, ``fieldValidation=Strict``)
before it creates anything, and classifies what the API server says:

| refusal | kind | the job |
|---|---|---|
| 422 Invalid, 400 BadRequest (a strict-decoding error, a bad quantity) | ``invalid`` | ``Failed/InvalidSpec``, the field named as ``spec.template...`` |
| 403 from admission policy (Pod Security, a webhook) | ``rejected`` | ``Failed/PodRejected`` |
| 403 the named ServiceAccount does not exist | ``waiting`` | ``Pending``, condition ``PodsCreated=False/ServiceAccountNotFound``; starts once it exists |
| 403 exceeded quota | ``transient`` | ``PodsCreated=False/QuotaExceeded``, retried with backoff |
| 403 from RBAC, 404, 409, 429, 5xx, no answer | ``transient`` | ``PodsCreated=False/<reason>``, retried with backoff |

Every kind posts an Event; nothing of a job that cannot start is left behind. The shell's ``create`` answers
with :class:`NotCreated` (the refusal, and what the attempt had made), and what it leads to is an ``Outcome`` like
every other decision (:meth:`NotCreated.instead`): a final refusal ``decide.failed``, then the pods the attempt
made deleted and its Service and identity removed (:func:`left_behind`); any other :func:`refused` (a condition, a
Warning Event, the next try after a backoff).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from ..models import TrainingJob
from . import builders, memorypeers
from .decide import Counter, Outcome, failed
from .events import Event
from .restart import RestartPlan
from .status import with_condition

INVALID, REJECTED, WAITING, TRANSIENT = "invalid", "rejected", "waiting", "transient"
RETRY_BASE_SECONDS, RETRY_MAX_SECONDS = 2.0, 300.0
QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')
_DUPLICATE_FIELD = re.compile(r'duplicate field "([^"]+)"')


@dataclass(frozen=True)
class Refusal:
    kind: str  # INVALID, REJECTED, WAITING or TRANSIENT
    reason: str  # the condition's and the Event's reason
    message: str

    @property
    def final(self) -> bool:
        return self.kind in (INVALID, REJECTED)


@dataclass(frozen=True)
class NotCreated:
    """A create step's answer when it did not create everything (``decide.Answer``): the API server's ``refusal``,
    classified, with the refusals in a row (``tries``, this one included) and the backoff before the next try
    (``wait``), and what this try had made (``made``: pods and the objects of a new gang); or no refusal: the
    backoff after the last one still runs (``wait`` left), nothing was tried."""

    wait: float
    refusal: Refusal | None = None
    tries: int = 0
    made: tuple[Mapping[str, Any], ...] = ()

    def instead(self, out: Outcome, now: datetime) -> Outcome:
        job = out.job
        assert job is not None, "pods to create without a job"
        if self.refusal is None:
            return Outcome(job, replace(out.plan, create=(), requeue_after=self.wait))
        after = refused(job, out.plan, self.refusal, self.tries, self.wait, now)
        if not self.refusal.final:
            return after
        pods = tuple(str(o["metadata"]["name"]) for o in self.made if o.get("kind") == "Pod")
        return replace(after, delete=pods, remove=left_behind(job, self.made))


def owned(job: TrainingJob, token: str) -> list[dict[str, Any]]:
    """The objects a new gang is created with before its pods, in that order (a RoleBinding's escalation check
    needs its Role to exist already): the Service, the worker identity, the memory tier's Secret (``token``)."""
    secret = [builders.build_memory_secret(job, token)] if memorypeers.enabled(job) else []
    return [builders.build_service(job), *builders.build_identity(job), *secret]


def left_behind(job: TrainingJob, made: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    """What a final refusal removes besides the pods, in the order to delete it: what this try made; for a job that
    never started, also an earlier try's Service and identity. Pods of an attempt already running are stopped by
    the Failed phase."""
    objects: Sequence[Mapping[str, Any]] = [o for o in made if o.get("kind") != "Pod"]
    if job.status.attempt == 0:
        objects = owned(job, "")
    return tuple(reversed(objects))


def watched_since(created: Mapping[str, Any], cached: Mapping[str, Any] | None) -> bool:
    """Whether the cache already holds the pod a create call answered with, as the watch delivered it (pure): an
    entry with the same uid came from the pod's own watch events, at or after its creation, so the create's answer
    (the pod as created) must not replace it. The watch may deliver a later event before the call returns: the
    scheduler's ``PodScheduled=False/Unschedulable`` on a replacement no node can take, after which it writes
    nothing more; replaced by the answer, the verdict was lost until the resync's LIST (an elastic job shrank ~18 s
    late, not after ``unschedulableSeconds``). An entry of another uid is an older pod of that name: replaced."""
    uid = (created.get("metadata") or {}).get("uid")
    return cached is not None and uid is not None and (cached.get("metadata") or {}).get("uid") == uid


def retry_seconds(tries: int) -> float:
    """Backoff before try ``tries + 1`` of a refused creation: 2 s doubling to 5 min."""
    return float(min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** max(0, tries - 1)))


def template_path(pod_path: str) -> str:
    """A worker pod's field path as the user wrote it in the TrainingJob (``spec.template...``)."""
    if pod_path.startswith(("spec.", "metadata.")):
        return f"spec.template.{pod_path}"
    return pod_path


def _quantities(spec: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            if not isinstance(c, dict):
                continue
            for part in ("requests", "limits"):
                for name, value in ((c.get("resources") or {}).get(part) or {}).items():
                    yield f"spec.template.spec.{kind}[{i}].resources.{part}.{name}", value
    for name, value in (spec.get("overhead") or {}).items():
        yield f"spec.template.spec.overhead.{name}", value


def bad_quantities(job: TrainingJob) -> list[str]:
    """Template fields holding a resource quantity the API server cannot parse (its error names none)."""
    spec = job.spec.template.get("spec") or {}
    return [f"{path}: {value!r} is not a quantity (e.g. 500m, 2, 4Gi)" for path, value in _quantities(spec)
            if not (isinstance(value, int) or (isinstance(value, str) and QUANTITY_RE.match(value)))]


def _body(body: Any) -> dict[str, Any]:
    if isinstance(body, dict):
        return body
    if isinstance(body, (bytes, str)) and body:
        try:
            parsed = json.loads(body)
            return parsed if isinstance(parsed, dict) else {"message": str(body)}
        except ValueError:
            return {"message": body.decode(errors="replace") if isinstance(body, bytes) else body}
    return {}


def classify_refusal(job: TrainingJob, status: int | None, body: Any, pod: str) -> Refusal:
    """What the refusal of pod ``pod`` (HTTP ``status``, API ``Status`` body; None: no answer) means."""
    who = f"TrainingJob {job.namespace}/{job.name}"
    st = _body(body)
    text = str(st.get("message") or "")[:600]
    if status == 422:
        causes = (st.get("details") or {}).get("causes") or []
        parts = [f"{template_path(str(c.get('field') or ''))}: {c.get('message') or c.get('reason')}"
                 for c in causes if isinstance(c, dict)]
        detail = "; ".join(parts) if parts else text
        return Refusal(INVALID, "InvalidSpec", f"{who}: the API server refuses its worker pods: {detail}"[:1500])
    if status == 400:
        fields = _UNKNOWN_FIELD.findall(text) + _DUPLICATE_FIELD.findall(text)
        if fields:
            detail = "; ".join(f"{template_path(f)}: unknown field (misspelt?)" for f in fields)
        elif "quantities must match" in text or "quantity" in text:
            detail = "; ".join(bad_quantities(job)) or text
        else:
            detail = text
        return Refusal(INVALID, "InvalidSpec", f"{who}: the API server refuses its worker pods: {detail}"[:1500])
    if status == 403:
        low = text.lower()
        if "serviceaccount" in low.replace(" ", "") and "not found" in low:
            sa = (job.spec.template.get("spec") or {}).get("serviceAccountName")
            return Refusal(WAITING, "ServiceAccountNotFound",
                           f"{who}: spec.template.spec.serviceAccountName: ServiceAccount {job.namespace}/{sa} "
                           f"does not exist; create it (or remove the field to get one made per job): the job "
                           f"starts once it exists")
        if "exceeded quota" in low:
            return Refusal(TRANSIENT, "QuotaExceeded", f"{who}: creating {pod}: {text}")
        if "podsecurity" in low or "admission webhook" in low or "denied the request" in low:
            return Refusal(REJECTED, "PodRejected", f"{who}: admission refuses its worker pods: {text}")
        return Refusal(TRANSIENT, "Forbidden",
                       f"{who}: creating {pod} is forbidden (check the operator's RBAC in this namespace): {text}")
    if status == 409:
        return Refusal(TRANSIENT, "NameConflict",
                       f"{who}: a pod named {pod} that is not this job's worker already exists: {text}")
    if status is None:
        return Refusal(TRANSIENT, "ApiError", f"{who}: creating {pod}: no answer from the API server ({text})")
    return Refusal(TRANSIENT, "ApiError", f"{who}: creating {pod}: HTTP {status}: {text}")


def refused(job: TrainingJob, plan: RestartPlan, refusal: Refusal, tries: int, wait: float,
            now: datetime) -> Outcome:
    """The outcome of a refused create (instead of the steps after it): a final refusal fails the job; any other
    sets ``PodsCreated=False`` (a new job is ``Pending``), posts ``FailedCreate`` and tries again in ``wait``
    seconds (``tries``: the refusals in a row, this one included)."""
    if refusal.final:
        out = failed(job.status.model_dump(by_alias=True), refusal.reason, refusal.message, now)
        return replace(out, job=job, plan=replace(plan, phase="Failed", create=()))
    msg = f"{refusal.message}; try {tries}, next in {wait:.0f} s"
    patch: dict[str, Any] = {"conditions": with_condition(job, "PodsCreated", "False", refusal.reason, msg, now)}
    if job.status.phase is None:
        patch["phase"] = "Pending"
    return Outcome(job, replace(plan, create=(), requeue_after=wait), counter=Counter("error", "create"),
                   status=patch, status_events=(Event("FailedCreate", msg, "Warning"),), requeue_after=wait)
