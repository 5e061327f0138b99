"""Where notices come from: SIGTERM, the downward-API file, a user callable (and :mod:`reprieve.kube`); under
``reprieve run``, also SIGINT (the loop's forwarded Ctrl-C: a stop at the next step, :func:`interrupt_notice`);
under ``reprieve-supervisor``, also its resize signal (a grow: a stop at the next step saved to the memory tier,
:func:`resize_notice`).

Every source hands :class:`~reprieve.notice.Notice` objects to a :class:`NoticeHub`, whose one thread passes
them to the sink (the agreement). Sources never raise into training and never block it: the SIGTERM handler
only enqueues, pollers run in daemon threads and log their failures.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .background import Daemon
from .notice import (
    NOTICE_ANNOTATION,
    RESIZE_REASON,
    Notice,
    notice_from_annotations,
    parse_downward_file,
    sigterm_notice,
    user_notice,
)

log = logging.getLogger(__name__)

INTERRUPT_REASON = "interrupt"


def interrupt_notice(now: float, *, pod: str | None, process_id: int) -> Notice:
    """The notice a Ctrl-C under ``reprieve run`` implies: stop now. No deadline to train towards (``deadline_known``
    False, the deadline ``now``): the agreement saves at the earliest step every process can and the job exits."""
    return Notice(id=f"{INTERRUPT_REASON}/{pod or 'local'}/{process_id}", source="sigint", reason=INTERRUPT_REASON,
                  deadline=now, received_at=now, deadline_known=False)


def resize_notice(now: float, *, pod: str | None, process_id: int) -> Notice:
    """The notice the supervisor's resize signal implies (the gang grows and this pod stays): stop at the earliest
    step every process can, as :func:`interrupt_notice`; the agreed save goes to the memory tier alone when every
    process holds it there (:func:`reprieve.policy.agreed_to_memory`)."""
    return Notice(id=f"{RESIZE_REASON}/{pod or 'local'}/{process_id}", source="resize-signal", reason=RESIZE_REASON,
                  deadline=now, received_at=now, deadline_known=False)


def _urgency(notice: Notice) -> str:
    """The end of the hub's line about a new notice: what its deadline means."""
    if notice.reason == INTERRUPT_REASON:
        return " (Ctrl-C under reprieve run: save at the next step and exit)"
    if notice.reason == RESIZE_REASON:
        return " (the gang grows: save at the next step to the memory tier and exit)"
    return "" if notice.deadline_known else " (deadline unknown: save at once)"


