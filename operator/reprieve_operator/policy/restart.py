"""The gang lifecycle as one pure decision: ``decide_restart(job, pods) -> RestartPlan``.

Rules (see ``docs/operator.md``):

* all workers exit 0 -> Succeeded; all exit 0 or the restart code, at least one the restart code -> gang
  restart counted as ``preemption``;
* any worker fails (another exit code) -> gang restart counted as ``failure``; past
  ``restartPolicy.maxFailures`` -> Failed; ``restartPolicy.exitCodeRules`` (first match wins) may count a code
  as a ``disruption`` instead (``Ignore``) or fail the job at once (``FailJob``); with several failing workers
  the earliest exit decides (the others most likely ended because of it), exits of the same second (or of
  unknown time) by the strictest action (FailJob, then Count, then Ignore);
* a worker deleted, evicted or lost with its node -> gang restart counted as ``preemption`` if a notice was
  delivered in this attempt (in status, on a pod, or open on the lost pod's node: an eviction by a NoExecute
  taint can race the status write, and the pod can be gone before a decision sees it: the node it ran on
  decides), else ``disruption``; both are capped only by ``maxPreemptionRestarts``;
* a worker that exited because it *lost a peer* (its report names the silent processes: JAX's coordination
  service ended it, SIGABRT/134) is no failure of its own: with a lost worker in the attempt (its pod or node
  lost, or a silent peer on a NotReady node) the restart is that loss's (``disruption``/``preemption``); with
  every worker ended and none lost it is a ``failure`` (a deterministic abort still meets ``maxFailures``),
  unless two workers named each other (both were alive and lost contact: a network partition, a ``disruption``);
  otherwise the decision waits for the lost peer to show, at most ``peer_lost_wait_s`` from the first such
  exit (condition ``Restarting=Unknown/WaitingForLostPeer``), then counts a ``failure``. While it waits, the
  shell probes the silent peers' pods (``RestartPlan.probe``: a TCP connect to the pod's address; refused or
  accepted is an answer): a silent peer whose pod does not answer is cut off from the network, and lost
  (``disruption``) at once, as one on a node that is not Ready;
* a *rapid* restart -- every worker exited with the restart code within ``RAPID_SECONDS`` of the attempt's
  start, without a notice or a lost pod: too fast to be a real preemption (the code is probably used for
  something else) -- waits a backoff (10 s doubling to 5 min) before the next attempt; more than
  ``restartPolicy.maxRapidRestarts`` in a row fail the job (``TooManyRapidRestarts``);
* a gang restart first deletes every pod and waits until all are gone (pod names are stable and JAX rejects
  a duplicate task), then creates attempt+1 away from nodes with an active notice;
* ``suspend`` deletes the pods and keeps the job; resuming starts a new attempt.

The decision is recorded in ``status`` (``restartingFrom`` plus the counters) before pods are deleted, and
the attempt is re-derived from the pods' attempt labels, so an operator restart neither counts nor restarts
twice.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from ..models import ExitCodeAction, ExitCodeOperator, ExitCodeRule, TrainingJob
from .times import parse_time, rfc3339

PREEMPTION, FAILURE, DISRUPTION = "preemption", "failure", "disruption"
TERMINAL_PHASES = ("Succeeded", "Failed")
RAPID_SECONDS = 60.0
# How long a peer-lost exit waits for the lost peer to show (a real Node turns NotReady ~40 s after it died).
PEER_LOST_WAIT_SECONDS = 60.0
BACKOFF_BASE_SECONDS, BACKOFF_MAX_SECONDS = 10.0, 300.0


def backoff_seconds(n: int) -> float:
    """The wait before the next attempt after the ``n``-th consecutive rapid restart (CrashLoopBackOff's)."""
    return float(min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** max(0, n - 1)))


