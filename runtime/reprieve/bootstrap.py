"""``reprieve.init()``: read the contract environment, join the job, wire the pieces into a :class:`Job`."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from . import console, exiting, prewarm
from .agreement import Agreement, Target
from .capabilities import Checkpointer
from .config import ConfigError, RuntimeConfig
from .coordination import Coordinator, JaxCoordinator, LocalCoordinator
from .countdown import CountdownSettings
from .env import warn_unknown
from .exiting import exit_process
from .jax_workarounds import (
    disable_preemption_service,
    enable_compilation_cache,
    jax_version_problem,
    replace_preemption_sync_point,
)
from .job import Job
from .kube import KubeClient, PodWatchSource
from .memtier.config import MemoryConfig
from .metrics import Metrics
from .notice import Notice
from .notice_object import JobNoticeWatch
from .notice_sources import NoticeFile, NoticeHub, PollingSource, SigtermSource, UserCallable
from .peers import PeerWatch, end_process, write_termination_message
from .policy import SavePolicy
from .progress import ProgressReporter
from .supervisor.trainer import ASSIGNMENT_WAIT_S, SupervisorLink
from .targets import Tier
from .topology import Topology
from .trace_ahead import TraceAhead, record_topology

log = logging.getLogger(__name__)


def config_errors_in_one_line() -> None:
    """A :class:`ConfigError` nobody catches ends the program with one line naming the setting and what is
    accepted (``reprieve: <variable>=<value>: ...``, exit 1), not a traceback through the runtime's internals: the
    message is the whole story. Any other exception goes to the hook installed before. Installed once."""
    previous = sys.excepthook
    if getattr(previous, "reprieve_config_errors", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if issubclass(kind, ConfigError):
            sys.stderr.write(f"reprieve: {value}\n")
            sys.stderr.flush()
            return
        previous(kind, value, tb)

    hook.reprieve_config_errors = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def init(
    *,
    checkpointer: Checkpointer | Callable[[RuntimeConfig, Coordinator], Checkpointer] | None = None,
    env: Mapping[str, str] | None = None,
    notice_fn: Callable[[], Any] | None = None,
    policy: SavePolicy | None = None,
    countdown: CountdownSettings | None = None,
    install_sigterm: bool = True,
    watch_pod: bool = True,
    exit_fn: Callable[[int], Any] = exit_process,
    trace_ahead: Callable[[Topology], Any] | None = None,
) -> Job:
    """Join the job described by the ``REPRIEVE_*`` environment and return its :class:`Job`.

    With ``REPRIEVE_NUM_PROCESSES`` > 1 this calls ``jax.distributed.initialize`` (coordination service bound
    to ``REPRIEVE_POD_IP``, short heartbeat/shutdown timeouts so a dead peer fails the job in seconds, JAX's
    own SIGTERM-based preemption service disabled: reprieve handles SIGTERM). Outside Kubernetes it runs
    single-process with local defaults.

    Args:
        checkpointer: a :class:`Checkpointer`, or a factory ``(config, coordinator) -> Checkpointer``;
            default ``reprieve.checkpoint.CheckpointManager`` on ``REPRIEVE_CHECKPOINT_URI``.
        env: the environment to read (default ``os.environ``).
        notice_fn: optional callable polled every ``REPRIEVE_NOTICE_POLL_SECONDS``; see
            :func:`reprieve.notice.user_notice` for what it may return.
        policy: periodic save policy (default: every ``REPRIEVE_CHECKPOINT_INTERVAL_STEPS`` and the last step).
        countdown: grace-period countdown settings.
        install_sigterm: install the SIGTERM handler (chains any handler installed before).
        watch_pod: watch this pod's notice annotation and the job's notice object (``<job>-notice``) through the
            Kubernetes API when in a cluster.
        exit_fn: how to exit once the exit code is decided (default :func:`reprieve.exiting.exit_process`:
            unwinds like ``sys.exit``, then ends without the interpreter's teardown; pass ``sys.exit`` for a
            full teardown).
        trace_ahead: ``f(topology)``, called once before any device is touched, as soon as the devices the job
            will most likely run on are known (:func:`reprieve.expected_topology`): trace the training step
            there under ``topology.abstract_mesh(...)`` and a restarted attempt's first step skips tracing. In a
            pre-warmed process it runs while the previous attempt trains; a spare started before the first
            checkpoint retries every few seconds while it waits. See docs/restarts.md, "Tracing the step before
            the devices".
    """
    console.install()  # the lifecycle lines reach a program that configured no logging (reprieve.console)
    config_errors_in_one_line()
    environ: Mapping[str, str] = os.environ if env is None else env
    warn_unknown(environ)  # a misspelt REPRIEVE_* variable would otherwise be ignored in silence
    link = SupervisorLink.take(os.environ if env is None else dict(env))
    warm = link if link is not None and link.warm else None
    here = False  # a warm process's assignment is already here: the attempt waits for it, no warm-up
    if warm is not None:
        warm.warming()  # imports done: the supervisor hands this process an attempt waiting for it at once
        here = warm.assignment_here(ASSIGNMENT_WAIT_S)
        if here:
            log.info("pre-warmed process %d: its assignment came with its imports: no warm-up (the step is traced "
                     "and lowered beside the restore)", os.getpid())
    ahead = TraceAhead(trace_ahead, environ) if trace_ahead is not None else None
    if ahead is not None and not here:
        ahead.attempt(hurry=warm.assignment_here if warm is not None else None)
    if warm is not None:
        # A pre-warmed process (reprieve-supervisor): imports are done (and what init() and the restore would import
        # after the assignment, prewarm.prepare); the assignment says who this process is. An assignment that came
        # meanwhile leaves the landing memory to the restore and the heap's collection undone.
        here = here or warm.assignment_here()
        landing_ahead = prewarm.prepare(environ, landing_memory=not here)
        prewarm.settle_heap(first=True, collect=not here)
        # while it waits: the memory populated ahead given back if the machine runs short; the head starts asked
        # again (a spare started before the job's first checkpoint)
        waiting = prewarm.WhileWaiting([] if here else [ahead, landing_ahead], TraceAhead.POLL_SECONDS)
        updates = warm.await_assignment(idle=waiting, idle_seconds=prewarm.MEMORY_CHECK_SECONDS)
        exiting.freeze()  # what was made while it waited (the assignment's parse): no collection
        if env is None:
            os.environ.update(updates)  # user code after init() and child processes see the new attempt
        else:
            environ = {**env, **updates}
    started_at = time.time()  # this attempt's start: a notice past its deadline by then is stale (stale_at_start)
    config = RuntimeConfig.from_env(environ)
    console.install(config.process_id, config.num_processes)
    memory_config = MemoryConfig.from_env(environ, pod_ip=config.pod_ip)  # a bad setting refuses before joining
    if link is not None:
        link.send("init", attempt=config.attempt, processId=config.process_id)
    enable_compilation_cache(config)
    coordinator = _join(config)
    ckpt = _checkpointer(checkpointer, config, coordinator)
    tier = None if memory_config is None else _memory_tier(memory_config, config, coordinator)
    metrics = Metrics()
    agreement = _agreement(config, coordinator, countdown, metrics)
    notices = _Notices(config, agreement, metrics, started_at)
    if install_sigterm:
        notices.sigterm()
    if config.notice_file:
        notices.poll("notice-file", NoticeFile(config.notice_file, attempt=config.attempt, started_at=started_at))
    if notice_fn is not None:
        notices.poll("notice-callable", UserCallable(notice_fn, default_grace_seconds=config.termination_grace_seconds))
    progress = None
    if config.in_cluster:
        assert config.kubernetes_host is not None and config.pod_name is not None
        client = KubeClient(config.kubernetes_host, config.kubernetes_port, config.serviceaccount_dir)
        if watch_pod:
            notices.closers.append(PodWatchSource(client, config.namespace, config.pod_name, notices.hub.put,
                                                  attempt=config.attempt, started_at=started_at).start().close)
            # the job's notice object: one write per job reaches every pod (docs/notices.md, "One write per job")
            notices.closers.append(JobNoticeWatch(client, config.namespace, config.job, config.pod_name,
                                                  notices.hub.put, attempt=config.attempt,
                                                  started_at=started_at).start().close)
        if config.process_id == 0:
            progress = ProgressReporter(client, config.namespace, config.pod_name, config.attempt,
                                        interval_s=config.progress_interval_seconds,
                                        termination_log=config.termination_log)
    # Job wires itself to the checkpointer's commits (capabilities.CommitCallback), whichever checkpointer it is.
    job = Job(config, coordinator, ckpt, agreement, notices.hub, policy=policy, metrics=metrics, progress=progress,
              closers=notices.closers, exit_fn=exit_fn, memory=tier,
              on_first_step=_on_first_step(config, ckpt, link),
              on_exiting=link.exiting if link is not None else None)
    if config.distributed:
        peers = _watch_peers(job, config, coordinator, link)
        job.watch_peers(peers.close, _waiting_and_reporting_again(peers))
    if job.memory is not None and config.process_id == 0:
        job.loop.extra_fields = job.memory.progress_fields
    if config.metrics_port is not None:
        # On the pod's IP when known, like the coordinator: workers that share a host network (hostNetwork
        # pods, the local process kubelet) do not collide on the port.
        metrics.serve(config.metrics_port, addr=config.pod_ip or "0.0.0.0")
    agreement.start()
    notices.hub.start()
    log.info("reprieve: process %d/%d, attempt %d, checkpoints %s, notices from %s", config.process_id,
             config.num_processes, config.attempt, config.checkpoint_uri,
             ", ".join(s for s, on in [("SIGTERM", notices.sigterm_source is not None),
                                       ("the supervisor's resize signal",
                                        notices.sigterm_source is not None and notices.sigterm_source.takes_resize),
                                       ("notice file", config.notice_file),
                                       ("pod watch and job notice object", config.in_cluster and watch_pod),
                                       ("callable", notice_fn is not None)] if on))
    if config.distributed:
        replace_preemption_sync_point()
    atexit.register(job.abandon)  # a loop left by break/exception must not abort the interpreter's exit
    return job


def _checkpointer(given: Checkpointer | Callable[[RuntimeConfig, Coordinator], Checkpointer] | None,
                  config: RuntimeConfig, coordinator: Coordinator) -> Checkpointer:
    """``init(checkpointer=)``: a checkpointer, a factory of one, or None for :func:`default_checkpointer`."""
    if given is None:
        return default_checkpointer(config, coordinator)
    if callable(given) and not hasattr(given, "save"):
        return given(config, coordinator)
    return cast(Checkpointer, given)


def _agreement(config: RuntimeConfig, coordinator: Coordinator, countdown: CountdownSettings | None,
               metrics: Metrics) -> Agreement:
    def on_target(target: Target) -> None:
        metrics.set("reprieve_agreed_step", target.plan.final_step)

    return Agreement(coordinator, attempt=config.attempt,
                     timeout_s=config.agreement_timeout_seconds,
                     countdown=countdown or CountdownSettings(default_save_seconds=config.save_seconds_estimate),
                     on_target=on_target, hold_until_loop=True)


class _Notices:
    """The notice hub and the sources that feed it, with what closes them (in the order they started)."""

    def __init__(self, config: RuntimeConfig, agreement: Agreement, metrics: Metrics, started_at: float) -> None:
        self.config = config
        self.closers: list[Callable[[], None]] = []
        self.sigterm_source: SigtermSource | None = None

        def on_notice(notice: Notice) -> None:
            metrics.inc("reprieve_notices_total", source=notice.source, reason=notice.reason)
            metrics.set("reprieve_notice_lead_seconds", notice.lead_seconds)

        def in_force() -> str | None:
            target = agreement.target
            if target is None:
                return None
            left = f", deadline in {target.deadline - time.time():.1f}s" if target.deadline_known else ""
            return f"agreed save at step {target.plan.final_step}{left}"

        self.hub = NoticeHub(agreement.offer, on_notice=on_notice, idle_check=self._idle_check,
                             idle_s=config.notice_poll_seconds, in_force=in_force)

    def _idle_check(self) -> None:  # about once a second on the hub thread
        if self.sigterm_source is not None:
            self.sigterm_source.check()

    def sigterm(self) -> None:
        c = self.config
        source = SigtermSource(self.hub, grace_seconds=c.termination_grace_seconds, pod=c.pod_name,
                               process_id=c.process_id)
        self.sigterm_source = source
        if source.install():
            self.closers.append(source.uninstall)

    def poll(self, name: str, source: Any) -> None:
        self.closers.append(PollingSource(name, source, self.hub, self.config.notice_poll_seconds).start().close)


def _watch_peers(job: Job, config: RuntimeConfig, coordinator: Coordinator, link: SupervisorLink | None) -> PeerWatch:
    """One line naming a peer that stopped, before JAX's heartbeat timeout ends this process for it
    (:mod:`reprieve.peers`). The silent peers are told to the supervisor (its exit report) and written as the
    termination message (Recreate), so an exit JAX forces for them counts as their loss; with this process's
    last finished step (the gang's: training is synchronous), so the operator counts the steps after process 0's
    last progress report as lost, not as restart gap (docs/goodput.md)."""
    watch: PeerWatch | None = None

    def on_lost(processes: tuple[int, ...]) -> None:
        last = _last_step_said(job)
        gone = watch.gone if watch is not None else ()  # those the pulse found not answering (the operator need not probe)
        if link is not None:
            link.peer_lost(processes, last, gone=gone)
        if config.in_cluster:
            write_termination_message(processes, config.termination_log, attempt=config.attempt, last=last, gone=gone)

    watch = PeerWatch(coordinator, attempt=config.attempt, pod=config.pod_name,
                     heartbeat_s=config.heartbeat_timeout_seconds, address=config.coordinator_address,
                     committed=lambda: job.committed_step, on_lost=on_lost, device_processes=_device_processes,
                     ip=config.pod_ip, lost_s=config.peer_lost_seconds,
                     end=lambda why: end_unless_leaving(job, why))
    return watch.start()


def _on_first_step(config: RuntimeConfig, ckpt: Checkpointer,
                   link: SupervisorLink | None) -> Callable[[int, int | None, int | None], None] | None:
    """What the job's first step starts (once): under ``reprieve-supervisor`` the report that pre-warms the pod's
    next attempt and, on process 0 with reprieve's checkpoint manager, the attempt's devices recorded in the
    checkpoint root for a spare parked before the first checkpoint (:func:`reprieve.trace_ahead.record_topology`).
    Without a supervisor there is no warm process to tell: nothing."""
    if link is None:
        return None
    from .checkpoint import CheckpointManager

    if config.process_id != 0 or not isinstance(ckpt, CheckpointManager):
        return link.first_step
    report = link.first_step

    def first_step(step: int, landing: int | None, owned: int | None) -> None:
        report(step, landing, owned)  # never raises (a supervisor that is gone does not stop training)
        record_topology(config.checkpoint_uri, config.attempt, config.num_processes)

    return first_step


def _device_processes() -> dict[int, int]:
    """Device id -> process index (what a failed collective's peer address maps to, :mod:`reprieve.peers`)."""
    import jax

    return {d.id: d.process_index for d in jax.devices()}


def _memory_tier(memory: MemoryConfig, config: RuntimeConfig, coordinator: Coordinator) -> Tier:
    """The memory tier beside the storage checkpointer (docs/memory.md)."""
    from .memtier.tier import MemoryTier  # imports JAX: only a job with the tier pays for it at init

    return MemoryTier(memory, coordinator=coordinator, attempt=config.attempt, pod_ip=config.pod_ip,
                      token=memory.token, root=config.checkpoint_uri)


def _join(config: RuntimeConfig) -> Coordinator:
    if not config.distributed:
        return LocalCoordinator()
    import jax

    problem = jax_version_problem(jax.__version__)
    if problem:
        raise ConfigError(problem)
    if not jax.distributed.is_initialized():
        disable_preemption_service()  # reprieve owns SIGTERM
        timeout = config.init_timeout_seconds
        # Who has come, who is awaited, who never came: JAX's own wait says nothing and ends in SIGABRT.
        timeout = max(1, int(timeout - roll_call(config, timeout)))
        if config.process_id != 0 and config.coordinator_address:
            # gRPC backs off ~1 s after a refused first connection: a process that asks before process 0's
            # service listens (every restart: all processes start together) loses that second. Knock first.
            waited = await_listening(config.coordinator_address, timeout)
            timeout = max(1, int(timeout - waited))
        jax.distributed.initialize(
            coordinator_address=config.coordinator_address,
            num_processes=config.num_processes,
            process_id=config.process_id,
            # Everything comes from the contract env; JAX's Kubernetes auto-detection would read the fixed
            # service-account path and need RBAC on pods we do not grant.
            cluster_detection_method="deactivate",
            coordinator_bind_address=config.coordinator_bind_address(),
            initialization_timeout=timeout,
            heartbeat_timeout_seconds=config.heartbeat_timeout_seconds,
            shutdown_timeout_seconds=config.shutdown_timeout_seconds,
        )
    return JaxCoordinator.from_jax()


def roll_call(config: RuntimeConfig, timeout_s: float) -> float:
    """Take (process 0) or answer (the others) the roll call on the coordinator's port before JAX starts there
    (:mod:`reprieve.rollcall`); the seconds it took. Raises :class:`reprieve.rollcall.RollCallError`."""
    from . import rollcall

    assert config.coordinator_address is not None
    address = config.coordinator_address
    port = int(address.rsplit(":", 1)[1])
    if config.process_id == 0:
        bind = config.coordinator_bind_address()
        host = "" if bind is None else bind.rsplit(":", 1)[0].strip("[]")
        return rollcall.lead((host, port), address, job=config.job, attempt=config.attempt, n=config.num_processes,
                             timeout_s=timeout_s)
    hello = rollcall.Hello(config.job, config.attempt, config.process_id, config.pod_name)
    return rollcall.attend(address, hello, n=config.num_processes, timeout_s=timeout_s)


def await_listening(address: str, timeout_s: float, poll_s: float = 0.01) -> float:
    """Wait until something accepts TCP connections at ``address`` (``host:port``, ``[v6]:port``), at most
    ``timeout_s``; the seconds waited. A name that does not resolve yet (a pod's DNS record) is retried too."""
    import socket
    import time

    from .tether import split_address

    target = split_address(address)
    if target is None:
        return 0.0  # not an address this can knock at: jax.distributed.initialize says what is wrong
    host, port = target
    start = time.monotonic()
    while True:
        try:
            socket.create_connection((host, port), timeout=max(poll_s, 0.5)).close()
            break
        except OSError:
            if time.monotonic() - start >= timeout_s:
                break  # let jax.distributed.initialize fail with its own message
            time.sleep(poll_s)
    return time.monotonic() - start


def default_checkpointer(config: RuntimeConfig, coordinator: Coordinator) -> Checkpointer:
    """``reprieve.checkpoint.CheckpointManager`` on ``REPRIEVE_CHECKPOINT_URI`` (the job sets its commit
    callback: progress is reported from the manager's background thread after every commit)."""
    from .checkpoint import CheckpointManager, FencedError

    try:
        return CheckpointManager(config.checkpoint_uri, coordinator=coordinator, attempt=config.attempt,
                                 keep=config.checkpoint_keep, start_over_quarantined=config.start_over_quarantined)
    except FencedError:
        raise
    except (OSError, ValueError, RuntimeError) as err:  # a path that cannot be created or written, a bad URI
        raise ConfigError(f"REPRIEVE_CHECKPOINT_URI={config.checkpoint_uri!r}: the checkpoint location cannot be "
                          f"opened for writing ({type(err).__name__}: {err}); set REPRIEVE_CHECKPOINT_URI to a "
                          "directory, gs:// or s3:// prefix this process can write") from err


def end_unless_leaving(job: Any, why: str, end: Callable[[str], None] = end_process) -> bool:
    """A peer whose pod does not answer (its node gone, cut off): end this process now, not at JAX's heartbeat
    timeout (``reprieve.peers``), unless ``job`` is already on its way out (its exit code decided, its teardown
    under way: that exit stands). Whether it ended (False only where ``end`` returns, i.e. in tests)."""
    if job.phase.terminal:
        log.info("a peer is gone (%s); this process is already leaving the job: no early end", why)
        return False
    end(why)
    return True


def _last_step_said(job: Job) -> tuple[int, float] | None:
    """:func:`_last_step`, or the loop's position where the finished steps cannot be read (the process is ending:
    a collective failed in the program's own code and the interpreter is shutting down, JAX's client with it):
    the peers lost are said either way, with the best step known."""
    try:
        return _last_step(job)
    except Exception as err:  # noqa: BLE001 - the report must go out
        last = job.loop.last
        log.warning("the last finished step could not be read (%s: %s): saying the loop's position, step %s",
                    type(err).__name__, err, None if last is None else last[0])
        return None if last is None else (last[0], last[1] + job.loop.wall_offset)


def _last_step(job: Job) -> tuple[int, float] | None:
    """The job's last finished step and when the loop handed it to save (unix seconds); None before one finished.

    Where the loop calls ``save`` every step, the newest step whose results exist (``reprieve.finished``: the
    loop may be steps ahead of it, JAX dispatches asynchronously); else the loop's position."""
    last = job.loop.last  # one atomic load: the training thread replaces the tuple
    if last is None:
        return None
    noted = job.finished.noted
    if noted is not None and noted >= last[0]:
        last = job.finished.last()
        if last is None:
            return None
    return last[0], last[1] + job.loop.wall_offset


def _waiting_and_reporting_again(peers: PeerWatch) -> Callable[[str], tuple[int, ...]]:
    """``Job``'s wait for the lost peer on its exit path, then the lost peers reported again with the last step
    the loop reached (it may have finished one more after the first report)."""
    def wait_lost(error: str) -> tuple[int, ...]:
        lost = peers.wait_lost(error)
        peers.report_again()
        return lost
    return wait_lost