class NoticeHub:
    """Fan-in of all sources. :meth:`put` is safe from a signal handler; the sink runs on the hub thread."""

    def __init__(self, sink: Callable[[Notice], None], *, on_notice: Callable[[Notice], None] | None = None,
                 idle_check: Callable[[], None] | None = None, idle_s: float = 1.0,
                 in_force: Callable[[], str | None] | None = None) -> None:
        self._sink = sink
        self._on_notice = on_notice
        self._in_force = in_force  # what the agreement has made of the notices so far, for "already in force"
        self._idle_check = idle_check
        self._idle_s = idle_s
        self._queue: queue.SimpleQueue[Notice | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._seen: set[str] = set()

    def put(self, notice: Notice) -> None:
        self._queue.put(notice)

    def start(self) -> NoticeHub:
        self._thread = threading.Thread(target=self._run, name="reprieve-notices", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._queue.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    def _run(self) -> None:
        while True:
            try:
                notice = self._queue.get(timeout=self._idle_s)
            except queue.Empty:
                if self._idle_check is not None:
                    self._idle_check()
                continue
            if notice is None:
                return
            if notice.id not in self._seen:
                self._seen.add(notice.id)
                log.info("notice %s via %s: reason %s, deadline in %.1fs%s", notice.id, notice.source,
                         notice.reason, notice.deadline - time.time(), _urgency(notice))
                if self._on_notice is not None:
                    self._on_notice(notice)
            else:  # a second SIGTERM during the countdown, the same notice re-delivered: said, not silently dropped
                state = self._in_force() if self._in_force is not None else None
                log.info("notice %s via %s again: notice already in force (%s); nothing changes", notice.id,
                         notice.source, state or "being agreed")
            try:
                self._sink(notice)
            except Exception:  # a broken sink must not kill the hub; the next notice may get through
                log.exception("handling notice %s failed", notice.id)


class SigtermSource:
    """SIGTERM -> notice with deadline receipt + grace. Chains the handler that was installed before.

    ``interrupt`` (default: the process is a trainer of ``reprieve run``, :func:`.supervisor.contract.
    under_local_run`): SIGINT -> :func:`interrupt_notice` as well. ``reprieve run`` puts its trainer in a process
    group of its own and forwards the terminal's Ctrl-C as SIGINT; anywhere else SIGINT stays Python's
    ``KeyboardInterrupt``. ``resize`` (default: the process is a trainer of ``reprieve-supervisor``): its
    :data:`.supervisor.contract.RESIZE_SIGNAL` -> :func:`resize_notice`.

    Python lets only the main thread install handlers, and a later ``signal.signal(SIGTERM, ...)`` silently
    replaces ours; :meth:`check` (called by the hub about once a second) warns once when that happened.
    """

    def __init__(self, hub: NoticeHub, *, grace_seconds: float, pod: str | None, process_id: int,
                 clock: Callable[[], float] = time.time, interrupt: bool | None = None,
                 resize: bool | None = None) -> None:
        from .supervisor.contract import RESIZE_SIGNAL, under_local_run, under_supervisor

        self._hub = hub
        self._grace = grace_seconds
        self._pod = pod
        self._pid = process_id
        self._clock = clock
        self._interrupt = under_local_run(os.environ) if interrupt is None else interrupt
        self._resize_sig = RESIZE_SIGNAL if (under_supervisor(os.environ) if resize is None else resize) else None
        self._previous: Any = None
        self._previous_int: Any = None
        self._previous_resize: Any = None
        self._installed = False
        self._warned = False

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            log.warning("reprieve.init() ran off the main thread: no SIGTERM handler installed; "
                        "SIGTERM will kill the process without a checkpoint")
            return False
        self._previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._handle)
        if self._interrupt:
            self._previous_int = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handle_interrupt)
        if self._resize_sig is not None:
            self._previous_resize = signal.getsignal(self._resize_sig)
            signal.signal(self._resize_sig, self._handle_resize)
        self._installed = True
        return True

    @property
    def takes_resize(self) -> bool:
        """Whether the supervisor's resize signal is taken (a trainer of ``reprieve-supervisor``)."""
        return self._resize_sig is not None

    def uninstall(self) -> None:
        if self._installed and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) == self._handle:
                signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            if self._interrupt and signal.getsignal(signal.SIGINT) == self._handle_interrupt:
                signal.signal(signal.SIGINT, self._previous_int if self._previous_int is not None
                              else signal.default_int_handler)
            if self._resize_sig is not None and signal.getsignal(self._resize_sig) == self._handle_resize:
                signal.signal(self._resize_sig, self._previous_resize if self._previous_resize is not None
                              else signal.SIG_DFL)
            self._installed = False

    def check(self) -> None:
        if not self._installed or self._warned:
            return
        current = signal.getsignal(signal.SIGTERM)
        if current == signal.SIG_IGN and _exiting.is_set():
            return  # the runtime's own exit path (ignore_termination_signals), not a user's handler
        if current != self._handle:
            self._warned = True
            log.warning("the SIGTERM handler of reprieve was replaced by %r: SIGTERM will not trigger a "
                        "checkpoint. Install your handler before reprieve.init() (it will be chained).", current)

    def _handle(self, signum: int, frame: Any) -> None:
        self._hub.put(sigterm_notice(self._clock(), self._grace, pod=self._pod, process_id=self._pid))
        previous = self._previous
        if callable(previous):
            previous(signum, frame)

    def _handle_interrupt(self, signum: int, frame: Any) -> None:
        # not chained: Python's own handler would raise KeyboardInterrupt into the step that is to be saved
        self._hub.put(interrupt_notice(self._clock(), pod=self._pod, process_id=self._pid))

    def _handle_resize(self, signum: int, frame: Any) -> None:
        self._hub.put(resize_notice(self._clock(), pod=self._pod, process_id=self._pid))
        previous = self._previous_resize
        if callable(previous):
            previous(signum, frame)