@dataclass(frozen=True)
class WorkerPod:
    """What the policy needs to know about one worker pod (built from the API object by the handler)."""

    name: str
    index: int
    attempt: int
    phase: str = "Running"  # Pending, Running, Succeeded, Failed, Unknown
    exit_code: int | None = None
    deleting: bool = False
    node: str | None = None
    node_lost: bool = False
    noticed: bool = False  # carries a reprieve.dev/notice annotation
    unsaved: bool = False  # its supervisor reported the restart code as not agreed: the program exited so itself
    peer_lost: tuple[int, ...] = ()  # its exit report: it ended because these processes went silent
    peer_gone: tuple[int, ...] = ()  # ... of them, those whose pulse did not answer it (node gone or cut off)
    exit_time: datetime | None = None  # when it exited (its report's time, or the container's finishedAt)
    node_ready: bool = True  # its node's Ready condition is not False/Unknown
    reachable: bool = True  # False: the operator's probe of its pod's address went unanswered (``decide``)

    @property
    def terminated(self) -> bool:
        return self.phase in TERMINAL_PHASES


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class RestartPlan:
    """What to do now. ``cause`` is set only when a new gang restart (or the final failure) is decided."""

    phase: str
    attempt: int
    create: tuple[int, ...] = ()
    delete: tuple[str, ...] = ()
    cause: str | None = None
    restarting_from: int | None = None
    exclude_nodes: tuple[str, ...] = ()
    new_attempt: bool = False
    ready: int = 0
    conditions: tuple[Condition, ...] = field(default_factory=tuple)
    message: str = ""
    rapid_restarts: int | None = None  # new value of status.rapidRestarts (None: unchanged)
    next_attempt_time: datetime | None = None  # set while backing off before the next attempt
    requeue_after: float | None = None  # look again after this many seconds (a backoff runs out)
    replicas: int = 0  # worker pods of the current attempt that exist (not being deleted)
    probe: tuple[str, ...] = ()  # silent peers' pods to probe before waiting on (``Verdict.probe``)

    @property
    def waiting(self) -> bool:
        """True while old pods must vanish before the next step can happen (a backoff uses ``requeue_after``)."""
        return self.phase in ("Restarting", "Suspended", "Pending") and bool(self.delete) and not self.create


def _named_gone(failed: Sequence[WorkerPod]) -> dict[int, tuple[int, ...]]:
    """Process index -> the failed workers' indices whose pulse it did not answer (``peerGone``): its node is gone
    or it is cut off the network; the runtime found so already, so no probe of the operator's is needed."""
    named: dict[int, set[int]] = {}
    for p in failed:
        for i in p.peer_gone:
            named.setdefault(i, set()).add(p.index)
    return {i: tuple(sorted(by)) for i, by in named.items()}


def _describe(p: WorkerPod, gone: Mapping[int, tuple[int, ...]] | None = None) -> str:
    if p.node_lost:
        return f"worker {p.name} lost its node {p.node}"
    if gone and p.index in gone and not p.terminated:
        return (f"worker {p.name} went silent and did not answer the pulse of process(es) "
                f"{', '.join(map(str, gone[p.index]))} (its node gone or cut off the network)")
    if not p.reachable and not p.terminated:
        return f"worker {p.name} went silent and its pod does not answer on the network (cut off)"
    if p.deleting:
        return f"worker {p.name} was deleted"
    if p.phase == "Failed" and p.exit_code is None:
        return f"worker {p.name} failed without an exit code"
    if p.peer_lost:
        return (f"worker {p.name} exited with code {p.exit_code} after losing peer process(es) "
                f"{', '.join(map(str, p.peer_lost))}")
    if p.unsaved:
        return (f"worker {p.name} exited with the restart code {p.exit_code} without an agreed save (the program "
                f"exited with it itself; nothing was saved for a restart)")
    return f"worker {p.name} exited with code {p.exit_code}"


class _Pod(Protocol):
    """A pod as either restart decision sees it (``WorkerPod``, ``inplace.PodView``)."""

    @property
    def name(self) -> str: ...

    @property
    def phase(self) -> str: ...

    @property
    def deleting(self) -> bool: ...


SUSPENDED = Condition("Suspended", "True", "Suspended", "spec.suspend is true")


def still_running(pods: Iterable[_Pod]) -> tuple[str, ...]:
    """The pods neither ended nor being deleted (a failed job stops them)."""
    return tuple(sorted(p.name for p in pods if not p.deleting and p.phase not in TERMINAL_PHASES))


