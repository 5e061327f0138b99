"""The in-place gang lifecycle as one pure decision: ``decide_inplace(job, pods, assignment, ...) -> RestartPlan``.

With ``restartMode: InPlace`` each worker container runs ``reprieve-supervisor`` (the runtime's supervisor), which
starts one trainer process per attempt and reports every exit on its pod (``docs/contract.md``). The
attempt's workers are the pods the job's assignment (``<job>-assignment`` ConfigMap) lists. The gang rules are
those of ``policy.restart`` (``classify``, ``gang_restart``: causes, budgets, rapid-restart backoff); what
differs is what a restart does:

* a worker whose pod is alive on a healthy node is **kept**: the next assignment lists it again and its
  supervisor starts the next attempt's process in the same pod (a trainer still running is stopped by it);
* a worker whose pod is lost, deleted, failed as a container, on a node with an open notice for the job or
  not Ready, or that its peers report silent (named in their exit reports, none of its own) is **replaced**: by a ready spare on a healthy node if there is one (the spare takes its index; warm ones first,
  then the oldest), else by a spare still starting there (it was made before any new pod could be), else by a
  new pod (``<job>-<index>-<random>``); the old pod is deleted;
* the next assignment is written once every listed pod runs and has an IP (the coordinator is process 0's pod
  IP), so every trainer of the attempt starts together; a spare never waits for scheduling or a pull;
* ``spec.spares`` spares are kept running on healthy nodes: a used one, one on a doomed or lost node, or one
  that ended, is replaced in the background. Spares never count as workers. While notices doom more workers
  than there are spares, one more is made for each (ahead of the restart, so each moved worker starts warm;
  not under Kueue); those beyond ``spec.spares`` go once no notice is open (:func:`spares_wanted`).

Hung stragglers: once a worker reported the restart code, the others have the pod's grace period to report
theirs; then the gang restarts anyway and the supervisors stop what still runs.

Elastic jobs (``spec.elastic``, ``policy.elastic``): a restart whose replacement the scheduler refused for
``unschedulableSeconds`` starts the next attempt on the survivors instead (``Resize`` Shrink: the smaller process
map, ids renumbered contiguously), keeping the replacement pending as a capacity probe and the survivors a size
leaves out as standbys; below the minimum it waits as today, condition ``Degraded`` saying why. While training
shrunk, ready probes, standbys and spares grow the job at the next pass (``Resize`` Grow: an in-place restart with
the newcomers after the workers' ids).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from .. import CONTRACT_VERSION, RESIZE_GROW, SUPERVISOR
from ..models import TrainingJob
from . import elastic, memorypeers
from .podsready import SchedulerVerdict
from .restart import (
    DISRUPTION,
    FAILURE,
    PEER_LOST_WAIT_SECONDS,
    PREEMPTION,
    TERMINAL_PHASES,
    Condition,
    RestartPlan,
    Verdict,
    WorkerPod,
    classify,
    finished_or_suspended,
    gang_restart,
    waiting,
)
from .times import parse_time, rfc3339
from .views import PodView, worker_view

# PodView and worker_view are views' (an in-place job's pod as the policy sees it); re-exported for the callers here
__all__ = ["Assignment", "InPlace", "PodView", "Replacement", "decide_inplace", "worker_view"]


@dataclass(frozen=True)
class Assignment:
    attempt: int
    processes: Mapping[str, int]  # pod name -> process index
    coordinator: str = ""
    memory_peers: Mapping[int, str | None] = field(default_factory=dict)  # memory tier: index -> replica holder
    memory_peer_nodes: Mapping[int, str] = field(default_factory=dict)  # memory tier: index -> the holder's node
    resize: str | None = None  # RESIZE_GROW: this attempt grows the gang that trains (its trainers save
    # the agreed step to the memory tier and exit; docs/contract.md, "Elastic jobs")
    loss_every: int | None = None  # memory tier: the job's mean seconds between losses without notice so far


@dataclass(frozen=True)
class Replacement:
    index: int
    old: str | None  # the pod it replaces (None: it had none)
    new: str | None  # the pod taking the index (None: a pod still to be created)
    reason: str


@dataclass(frozen=True)
class InPlace:
    """What ``decide_inplace`` adds to a ``RestartPlan``."""

    assign: Assignment | None = None  # the assignment to write now
    create_workers: tuple[int, ...] = ()  # replacement pods to create (by index), generated names
    create_spares: int = 0
    kept: tuple[str, ...] = ()
    replaced: tuple[Replacement, ...] = ()
    waiting_for: tuple[str, ...] = field(default_factory=tuple)  # pods the next assignment waits for
    record: RestartPlan | None = None  # a decided restart or failure: record it before deleting anything
    resize: elastic.Resize | None = None  # elastic: ``assign`` is this size change (status, its Event)


def decide_inplace(job: TrainingJob, pods: Sequence[PodView], assignment: Assignment | None,
                   avoid_nodes: Iterable[str] = (), now: datetime | None = None,
                   doomed_nodes: Collection[str] = (), held: Condition | None = None,
                   peer_lost_wait_s: float = PEER_LOST_WAIT_SECONDS,
                   gone: Mapping[str, str] | None = None,
                   stuck: Mapping[str, SchedulerVerdict] | None = None,
                   ahead: bool = True) -> tuple[RestartPlan, InPlace]:
    """Decide the next step of an in-place ``job`` from its pods and its current assignment
    (``peer_lost_wait_s``: ``policy.restart.decide_restart``'s; ``gone``: pod name -> node of pods seen deleted;
    ``stuck``: pod name -> the scheduler's ``PodScheduled=False/Unschedulable``, what an elastic job shrinks on;
    ``ahead``: spares may be made ahead of a notice's restart, :func:`spares_wanted`).

    When a restart (or the final failure) is decided, ``InPlace.record`` is the plan to record in status
    before anything is deleted (crash safety); the returned plan is what to do and the status to reach."""
    st, spec = job.status, job.spec
    spare_names = tuple(sorted(p.name for p in pods if p.role == "spare" and not p.deleting))
    settled = finished_or_suspended(job, st.attempt, pods, after_success=spare_names, held=held)  # no spare outlives success
    if settled is not None:
        return settled, InPlace()
    code = spec.restart_policy.restart_exit_code
    avoid = tuple(avoid_nodes)
    alive = tuple(sorted(p.name for p in pods if not p.deleting))
    by_name = {p.name: p for p in pods}
    refusal = _cannot_run(pods)
    if refusal is not None:
        reason, msg = refusal
        failed = RestartPlan(phase="Failed", attempt=st.attempt, delete=alive, cause=FAILURE, message=msg,
                             conditions=(Condition("Failed", "True", reason, msg),))
        return failed, InPlace()

    fresh_start = st.attempt == 0 and all(p.attempt <= 1 for p in pods)
    if assignment is None or st.phase == "Suspended":
        if not fresh_start and pods:  # resumed, or the assignment vanished mid-job: a fresh gang once all are gone
            return RestartPlan(phase="Pending", attempt=st.attempt, delete=alive,
                               message=f"waiting for {len(pods)} old pod(s) to be deleted"), InPlace()
        attempt = st.attempt + 1 if not fresh_start else 1
        if st.phase == "Suspended" and assignment is not None:
            attempt = max(attempt, assignment.attempt + 1)
        names = {f"{job.name}-{i}": i for i in range(spec.replicas)}
        create = tuple(i for n, i in names.items() if n not in by_name)
        coordinator = f"{job.name}-0.{job.name}.{job.namespace}.svc:{spec.coordinator_port}"
        conds: tuple[Condition, ...] = ()
        if st.phase == "Suspended":
            conds = (Condition("Suspended", "False", "Resumed", "spec.suspend is false"),)
        spares = sum(1 for p in pods if p.role == "spare" and not p.deleting)
        return RestartPlan(phase="Pending", attempt=attempt, create=create, new_attempt=True, exclude_nodes=avoid,
                           conditions=conds, message=f"creating attempt {attempt}"), \
            InPlace(assign=Assignment(attempt, names, coordinator, memorypeers.first_peers(job)),
                    create_spares=max(0, spec.spares - spares))

    attempt = assignment.attempt
    workers = dict(assignment.processes)
    current: dict[int, WorkerPod] = {}
    missing: list[int] = []
    for name, index in workers.items():
        view = by_name.get(name)
        if view is None:
            missing.append(index)
        else:
            current[index] = worker_view(view, attempt, index, code)
    recorded = st.attempt >= attempt
    noticed = (st.last_notice is not None and st.last_notice.attempt == attempt) or \
        any(w.noticed for w in current.values())
    if st.restarting_from is not None and st.restarting_from >= attempt:
        return _next_attempt(job, pods, workers, attempt, avoid, doomed_nodes, now, assignment, stuck or {})

    ran_on = {i: (gone or {})[n] for n, i in workers.items() if i in missing and n in (gone or {})}
    verdict = classify(job, current, missing, recorded, noticed, doomed_nodes, now, peer_lost_wait_s, ran_on)
    if verdict.cause is None and not verdict.succeeded and not verdict.waiting:
        verdict = stragglers(job, [by_name[n] for n in workers if n in by_name], attempt, now) or verdict
    if verdict.succeeded:
        spare_names = tuple(sorted(p.name for p in pods if p.role == "spare" and not p.deleting))
        return RestartPlan(phase="Succeeded", attempt=attempt, delete=spare_names,
                           conditions=(Condition("Complete", "True", "AllWorkersSucceeded",
                                                 f"all {spec.replicas} workers exited 0"),)), InPlace()
    if verdict.cause is None:
        plan, extra = _steady(job, pods, workers, current, attempt, noticed, avoid, doomed_nodes, ahead)
        conds, requeue = waiting(verdict)
        plan = replace(plan, conditions=(*plan.conditions, *conds), requeue_after=requeue, probe=verdict.probe)
        if verdict.waiting or noticed or now is None:
            return plan, extra
        return _elastic_steady(job, pods, workers, attempt, plan, extra, doomed_nodes, now, assignment, stuck or {})
    record = gang_restart(job, attempt, verdict, now, stragglers=alive, teardown=())
    if record.phase == "Failed":
        return record, InPlace()
    counts = st.restarts  # with this restart's cause, as status will count it (the memory tier's loss rate)
    if record.cause:
        counts = counts.model_copy(update={record.cause: getattr(counts, record.cause) + 1})
    restarting = job.model_copy(update={"status": st.model_copy(update={
        "restarting_from": attempt, "next_attempt_time": _rfc(record.next_attempt_time), "restarts": counts})})
    plan, extra = _next_attempt(restarting, pods, workers, attempt, avoid, doomed_nodes, now, assignment,
                                stuck or {})
    return plan, replace(extra, record=record)


def _cannot_run(pods: Sequence[PodView]) -> tuple[str, str] | None:
    """A pod whose supervisor can never run this job, so no restart helps: (condition reason, message), or None.
    A supervisor of another contract version, or an image without ``reprieve-supervisor`` (the kubelet's StartError)."""
    for p in pods:
        if p.contract is not None and p.contract != CONTRACT_VERSION:
            return "ContractMismatch", (
                f"the supervisor in pod {p.name} speaks contract version {p.contract}, this operator "
                f"{CONTRACT_VERSION}: the image's reprieve runtime and the operator must match (upgrade one of "
                f"them, or set restartMode: Recreate)")
    for p in pods:
        if p.start_error and SUPERVISOR in p.start_error:
            return "SupervisorNotFound", (
                f"pod {p.name} could not start {SUPERVISOR} ({p.start_error}): restartMode InPlace runs the "
                f"container's command under {SUPERVISOR}, from the reprieve runtime package; install it in the "
                f"image (pip install reprieve; a runtime from before 0.2 names it reprieve-run: rebuild the image "
                f"with this one), or set restartMode: Recreate")
    return None


def stragglers(job: TrainingJob, workers: Sequence[PodView], attempt: int, now: datetime | None) -> Verdict | None:
    """Some workers reported the restart code (or 0) for ``attempt`` and the others have not within the pod's
    grace period since the first report: restart anyway (their supervisors stop what still runs)."""
    code = job.spec.restart_policy.restart_exit_code
    reports = [p for p in workers if p.exit_attempt == attempt and p.exit_code is not None]
    if not reports or now is None or len(reports) == len(workers) or any(p.exit_code not in (0, code)
                                                                          for p in reports):
        return None
    first = min((p.exit_time for p in reports if p.exit_time is not None), default=None)
    grace = job.spec.termination_grace_period_seconds
    if first is None or (now - first).total_seconds() <= grace:
        return None
    late = sorted(p.name for p in workers if p.exit_attempt != attempt)
    return Verdict(PREEMPTION, f"{len(reports)} worker(s) exited with the restart code; {', '.join(late[:5])} did "
                               f"not within {grace} s (stopped by their supervisors)")


def silent_processes(pods: Sequence[PodView], workers: Mapping[str, int], attempt: int) -> set[int]:
    """Process indices of ``attempt`` that other workers' exit reports name as lost and that reported no exit of
    their own (a process that reported one is alive enough to restart in its pod)."""
    named = {i for p in pods if p.name in workers and p.exit_attempt == attempt for i in p.exit_peer_lost}
    reported = {workers[p.name] for p in pods if p.name in workers and p.exit_attempt == attempt}
    return named - reported


def _rfc(t: datetime | None) -> str | None:
    return rfc3339(t) if t is not None else None


def _healthy(p: PodView, doomed: Collection[str]) -> bool:
    return p.ready and (p.node is None or p.node not in doomed)


def _spare_gone(p: PodView, doomed: Collection[str]) -> bool:
    """A spare to delete and replace: its node is lost or doomed, or it ended (its supervisor failed)."""
    return p.node_lost or bool(p.node and p.node in doomed) or p.phase in TERMINAL_PHASES


def _spare_rank(p: PodView) -> tuple[bool, datetime, str]:
    """Which ready spare takes an index first: one whose supervisor announced itself (warm), then the oldest.

    The order must not change between passes of one restart: the spare chosen while a replacement pod is still
    scheduled must still be chosen once it runs, not a spare created in the meantime that sorts before it."""
    return (p.contract is None, p.created or datetime.max.replace(tzinfo=UTC), p.name)


def _steady(job: TrainingJob, pods: Sequence[PodView], workers: Mapping[str, int], current: Mapping[int, WorkerPod],
            attempt: int, noticed: bool, avoid: tuple[str, ...], doomed: Collection[str],
            ahead: bool = True) -> tuple[RestartPlan, InPlace]:
    """Training: report readiness, keep the healthy spares :func:`spares_wanted` says (replace those on doomed
    nodes, delete those beyond it once no notice is open)."""
    # Pods the kubelet runs, not the restart view's "alive" (worker_view counts a Pending pod as running): a gang
    # whose pod waits for its image or a node is Pending, as in Recreate mode (condition PodsReady says why).
    running = sum(1 for p in pods if p.name in workers and p.phase == "Running" and not p.deleting
                  and current[workers[p.name]].phase == "Running")
    # A worker that already exited 0 while the others finish their last steps is done, not waiting: the job is
    # still Running (it was reported Pending for the second between the first and the last worker's exit).
    done = sum(1 for w in current.values() if w.phase == "Succeeded")
    phase = "Preempting" if noticed else ("Running" if running and running + done == len(workers) else "Pending")
    spares = [p for p in pods if p.role == "spare" and p.name not in workers and not p.deleting]
    doomed_spares = tuple(sorted(p.name for p in spares if _spare_gone(p, doomed)))
    # in the order a restart takes them: beyond what is wanted (a notice withdrawn before its restart used the
    # spares made ahead, spec.spares lowered), the last go, so a warm one is kept before a starting one
    kept = sorted((p for p in spares if p.name not in doomed_spares), key=_spare_rank)
    wanted = spares_wanted(job.spec.spares, pods, workers, doomed, ahead and job.spec.elastic is None)
    excess = tuple(sorted(p.name for p in kept[wanted:])) if not noticed else ()
    # Pods that are neither workers of this attempt nor spares: an earlier attempt's, or a replacement that a
    # crash left behind. They go; but an elastic job training shrunk keeps its capacity probes and standbys.
    probes = {c.pod for c in elastic.pod_candidates(pods, workers, attempt, doomed, {})} \
        if job.spec.elastic is not None and len(workers) < job.spec.replicas else set()
    strays = tuple(sorted(p.name for p in pods if p.name not in workers and p.role != "spare" and not p.deleting
                          and p.name not in probes))
    return RestartPlan(phase=phase, attempt=attempt, delete=doomed_spares + excess + strays, ready=running,
                       exclude_nodes=avoid, replicas=len(current)), \
        InPlace(create_spares=max(0, wanted - len(kept)))


def spares_wanted(spares: int, pods: Sequence[PodView], workers: Mapping[str, int], doomed: Collection[str],
                  ahead: bool) -> int:
    """How many spares a training job keeps (pure): ``spec.spares``; and while notices doom more of its workers
    than that, one for each of them (``ahead``), made when the notice comes so that every worker the restart moves
    finds a spare whose warm process has parked (a few seconds from its pod's creation; a notice gives 15 s or
    more, and the job trains on until its final save), not a pod created at the restart that starts cold. A
    spare made ahead takes the place of a pod that is going: the job holds one more pod for the notice's window
    at most. ``ahead`` is False (the caller's) for a job Kueue admits, whose Workload's spares pod set reserves
    ``spec.spares``, and for an elastic job for now (a spare made ahead that cannot schedule would be waited for as
    a starting spare, where the shrink counts on a refused replacement)."""
    if not ahead:
        return spares
    moving = sum(1 for p in pods if p.name in workers and not p.deleting and p.node is not None and p.node in doomed)
    return max(spares, moving)


def _next_attempt(job: TrainingJob, pods: Sequence[PodView], workers: Mapping[str, int], attempt: int,
                  avoid: tuple[str, ...], doomed: Collection[str], now: datetime | None,
                  previous: Assignment | None = None,
                  stuck: Mapping[str, SchedulerVerdict] | None = None) -> tuple[RestartPlan, InPlace]:
    """Restarting from ``attempt``: keep, replace, and once every listed pod is ready, assign ``attempt + 1``
    (``previous``: the current assignment, whose memory-tier pairings are kept where still valid). An elastic job
    whose replacement the scheduler refused long enough assigns ``attempt + 1`` on the survivors instead."""
    st, spec = job.status, job.spec
    by_name = {p.name: p for p in pods}
    nxt = attempt + 1
    kept: dict[int, str] = {}
    replaced: list[Replacement] = []
    delete: list[str] = []
    silent = silent_processes(pods, workers, attempt)
    for name, index in sorted(workers.items(), key=lambda kv: kv[1]):
        p = by_name.get(name)
        if p is not None and _healthy(p, doomed) and p.phase == "Running" and p.node_ready and p.reachable \
                and index not in silent:
            kept[index] = name
            continue
        if p is None:
            reason = "its pod is gone"
        elif p.node_lost:
            reason = f"its node {p.node} is lost"
        elif p.node and p.node in doomed:
            reason = f"its node {p.node} is doomed"
        elif not p.node_ready:
            reason = f"its node {p.node} is not Ready"
        elif not p.reachable:
            reason = "its pod does not answer on the network (cut off)"
        elif index in silent:
            reason = f"its peers lost it (process {index} went silent)"
        elif p.deleting:
            reason = "its pod was deleted"
        else:
            reason = f"its pod is {p.phase}"
        replaced.append(Replacement(index, name if p is not None else None, None, reason))
        if p is not None and not p.deleting:
            delete.append(name)
    # Pods already made for the next attempt (an earlier pass created them), then ready spares, then spares
    # still starting (made before any new pod could be, so they run sooner: a used spare's replacement that
    # is still pulling when the next notice comes), and only then a new pod.
    made = {p.index: p.name for p in pods if p.role == "worker" and p.attempt == nxt and p.index is not None
            and p.name not in workers and not p.deleting and not p.node_lost}
    spares = sorted((p for p in pods if p.role == "spare" and p.name not in workers and _healthy(p, doomed)),
                    key=_spare_rank)
    if spec.elastic is not None:  # a shrunk job's probes and standbys that run now: warm, like spares
        spares += sorted((p for p in pods if p.role == "worker" and p.name not in workers and _healthy(p, doomed)
                          and p.name not in made.values()), key=_spare_rank)
    starting = sorted((p for p in pods if p.role == "spare" and p.name not in workers and not p.ready
                       and p.phase in ("Pending", "Running") and not p.deleting and not _spare_gone(p, doomed)),
                      key=_spare_rank)
    create: list[int] = []
    filled: list[Replacement] = []
    refused = stuck or {}
    for r in replaced:
        # a pod made for the index comes first, unless the scheduler refuses it and a warm pod runs now (an
        # elastic job's: ``stuck`` is empty otherwise): the refused pod then stays behind as the capacity probe
        if r.index in made and not (made[r.index] in refused and spares):
            filled.append(replace(r, new=made[r.index]))
        elif spares:
            spare = spares.pop(0)
            kind = "spare" if spare.role == "spare" else "standby"
            filled.append(replace(r, new=spare.name, reason=f"{r.reason}: {kind} {spare.name} takes over"))
        elif starting:
            spare = starting.pop(0)
            filled.append(replace(r, new=spare.name, reason=f"{r.reason}: spare {spare.name} takes over once it "
                                                            f"runs"))
        else:
            create.append(r.index)
            filled.append(r)
    processes = {**{n: i for i, n in kept.items()}, **{r.new: r.index for r in filled if r.new}}
    waiting = tuple(sorted(n for n in processes if not by_name[n].ready))
    due = parse_time(st.next_attempt_time)
    backing_off = due is not None and now is not None and now < due
    shrink, held, look = _shrink(job, pods, workers, kept, attempt, doomed, now, stuck or {}) \
        if (create or waiting) and not backing_off else (None, None, None)
    if shrink is not None:  # the probes stay pending, no pod is made for the other lost ids
        processes = {**{kept[old]: new for old, new in shrink.keep}, **dict(shrink.join)}
        create, waiting = [], ()
        filled = [replace(r, new=None, reason=f"{r.reason}: not replaced, the job shrinks to {shrink.size} "
                                               f"worker(s)") for r in filled]
        kept = {i: n for i, n in kept.items() if n in processes}
    used_spares = {n for n in processes if by_name[n].role == "spare"}
    spare_pods = [p for p in pods if p.role == "spare" and p.name not in workers and p.name not in used_spares
                  and not p.deleting]
    doomed_spares = [p.name for p in spare_pods if _spare_gone(p, doomed)]
    delete += doomed_spares
    create_spares = max(0, spec.spares - (len(spare_pods) - len(doomed_spares)))
    extra = InPlace(create_workers=tuple(create), create_spares=create_spares, kept=tuple(sorted(kept.values())),
                    replaced=tuple(filled), waiting_for=waiting, resize=shrink)
    if create or waiting or backing_off:
        why = (f"backing off until {st.next_attempt_time}" if backing_off else
               f"waiting for {len(create) + len(waiting)} pod(s) to run before attempt {nxt}")
        return RestartPlan(phase="Restarting", attempt=attempt, delete=tuple(sorted(delete)),
                           restarting_from=attempt, exclude_nodes=avoid, message=why,
                           conditions=(held,) if held is not None else (),
                           requeue_after=(due - now).total_seconds() if backing_off and due and now else look,
                           next_attempt_time=due if backing_off else None), extra
    coordinator_pod = next(n for n, i in processes.items() if i == 0)
    holders = [by_name[n] for n in processes] + [p for p in spare_pods if p.ready and p.name not in doomed_spares]
    peers = memorypeers.memory_peers(job, processes, holders, previous.memory_peers if previous else None)
    assign = Assignment(nxt, processes, f"{by_name[coordinator_pod].ip}:{spec.coordinator_port}", peers,
                        memorypeers.peer_nodes(job, peers, holders), loss_every=memorypeers.loss_every(job))
    summary = _summary(nxt, extra)
    resized = (shrink.condition,) if shrink is not None else ()
    return RestartPlan(phase="Running", attempt=nxt, delete=tuple(sorted(delete)), new_attempt=True,
                       ready=len(processes), replicas=len(processes), message=summary,
                       conditions=(Condition("Restarting", "False", "AttemptStarted", summary), *resized)), \
        replace(extra, assign=assign)


def _shrink(job: TrainingJob, pods: Sequence[PodView], workers: Mapping[str, int], kept: Mapping[int, str],
            attempt: int, doomed: Collection[str], now: datetime | None, stuck: Mapping[str, SchedulerVerdict]
            ) -> tuple[elastic.Resize | None, Condition | None, float | None]:
    """An elastic job's restart that waits for pods: (the shrink to start now, or the ``Degraded`` condition of a
    wait below the minimum, and when to look again: a replacement reaching ``unschedulableSeconds``)."""
    view = elastic.elastic_view(job, kept, elastic.pod_candidates(pods, workers, attempt, doomed, stuck), now,
                                size=len(workers)) if now is not None else None
    if view is None:
        return None, None, None
    decision = elastic.decide_resize(view)
    if isinstance(decision, elastic.Wait):
        return None, decision.condition, elastic.next_look(view)
    return decision, None, elastic.next_look(view)


def _elastic_steady(job: TrainingJob, pods: Sequence[PodView], workers: Mapping[str, int], attempt: int,
                    plan: RestartPlan, extra: InPlace, doomed: Collection[str], now: datetime,
                    previous: Assignment, stuck: Mapping[str, SchedulerVerdict]) -> tuple[RestartPlan, InPlace]:
    """An elastic job training: grow when ready pods fill a larger allowed size (an in-place restart of every
    worker with the newcomers), else clear a ``Degraded`` that no longer holds and look again when the resize
    interval ends."""
    view = elastic.elastic_view(job, workers.values(), elastic.pod_candidates(pods, workers, attempt, doomed, stuck),
                                now, resizing=plan.phase != "Running", size=len(workers))
    if view is None:
        return plan, extra
    grow = elastic.decide_resize(view)
    if not isinstance(grow, elastic.Resize):
        current = next((c for c in job.status.conditions if c.type == elastic.DEGRADED), None)
        cleared = elastic.settled(view, Condition(current.type, current.status, current.reason, current.message)
                                  if current is not None else None)
        look = elastic.next_look(view)
        requeue = look if plan.requeue_after is None or (look is not None and look < plan.requeue_after) \
            else plan.requeue_after
        return replace(plan, conditions=(*plan.conditions, *((cleared,) if cleared else ())),
                       requeue_after=requeue), extra
    by_name = {p.name: p for p in pods}
    processes = {**workers, **dict(grow.join)}
    nxt = attempt + 1
    coordinator = next(n for n, i in processes.items() if i == 0)
    spares = [p for p in pods if p.role == "spare" and p.name not in processes and not p.deleting]
    holders = [by_name[n] for n in processes] + [p for p in spares if p.ready]
    peers = memorypeers.memory_peers(job, processes, holders, previous.memory_peers)
    assign = Assignment(nxt, processes, f"{by_name[coordinator].ip}:{job.spec.coordinator_port}", peers,
                        memorypeers.peer_nodes(job, peers, holders), resize=RESIZE_GROW,
                        loss_every=memorypeers.loss_every(job))
    summary = f"attempt {nxt}: {len(workers)} worker(s) restarted in place; {grow.event.message}"
    return RestartPlan(phase="Running", attempt=nxt, delete=plan.delete, new_attempt=True, ready=len(processes),
                       replicas=len(processes), message=summary, exclude_nodes=plan.exclude_nodes,
                       conditions=(Condition("Restarting", "False", "AttemptStarted", summary), grow.condition)), \
        InPlace(assign=assign, create_spares=extra.create_spares + sum(by_name[n].role == "spare" for n, _ in grow.join),
                kept=tuple(sorted(workers)), resize=grow)


def _summary(attempt: int, extra: InPlace) -> str:
    parts = [f"attempt {attempt}: {len(extra.kept)} worker(s) restarted in place"]
    for r in extra.replaced:
        parts.append(f"worker {r.index} replaced ({r.reason}" + (f"; now pod {r.new})" if r.new else ")"))
    return "; ".join(parts)


# Re-exported for the shell and the tests: the causes it may record.
CAUSES = (PREEMPTION, FAILURE, DISRUPTION)
