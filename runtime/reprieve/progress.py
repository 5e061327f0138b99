"""Process 0's progress reports: the ``reprieve.dev/progress`` annotation on its own pod.

What the operator needs for goodput accounting (``docs/contract.md``, "Progress"; ``docs/goodput.md``): the
attempt, the last finished step and when, the first step this attempt computed and when, the typical step
time, the seconds spent restoring and the seconds the loop was blocked by saves.

The training thread never waits for a report: per step it stores one tuple in :class:`LoopProgress` (about
50 ns; ``benchmarks/progress.py`` measures it against a loop without reporting). A daemon thread reads those
attributes every ``REPRIEVE_PROGRESS_INTERVAL_SECONDS`` (5 s) and patches the annotation when the step moved;
commits report at once (rate-limited), the exit paths synchronously with a bounded timeout, and also into the
container's termination message (:mod:`reprieve.termination`: a job that ends while the API server is down still
tells the operator its last steps). Failures are logged, never fatal.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

from . import termination
from .notice import PROGRESS_ANNOTATION, format_rfc3339

if TYPE_CHECKING:
    from .kube import KubeClient

log = logging.getLogger(__name__)

# annotation key -> decimals it is rounded to (epoch times to the millisecond)
LIVE_FIELDS = {"stepAt": 3, "stepSeconds": 6, "firstStep": None, "firstStepAt": 3, "restoreSeconds": 3,
               "saveBlockingSeconds": 3, "restoredFrom": None, "memoryStep": None, "savedStepsAt": None,
               "failedSaves": None, "lastSaveError": None, "memoryOff": None}
SAVED_KEPT = 2  # per kind (storage, memory): the newest saved steps whose finish times a report carries


class LoopProgress:
    """Where the training loop is, written by the training thread, read by any thread (plain attribute
    stores and loads: each is atomic, and the reporter tolerates a report one step behind)."""

    def __init__(self) -> None:
        # perf_counter -> wall clock once, so the training thread never calls time.time()
        self.wall_offset = time.time() - time.perf_counter()
        self.last: tuple[int, float] | None = None  # (last finished step, perf_counter when it finished)
        self.first: tuple[int, float] | None = None  # the same for the first step this attempt computed
        self.step_seconds: float | None = None
        self.restore_seconds = 0.0
        self.save_blocking_seconds = 0.0
        # kind ("storage", "memory") -> {step: perf_counter when the loop finished it}, newest SAVED_KEPT each:
        # where a next attempt may resume, so the operator splits kept from lost time there (docs/goodput.md)
        self.saved: dict[str, dict[int, float]] = {}
        # memory tier hook (reprieve.memtier): where the restore read from, and more fields from its reporter
        self.restored_from: dict[str, Any] | None = None
        self.extra_fields: Callable[[], dict[str, Any]] | None = None
        # storage saves that failed in a row (0 again after a commit) and the last failure ("step N: cause"),
        # None until a save of this attempt failed (docs/contract.md, "Progress")
        self.failed_saves = 0
        self.last_save_error: str | None = None

    def mark_saved(self, step: int, kind: str, t: float) -> None:
        """A save of ``step`` (``kind``: storage or memory) started; the loop finished the step at ``t``
        (perf_counter). Called by the training thread at the save, never per step."""
        saved = self.saved.setdefault(kind, {})
        saved[step] = t
        while len(saved) > SAVED_KEPT:
            del saved[min(saved)]
        self.saved = dict(self.saved)  # a fresh top-level dict: a reader never sees one being resized

    def fields(self) -> dict[str, Any]:
        """The live part of the annotation (empty before the first step finished)."""
        last, first = self.last, self.first
        if last is None or first is None:
            return {}
        out: dict[str, Any] = {"step": last[0], "stepAt": last[1] + self.wall_offset, "firstStep": first[0],
                               "firstStepAt": first[1] + self.wall_offset,
                               "restoreSeconds": self.restore_seconds,
                               "saveBlockingSeconds": self.save_blocking_seconds}
        if self.step_seconds is not None:
            out["stepSeconds"] = self.step_seconds
        saved = {step: t for kind in list(self.saved.values()) for step, t in list(kind.items())}
        if saved:
            out["savedStepsAt"] = [[step, round(saved[step] + self.wall_offset, 3)] for step in sorted(saved)]
        if self.restored_from is not None:
            out["restoredFrom"] = self.restored_from
        if self.last_save_error is not None:
            out["failedSaves"] = self.failed_saves
            out["lastSaveError"] = self.last_save_error
        if self.extra_fields is not None:
            try:
                out.update(self.extra_fields())
            except Exception as err:  # noqa: BLE001 - a report, never a reason to fail
                log.debug("extra progress fields failed: %s", err)
        return out


def progress_annotation(step: int, committed_step: int, attempt: int, now: float,
                        live: dict[str, Any] | None = None) -> dict[str, str]:
    """The ``reprieve.dev/progress`` annotation (``docs/contract.md``, "Progress"); pure."""
    value: dict[str, Any] = {"step": step, "committedStep": committed_step, "attempt": attempt,
                             "time": format_rfc3339(now)}
    for key, digits in LIVE_FIELDS.items():
        v = (live or {}).get(key)
        if v is not None:
            value[key] = v if digits is None else round(float(v), digits)
    return {PROGRESS_ANNOTATION: json.dumps(value, sort_keys=True)}


class ProgressReporter:
    """Process 0 patches its own pod's progress annotation: live every ``interval_s`` once :meth:`start`\\ ed
    and at once when the attempt's first step finished (:meth:`first_step`), at commits at most every
    ``min_interval_s`` (:meth:`report`), and synchronously on the exit paths."""

    def __init__(self, client: KubeClient, namespace: str, pod: str, attempt: int, *,
                 min_interval_s: float = 10.0, interval_s: float = 5.0,
                 clock: Callable[[], float] = time.time, termination_log: str = termination.TERMINATION_LOG) -> None:
        self._client = client
        self._termination_log = termination_log
        self._ns = namespace
        self._pod = pod
        self._attempt = attempt
        self._min_interval = min_interval_s
        self._interval = interval_s
        self._clock = clock
        self._last = float("-inf")
        self._busy = threading.Lock()
        self._source: Callable[[], dict[str, Any]] = dict
        self._committed = -1
        self._sent_step: int | None = None
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self.patches = 0  # how many patches were sent (tests and the benchmark read it)
        self.cpu_seconds = 0.0  # CPU time of the live reports' thread (what it can take from the training thread)

    def start(self, source: Callable[[], dict[str, Any]]) -> Self:
        """Report ``source()`` (:meth:`LoopProgress.fields`) every ``interval_s`` while the step moves."""
        self._source = source
        if self._interval > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="reprieve-progress", daemon=True)
            self._thread.start()
        return self

    def first_step(self) -> None:
        """The attempt's first step finished: the live report goes now, not up to ``interval_s`` later, so an
        attempt cut off from the API server seconds after it started has still said where it started (the
        operator counts the steps after it as lost, not as start-up: ``docs/goodput.md``)."""
        self._kick.set()

    def _run(self) -> None:
        while True:
            self._kick.wait(self._interval)
            self._kick.clear()
            if self._stop.is_set():
                return
            t0 = time.thread_time()
            live = self._source()
            step = live.get("step")
            if step is not None and step != self._sent_step:
                with self._busy:
                    self._send(int(step), self._committed, live, min(self._interval, 5.0))
            self.cpu_seconds += time.thread_time() - t0

    def report(self, step: int, committed_step: int, *, force: bool = False, timeout_s: float = 5.0) -> None:
        """A commit. Force: :meth:`final`, waited for (a send in flight first, then this one's ``timeout_s``).
        Else: rate-limited, in a thread."""
        now = self._clock()
        if force:
            self._last = now
            self.final(step, committed_step, timeout_s=timeout_s).join()
            return
        self._committed = max(self._committed, committed_step)
        if now - self._last < self._min_interval:
            return
        self._last = now
        live = self._source()
        step = max(step, int(live.get("step", step)))
        if self._busy.acquire(blocking=False):
            def run() -> None:
                try:
                    self._send(step, self._committed, live, timeout_s)
                finally:
                    self._busy.release()
            threading.Thread(target=run, name="reprieve-progress-commit", daemon=True).start()

    def final(self, step: int, committed_step: int, *, timeout_s: float) -> threading.Thread:
        """The exit path's report, sent beside the rest of the teardown: its body is taken now (before anything it
        reads closes) and left in the termination message now (read even if the API server is down, or the patch is
        cut off by the exit); the patch goes in the thread returned, after a send still in flight (each bounded by
        its timeout: ``timeout_s`` for this one), and the caller joins it before the process ends: on the restart
        path the close does not wait for its round trip (benchmarks/RESULTS.md, "Goodput")."""
        self._committed = max(self._committed, committed_step)
        live = self._source()
        step = max(step, int(live.get("step", step)))
        body = progress_annotation(step, self._committed, self._attempt, self._clock(), live)
        termination.write({"progress": json.loads(body[PROGRESS_ANNOTATION])}, self._termination_log)

        def run() -> None:
            with self._busy:
                self._patch(step, body, timeout_s)

        thread = threading.Thread(target=run, name="reprieve-progress-final", daemon=True)
        thread.start()
        return thread

    def _send(self, step: int, committed: int, live: dict[str, Any], timeout_s: float) -> dict[str, str]:
        body = progress_annotation(step, committed, self._attempt, self._clock(), live)
        self._patch(step, body, timeout_s)
        return body

    def _patch(self, step: int, body: dict[str, str], timeout_s: float) -> None:
        try:
            self._client.patch_pod_annotations(self._ns, self._pod, dict(body), timeout_s=timeout_s)
            self._sent_step = step
            self.patches += 1
            log.debug("progress annotation of %s/%s: %s", self._ns, self._pod, body)
        except Exception as err:  # noqa: BLE001 - progress is best effort, never fatal
            log.warning("could not patch progress annotation of pod %s/%s: %s", self._ns, self._pod, err)

    def close(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=self._interval + 6.0)
            self._thread = None