_exiting = threading.Event()  # set once the process ignores termination signals on its way out


def ignore_termination_signals() -> None:
    """SIGTERM, SIGINT, SIGHUP and the supervisor's resize signal ignored until the process ends (main thread only:
    Python lets no other thread change handlers), once the exit code is decided. Putting back ``SIG_DFL`` instead
    let a SIGTERM in the last 0.1-0.2 s turn a committed restart (42) into 143 (and a resize signal into 138).
    :meth:`SigtermSource.check` knows it is the runtime's."""
    from .supervisor.contract import RESIZE_SIGNAL

    if threading.current_thread() is not threading.main_thread():
        return
    _exiting.set()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, RESIZE_SIGNAL):
        signal.signal(sig, signal.SIG_IGN)


class PollingSource(Daemon):
    """Calls ``poll()`` every ``interval_s`` in a daemon thread and forwards the notices it returns."""

    def __init__(self, name: str, poll: Callable[[], Notice | None], hub: NoticeHub, interval_s: float) -> None:
        super().__init__(f"reprieve-{name}")
        self.name = name
        self._poll = poll
        self._hub = hub
        self._interval = interval_s
        self._failing = False
        self._last_id: str | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self._poll()
                if self._failing:
                    log.info("notice source %s works again", self.name)
                    self._failing = False
            except Exception as err:  # noqa: BLE001 - a failing source must not stop polling
                notice = None
                if not self._failing:
                    log.warning("notice source %s failed (%s); will keep trying", self.name, err)
                    self._failing = True
            if notice is not None and notice.id != self._last_id:  # a standing notice is forwarded once
                self._last_id = notice.id
                self._hub.put(notice)
            self._stop.wait(self._interval)


class NoticeFile:
    """Reads ``REPRIEVE_NOTICE_FILE`` (downward-API annotations) and returns the notice in it, if any."""

    def __init__(self, path: str, clock: Callable[[], float] = time.time, *, attempt: int | None = None,
                 started_at: float | None = None) -> None:
        self.path = path
        self._clock = clock
        self._attempt = attempt  # notices delivered to another attempt are ignored
        self._started_at = started_at  # a notice past its deadline by then: notice.stale_at_start
        self._last_value: str | None = None
        self._last_notice: Notice | None = None

    def __call__(self) -> Notice | None:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except FileNotFoundError:
            return None
        annotations = parse_downward_file(text)
        value = annotations.get(NOTICE_ANNOTATION)
        if value is None:
            self._last_value, self._last_notice = None, None
        elif value != self._last_value:  # parse (and log problems) once per notice, not per change of the file
            self._last_value = value   # (other annotations, e.g. the progress heartbeat, change it every few s)
            self._last_notice = notice_from_annotations(annotations, self._clock(), source="notice-file",
                                                        attempt=self._attempt, started_at=self._started_at)
        return self._last_notice


class UserCallable:
    """Wraps a user callable (see :func:`reprieve.notice.user_notice` for what it may return)."""

    def __init__(self, fn: Callable[[], Any], *, default_grace_seconds: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._fn = fn
        self._grace = default_grace_seconds
        self._clock = clock

    def __call__(self) -> Notice | None:
        return user_notice(self._fn(), self._clock(), default_grace_seconds=self._grace)