def finished_or_suspended(job: TrainingJob, attempt: int, pods: Sequence[_Pod],
                          after_success: Iterable[str] = (), held: Condition | None = None) -> RestartPlan | None:
    """The start both restart decisions share (``decide_restart``, ``inplace.decide_inplace``): a finished job only
    clears up (Failed: the pods still running; Succeeded: ``after_success``), a suspended one deletes every pod;
    None when the job is neither. ``held``: the job is held by its queue (``policy.kueue``), with this condition:
    suspended as by ``spec.suspend``."""
    st = job.status
    if st.phase in TERMINAL_PHASES:
        delete = still_running(pods) if st.phase == "Failed" else tuple(after_success)
        return RestartPlan(phase=st.phase, attempt=attempt, delete=delete)
    if job.spec.suspend or held is not None:
        return RestartPlan(phase="Suspended", attempt=attempt, delete=tuple(sorted(p.name for p in pods
                                                                                 if not p.deleting)),
                           conditions=(SUSPENDED if job.spec.suspend else held,))  # type: ignore[arg-type]
    return None


def decide_restart(job: TrainingJob, pods: Sequence[WorkerPod], avoid_nodes: Iterable[str] = (),
                   now: datetime | None = None, doomed_nodes: Collection[str] = (),
                   held: Condition | None = None, peer_lost_wait_s: float = PEER_LOST_WAIT_SECONDS,
                   gone: Iterable[tuple[int | None, int | None, str]] = ()) -> RestartPlan:
    """Decide the next step of ``job`` given all of its worker pods.

    ``peer_lost_wait_s``: how long a peer-lost exit waits for its lost peer to show (see the module docstring).
    ``avoid_nodes``: what a new pod must avoid (``policy.placement.avoid_nodes``). ``doomed_nodes``: nodes
    with an open notice for this job right now (a pod lost there was preempted, whatever the status says yet).
    ``gone``: (index, attempt, node) of worker pods seen deleted and gone (where a missing worker ran).
    ``now``: for the rapid-restart rule and its backoff (None: neither applies).
    """
    st, spec = job.status, job.spec
    attempt = max([st.attempt, *(p.attempt for p in pods)])
    settled = finished_or_suspended(job, attempt, pods, held=held)
    if settled is not None:
        return settled
    alive = tuple(sorted(p.name for p in pods if not p.deleting))
    replicas = spec.replicas
    avoid = tuple(avoid_nodes)

    restarting = st.restarting_from is not None and st.restarting_from >= attempt
    if attempt == 0 or st.phase == "Suspended" or restarting:
        # Start attempt+1, but only once every pod of any earlier attempt is gone (and any backoff ran out).
        phase = "Restarting" if restarting else "Pending"
        if pods:
            return RestartPlan(phase=phase, attempt=attempt, delete=alive,
                               restarting_from=st.restarting_from if restarting else None,
                               message=f"waiting for {len(pods)} old pod(s) to be deleted")
        due = parse_time(st.next_attempt_time) if restarting else None
        if due is not None and now is not None and now < due:
            wait = (due - now).total_seconds()
            msg = f"backing off after {st.rapid_restarts} rapid restart(s): attempt {attempt + 1} starts at " \
                  f"{st.next_attempt_time}"
            return RestartPlan(phase="Restarting", attempt=attempt, restarting_from=st.restarting_from,
                               next_attempt_time=due, requeue_after=wait, message=msg,
                               conditions=(Condition("Restarting", "True", "Backoff", msg),))
        conds: tuple[Condition, ...] = ()
        if st.phase == "Suspended":
            conds = (Condition("Suspended", "False", "Resumed", "spec.suspend is false"),)
        elif restarting:
            conds = (Condition("Restarting", "False", "AttemptStarted", f"attempt {attempt + 1} started"),)
        return RestartPlan(phase="Pending", attempt=attempt + 1, create=tuple(range(replicas)),
                           exclude_nodes=avoid, new_attempt=True,
                           conditions=conds, message=f"creating attempt {attempt + 1}")

    stale = tuple(sorted(p.name for p in pods if p.attempt < attempt and not p.deleting))
    current = {p.index: p for p in pods if p.attempt == attempt and 0 <= p.index < replicas}
    recorded = st.attempt == attempt  # status knows this attempt was fully created
    missing = [i for i in range(replicas) if i not in current]
    noticed = (st.last_notice is not None and st.last_notice.attempt == attempt) or \
        any(p.noticed for p in current.values())

    ran_on = {i: node for i, a, node in gone if a == attempt and i is not None}
    verdict = classify(job, current, missing, recorded, noticed, doomed_nodes, now, peer_lost_wait_s, ran_on)
    if verdict.succeeded:
        return RestartPlan(phase="Succeeded", attempt=attempt, delete=stale, ready=0,
                           conditions=(Condition("Complete", "True", "AllWorkersSucceeded",
                                                 f"all {replicas} workers exited 0"),))
    if verdict.cause is None:
        running = sum(1 for p in current.values() if p.phase == "Running" and not p.deleting)
        phase = "Preempting" if noticed else ("Running" if running == replicas else "Pending")
        create = tuple(missing) if not recorded else ()
        existing = sum(1 for p in current.values() if not p.deleting)
        conds, requeue = waiting(verdict)
        return RestartPlan(phase=phase, attempt=attempt, create=create, delete=stale, ready=running,
                           exclude_nodes=avoid if create else (), replicas=existing, conditions=conds,
                           requeue_after=requeue, probe=verdict.probe)
    return gang_restart(job, attempt, verdict, now, stragglers=still_running(pods), teardown=alive)


@dataclass(frozen=True)
class Verdict:
    """What the current attempt's workers say: a cause to restart (or fail), success, or nothing yet."""

    cause: str | None = None
    why: str = ""
    rapid: bool = False
    succeeded: bool = False
    waiting: str = ""  # no cause yet: why the decision waits (a peer-lost exit, its lost peer not shown yet)
    wait_s: float | None = None  # ... and for how long at most
    fail_job: bool = False  # an exit-code rule's FailJob: no restart, whatever the budgets
    probe: tuple[str, ...] = ()  # while waiting: the silent peers' pods, whose network the shell may probe


# strictest first: with several failing workers, the strictest action among their rules decides
_SEVERITY = {ExitCodeAction.FAIL_JOB: 0, ExitCodeAction.COUNT: 1, ExitCodeAction.IGNORE: 2}


def exit_code_action(rules: Sequence[ExitCodeRule], code: int) -> tuple[ExitCodeAction, int | None]:
    """The action of the first rule matching a failing exit ``code`` and its index (Count and None: no rule)."""
    for i, rule in enumerate(rules):
        listed = code in rule.on_exit_codes.values
        if listed == (rule.on_exit_codes.operator == ExitCodeOperator.IN):
            return rule.action, i
    return ExitCodeAction.COUNT, None


def _own_failure(job: TrainingJob, own: Sequence[WorkerPod]) -> Verdict:
    """The verdict on workers that failed of their own: the strictest of their exit-code rules' actions."""
    rules = job.spec.restart_policy.exit_code_rules
    first = min((p.exit_time for p in own if p.exit_time is not None), default=None)
    if first is not None:  # the earliest exit (to the second: pod times are RFC 3339 seconds) is the cause
        own = [p for p in own if p.exit_time is not None and (p.exit_time - first).total_seconds() < 1.0]
    judged = sorted(((exit_code_action(rules, p.exit_code or 0), p) for p in own),
                    key=lambda ap: (_SEVERITY[ap[0][0]], ap[1].index))
    (action, rule), p = judged[0]
    why = _describe(p)
    if rule is None:
        return Verdict(FAILURE, why)
    why += f" (restartPolicy.exitCodeRules[{rule}]: {action.value})"
    if action == ExitCodeAction.IGNORE:
        return Verdict(DISRUPTION, why)
    return Verdict(FAILURE, why, fail_job=action == ExitCodeAction.FAIL_JOB)


def waiting(verdict: Verdict) -> tuple[tuple[Condition, ...], float | None]:
    """A waiting verdict's part of the plan: the condition that says why, and when to look again."""
    if not verdict.waiting:
        return (), None
    return (Condition("Restarting", "Unknown", "WaitingForLostPeer", verdict.waiting),), verdict.wait_s


def classify(job: TrainingJob, current: Mapping[int, WorkerPod], missing: Sequence[int], recorded: bool,
             noticed: bool, doomed_nodes: Collection[str] = (), now: datetime | None = None,
             peer_lost_wait_s: float = PEER_LOST_WAIT_SECONDS, ran_on: Mapping[int, str] | None = None) -> Verdict:
    """The gang rules of the module docstring over the current attempt's workers (by index); ``ran_on``: the
    nodes missing workers ran on (their pods seen deleted: one gone from a doomed node was preempted)."""
    code = job.spec.restart_policy.restart_exit_code
    # A pod someone else deletes gets SIGTERM and may die with 143: that is a disruption, not a failure
    # (unless the runtime managed to save and exit with the restart code).
    lost = [p for p in current.values() if _lost(p, code)]
    failed = [p for p in current.values()
              if p.phase == "Failed" and p.exit_code is not None and (p.exit_code not in (0, code) or p.unsaved)
              and p not in lost]
    own = [p for p in failed if not p.peer_lost]  # failures of their own; the rest ended because a peer did
    if own:
        return _own_failure(job, own)
    if failed:  # a silent peer on a node that is not Ready, or whose pod or pulse does not answer, is lost
        gone = _named_gone(failed)
        lost += [p for p in current.values()
                 if (not p.node_ready or not p.reachable) and not p.terminated and p not in lost]
        lost += [p for p in current.values() if p.index in gone and not p.terminated and p not in lost]
    if lost or (missing and recorded):
        ran_on = ran_on or {}
        doomed = any(p.node in doomed_nodes for p in lost if p.node) or \
            any(ran_on.get(i) in doomed_nodes for i in missing)
        if lost:
            why = _describe(lost[0], _named_gone(failed))
        else:
            why = f"worker {job.name}-{missing[0]} disappeared"
            if missing[0] in ran_on:
                why += f" (from node {ran_on[missing[0]]})"
        if failed:
            why += f" ({len(failed)} other worker(s) ended as they lost it)"
        return Verdict(PREEMPTION if noticed or doomed else DISRUPTION, why)
    if failed:
        return _peer_lost(failed, current.values(), now, peer_lost_wait_s)
    if not missing and all(p.terminated for p in current.values()):
        codes = {p.exit_code for p in current.values()}
        if codes == {0}:
            return Verdict(succeeded=True)
        if codes <= {0, code}:
            started = parse_time(job.status.attempt_start_time)
            explained = noticed or any(p.deleting for p in current.values())
            rapid = (not explained and now is not None and started is not None
                     and (now - started).total_seconds() < RAPID_SECONDS)
            return Verdict(PREEMPTION, f"all workers exited (codes {sorted(c for c in codes if c is not None)})",
                           rapid)
    return Verdict()


def _peer_lost(failed: Sequence[WorkerPod], workers: Iterable[WorkerPod], now: datetime | None,
               wait_s: float) -> Verdict:
    """Workers ended by a lost peer, none lost (yet): a failure once every worker ended or ``wait_s`` passed
    since the first such exit; until then, wait for the lost peer to show."""
    workers = tuple(workers)
    running = sorted(p.name for p in workers if not p.terminated)
    first = min((p.exit_time for p in failed if p.exit_time is not None), default=None)
    left = None if now is None or first is None else wait_s - (now - first).total_seconds()
    why = _describe(failed[0])
    if not running:
        pair = _lost_each_other(failed)
        if pair is not None:  # both sides were alive and lost contact: the network, not the application
            return Verdict(DISRUPTION, f"processes {pair[0]} and {pair[1]} each named the other as a lost peer and "
                                       "no worker was lost (a network partition)")
        return Verdict(FAILURE, f"{why}, and no worker of the attempt was lost (every worker ended)")
    if left is None or left <= 0:
        return Verdict(FAILURE, f"{why}; {', '.join(running[:5])} not shown lost within {wait_s:.0f} s")
    assert first is not None
    until = rfc3339(first + timedelta(seconds=wait_s))
    named = {i for p in failed for i in p.peer_lost}
    silent = tuple(sorted(p.name for p in workers if p.index in named and not p.terminated and not p.deleting))
    return Verdict(waiting=f"{why}: waiting until {until} for {', '.join(running[:5])} to show lost (its pod or "
                           "node) before counting a failure", wait_s=left, probe=silent)


def _lost_each_other(failed: Sequence[WorkerPod]) -> tuple[int, int] | None:
    """Two workers whose exit reports name each other as the lost peer (the lowest such pair), or None. A process
    that died or hung names nobody; two that each lost the other were both alive: they were cut apart."""
    named = {p.index: set(p.peer_lost) for p in failed}
    return next(((i, j) for i in sorted(named) for j in sorted(named[i]) if j != i and i in named.get(j, ())),
                None)


def gang_restart(job: TrainingJob, attempt: int, verdict: Verdict, now: datetime | None, *,
                 stragglers: tuple[str, ...], teardown: tuple[str, ...]) -> RestartPlan:
    """A decided cause against the budgets: Failed (deleting ``stragglers``), or a gang restart of ``attempt``
    (deleting ``teardown``), after a backoff if it is rapid."""
    st, spec = job.status, job.spec
    cause, why, rapid = verdict.cause, verdict.why, verdict.rapid
    assert cause is not None
    code = spec.restart_policy.restart_exit_code
    counts = st.restarts
    if verdict.fail_job:
        return RestartPlan(phase="Failed", attempt=attempt, delete=stragglers, cause=FAILURE, message=why,
                           conditions=(Condition("Failed", "True", "ExitCodeRule", why),))
    if cause == FAILURE and counts.failure + 1 > spec.restart_policy.max_failures:
        msg = (f"{why}; {counts.failure + 1} failure(s) exceed restartPolicy.maxFailures="
               f"{spec.restart_policy.max_failures}")
        return RestartPlan(phase="Failed", attempt=attempt, delete=stragglers, cause=FAILURE, message=msg,
                           conditions=(Condition("Failed", "True", "TooManyFailures", msg),))
    cap = spec.restart_policy.max_preemption_restarts
    if cause != FAILURE and cap is not None and counts.preemption + counts.disruption + 1 > cap:
        msg = f"{why}; {counts.preemption + counts.disruption + 1} preemption restart(s) exceed " \
              f"restartPolicy.maxPreemptionRestarts={cap}"
        return RestartPlan(phase="Failed", attempt=attempt, delete=stragglers, cause=cause, message=msg,
                           conditions=(Condition("Failed", "True", "TooManyPreemptions", msg),))
    n_rapid = st.rapid_restarts + 1 if rapid else 0
    if rapid and n_rapid > spec.restart_policy.max_rapid_restarts:
        msg = (f"{why} within {RAPID_SECONDS:.0f} s of the attempt's start without any notice, {n_rapid} time(s) "
               f"in a row (restartPolicy.maxRapidRestarts={spec.restart_policy.max_rapid_restarts}): the restart "
               f"code {code} is probably returned for something other than a saved preemption")
        return RestartPlan(phase="Failed", attempt=attempt, delete=stragglers, cause=cause, message=msg,
                           rapid_restarts=n_rapid,
                           conditions=(Condition("Failed", "True", "TooManyRapidRestarts", msg),))
    msg = f"gang restart of attempt {attempt} ({cause}): {why}"
    due = None
    if rapid and now is not None:
        wait = backoff_seconds(n_rapid)
        due = (now + timedelta(seconds=wait)).replace(microsecond=0)
        msg += f"; rapid restart {n_rapid} in a row (no notice, within {RAPID_SECONDS:.0f} s): next attempt " \
               f"in {wait:.0f} s"
    return RestartPlan(phase="Restarting", attempt=attempt, delete=teardown, cause=cause, restarting_from=attempt,
                       message=msg, rapid_restarts=n_rapid, next_attempt_time=due,
                       conditions=(Condition("Restarting", "True", cause.capitalize(), msg),))


def _lost(p: WorkerPod, code: int) -> bool:
    return p.node_lost or (p.deleting and p.exit_code not in (0, code)) \
        or (p.phase == "Failed" and p.exit_code is None) or p.phase == "Unknown"


def lost_nodes(pods: Iterable[WorkerPod]) -> set[str]:
    """Nodes of pods that look lost (whatever the restart code): where to look for a notice."""
    return {p.node for p in pods if p.node and (p.deleting or p.node_lost or p.phase == "Unknown"
                                                 or (p.phase == "Failed" and p.exit_code is None))}


class _OnNode(Protocol):
    """A pod as either policy sees it (``WorkerPod``, ``PodView``): its name and node."""

    @property
    def name(self) -> str: ...

    @property
    def node(self) -> str | None: ...


def orphaned_pods(pods: Iterable[_OnNode], known_nodes: Collection[str] | None) -> tuple[str, ...]:
    """Pods bound to a Node that no longer exists: force-delete them (grace 0).

    No kubelet will confirm their graceful deletion, so a gang restart would otherwise wait for the pod
    garbage collector's quarantine (40 s and more) before attempt+1 can start. ``known_nodes`` None (the node
    cache is not primed yet) decides nothing.
    """
    if known_nodes is None:
        return ()
    return tuple(sorted(p.name for p in pods if p.node and p.node not in known_nodes))
