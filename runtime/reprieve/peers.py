"""One line naming a peer that stopped, before JAX ends this process because of it.

When a process of the job dies (SIGKILL, out of memory, its node gone), JAX's coordination service notices its
missing heartbeats after ``REPRIEVE_HEARTBEAT_TIMEOUT_SECONDS`` and ends every other process at once with SIGABRT
and "another task died", naming no one in the process's own terms. JAX gives Python no hook before that abort,
so every process keeps a small liveness record of its own in the coordination service's key-value store
(``reprieve/<attempt>/alive/<process>``: a counter and its pod, rewritten every ``interval``), and process 0
reads them all: a record that has not changed for half the heartbeat timeout is logged, naming the process and
its pod, while JAX is still waiting for the rest of its timeout. (A process whose Python threads stall that long,
a long call that holds the GIL, is reported too: the line says "not heard from", and a second one says when it
is heard from again.) If process 0 itself dies, the service goes with it and JAX ends the others within
milliseconds: each names process 0 from an idle connection to the service that closes in that instant
(:mod:`reprieve.tether`), or when the service refuses its liveness record.

Process 0 also publishes the silent set (``reprieve/<attempt>/silent/set``: a JSON list, rewritten when it
changes) and every other process reads it, so each process knows, before JAX ends it, which peers it is about to
be ended for (the service gone: process 0, its host). ``on_lost`` hears every change of that set: the runtime
tells its supervisor (``reprieve-supervisor`` names them in its exit report, ``peerLost``) and writes them into the
container's termination message (Recreate: the kubelet copies it into the pod's status when the container ends),
so the operator counts the exit as the loss of that peer, not as a failure of this process
(``docs/contract.md``).

**A lost peer ends the gang within ``REPRIEVE_PEER_LOST_SECONDS`` (2 s).** Every process but 0 keeps a pulse
(:mod:`reprieve.pulse`: a port of its own, written into its record) and process 0 holds a link to each: a process
that dies closes its link at once, and one whose node vanished or that is cut off stops beating and does not answer
a connect. Either way process 0 names it and ends (SIGABRT, as JAX would at its timeout), which takes the
coordination service with it and ends every other process within milliseconds: each finds the service gone through
its tether (:mod:`reprieve.tether`). A process that is alive but busy (compiling, restoring, a long step, stopped)
answers the connect and is left alone. The job restarts seconds sooner; nothing else changes (the exit is the one
JAX would have forced, reported as the same peers' loss). The operator probes the pod for the same reason
(``reprieve_operator.reconcile.unreachable``).

The silence threshold (half the heartbeat timeout, plus the polling interval) can lose the race against JAX's
abort on a loaded machine. A collective that fails because a peer died names that peer's address, so
:meth:`PeerWatch.blame` maps it to a process at once (:mod:`reprieve.collective_error`) and reports it the same
way; a process blamed so stays in the reported set (the watch's own findings are added to it, never remove it).

:class:`Liveness` is the decision (an owner with an injected clock, table-tested); :class:`PeerWatch` is the
thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Self

from . import termination
from .background import Daemon
from .collective_error import GLOO_PREFIX, blamed_processes, gloo_addresses
from .coordination import CoordinationError, Coordinator
from .pulse import (
    DEAD,
    DEFAULT_PEER_LOST_SECONDS,
    GONE,
    PROBE_TIMEOUT_SECONDS,
    PulseLinks,
    PulseServer,
    PulseWatch,
    timings,
)
from .tether import ServiceTether

log = logging.getLogger(__name__)


class Liveness:
    """What process 0 makes of the liveness records it reads: ``observe(records, now)`` -> events.

    An event is ``("silent", process, seconds)`` once a process's record has not changed for ``threshold_s``, and
    ``("back", process, seconds)`` when it changes again after that. A process whose record never appeared counts
    from the first observation (it joined the job, so it wrote one at once)."""

    def __init__(self, processes: list[int], threshold_s: float, now: float) -> None:
        self.threshold_s = threshold_s
        self._last: dict[int, tuple[Any, float]] = {p: (None, now) for p in processes}
        self._silent: set[int] = set()

    @property
    def silent(self) -> tuple[int, ...]:
        """The processes silent now (sorted)."""
        return tuple(sorted(self._silent))

    def observe(self, records: dict[int, Any], now: float) -> list[tuple[str, int, float]]:
        events: list[tuple[str, int, float]] = []
        for p, (value, since) in self._last.items():
            current = records.get(p)
            if current is not None and current != value:
                if p in self._silent:
                    self._silent.discard(p)
                    events.append(("back", p, now - since))
                self._last[p] = (current, now)
            elif p not in self._silent and now - since >= self.threshold_s:
                self._silent.add(p)
                events.append(("silent", p, now - since))
        return events

    def lose(self, p: int) -> None:
        """``p`` is lost (its pulse says so, :mod:`reprieve.pulse`): silent now, before the threshold."""
        self._silent.add(p)


def lost_line(process: int, n: int, pod: str | None, kind: str, address: tuple[str, int], seconds: float,
              heartbeat_s: float, committed: int | None) -> str:
    """The line process 0 logs for a peer its pulse finds ``DEAD`` or ``GONE`` (pure)."""
    where = f" (pod {pod})" if pod else ""
    at = f"{address[0]}:{address[1]}"
    what = (f"has ended without leaving the job: its link to this process closed and its pulse at {at} refuses "
            "(killed, out of memory or crashed)" if kind == DEAD else
            f"has not been heard from for {seconds:.1f} s and its pulse at {at} does not answer within "
            f"{PROBE_TIMEOUT_SECONDS:.1f} s: its node is gone or it is cut off the network")
    resume = ("its start: there is no checkpoint yet" if committed is None else
              f"the last committed checkpoint, step {committed}")
    return (f"process {process} of {n}{where} {what}; ending this process now rather than at JAX's heartbeat "
            f"timeout ({heartbeat_s:.0f} s), so the job restarts without waiting, from {resume}")


def end_process(why: str) -> None:
    """End this process as JAX's heartbeat timeout would (SIGABRT), after flushing the logs: the early end of
    :class:`PeerWatch` (``why``: what was found)."""
    log.error("ending process %d now: %s", os.getpid(), why)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # ending anyway
            handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    with termination.held():  # not in the middle of another thread's termination message (the exit path's)
        os.abort()


def silent_line(process: int, n: int, pod: str | None, seconds: float, heartbeat_s: float,
                committed: int | None) -> str:
    """The line process 0 logs for a silent peer (pure)."""
    where = f" (pod {pod})" if pod else ""
    resume = "the last committed checkpoint" if committed is None else f"the last committed checkpoint, step {committed}"
    return (f"process {process} of {n}{where} has not been heard from for {seconds:.1f} s: if it has died (killed, "
            f"out of memory, its node gone), JAX ends this process within about {max(0.0, heartbeat_s - seconds):.0f}"
            f" s (\"another task died\") and the job restarts from {resume}")


def termination_message(processes: tuple[int, ...], gone: tuple[int, ...] = ()) -> str:
    """The container's termination message of a process that only knows ``processes`` are silent (``""``:
    none), ``gone`` of them not answering: what the operator reads from a Recreate pod's ``state.terminated.message``
    (pure)."""
    return termination.merged("", lost_fields(processes, gone))


def lost_fields(processes: tuple[int, ...], gone: tuple[int, ...] = ()) -> dict[str, object]:
    """``peerLost`` and, when some of them did not answer their pulse, ``peerGone`` (pure)."""
    gone = tuple(p for p in gone if p in processes)
    return {"peerLost": list(processes), **({"peerGone": list(gone)} if gone else {})}


def write_termination_message(processes: tuple[int, ...], path: str = termination.TERMINATION_LOG, *,
                              attempt: int | None = None, last: tuple[int, float] | None = None,
                              gone: tuple[int, ...] = ()) -> None:
    """Set ``peerLost`` (and ``peerGone``) in the container's termination message (:mod:`reprieve.termination`),
    with the attempt and this process's last finished step and when (``lastStep``, ``lastStepAt``: unix seconds)
    when known; never raises."""
    fields: dict[str, object] = lost_fields(processes, gone)
    if attempt is not None and last is not None:
        fields.update(attempt=attempt, lastStep=last[0], lastStepAt=round(last[1], 3))
    termination.write(fields, path)


class PeerWatch(Daemon):
    """Every process writes its liveness record every ``interval``; process 0 also reads them all (see above)."""

    def __init__(self, coordinator: Coordinator, *, attempt: int, pod: str | None, heartbeat_s: float,
                 address: str | None = None, committed: Callable[[], int | None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic,
                 on_lost: Callable[[tuple[int, ...]], None] = lambda processes: None,
                 device_processes: Callable[[], dict[int, int]] = dict, ip: str | None = None,
                 lost_s: float = DEFAULT_PEER_LOST_SECONDS,
                 links: Callable[[float, Callable[[], float]], PulseLinks] = PulseLinks,
                 end: Callable[[str], object] | None = None) -> None:
        """``ip``: this process's pod IP, where its pulse listens (:mod:`reprieve.pulse`); ``lost_s``: the bound
        on knowing a peer lost (``REPRIEVE_PEER_LOST_SECONDS``); ``end``: how to end this process once a peer is
        known lost (:func:`end_process`; None: never early, JAX's timeout ends it, and process 0 links to no
        pulse)."""
        super().__init__("reprieve-peers")
        self._coord = coordinator
        self._pid, self._n = coordinator.process_id, coordinator.num_processes
        self._prefix = f"reprieve/{attempt}/alive/"
        self._pod = pod
        self._heartbeat_s = heartbeat_s
        self._address = address
        self._committed = committed
        self._clock = clock
        self.threshold_s = max(1.0, heartbeat_s / 2)
        self.interval_s = self.threshold_s / 4
        self._ip = ip
        self.lost_s = lost_s
        self._end = end
        # Process 0 links to every peer's pulse, every other process to process 0's (reprieve.pulse); none without
        # an early end to make
        self._links = None if end is None else PulseWatch(links(lost_s, clock), self._act)
        self._pulse: PulseServer | None = None  # every process with an IP: what the links hear
        self._liveness = Liveness([p for p in range(self._n) if p != self._pid], self.threshold_s, clock())
        self._acting = threading.Lock()  # the watch's thread and the links' thread both act
        self._pulses: dict[int, tuple[str, int]] = {}  # process -> its pulse (from its record)
        self._pods: dict[int, str | None] = {}
        self._silent_key = f"reprieve/{attempt}/silent/set"
        self._pulse_key = f"reprieve/{attempt}/pulse/0"  # process 0's record, for the others' link to its pulse
        # a process leaving the job says so here before its pulse closes: a peer that links to it only after that
        # finds the pulse refusing, and must not take it for a loss (a short job whose processes end at once)
        self._left_prefix = f"reprieve/{attempt}/left/"
        self._published: tuple[int, ...] = ()  # process 0: the set last written to the silent key
        self._on_lost = on_lost
        self._device_processes = device_processes  # device id -> process index (jax.devices())
        self.lost: tuple[int, ...] = ()  # the silent processes last reported to ``on_lost``
        self._silent: tuple[int, ...] = ()  # what the watch found (process 0's liveness, or its published set)
        self._blamed: tuple[int, ...] = ()  # what failed collectives named (blame): never taken back
        self._gone: tuple[int, ...] = ()  # what the pulse found GONE (no answer): never taken back
        self._report = threading.Lock()  # the watch's thread and the training thread both report
        self._any_lost = threading.Event()  # the watch found a peer silent
        self._tether: ServiceTether | None = None  # processes but 0: process 0's death, the instant it happens

    @property
    def gone(self) -> tuple[int, ...]:
        """The processes whose pulse did not answer (their node gone, or cut off the network): the operator counts
        them lost without probing them itself (``peerGone``)."""
        return self._gone

    @property
    def found(self) -> tuple[int, ...]:
        """The processes the watch itself finds silent now (without those only a failed collective named)."""
        return self._silent

    def start(self) -> Self:
        if self._pid != 0 and self._address:
            # JAX aborts this process within milliseconds of process 0's death: only a connection that closes in
            # that instant names it in time (reprieve.tether).
            self._tether = ServiceTether(self._address, self._service_gone_for_sure, keepalive_s=self.threshold_s / 2,
                                         knock_s=max(1.0, self.threshold_s / 2)).start()
        if self._ip and self._n > 1:
            try:
                self._pulse = PulseServer(self._ip, timings(self.lost_s)[0],
                                          watchers=self._n - 1 if self._pid == 0 else 1).start()
                log.info("process %d's pulse listens at %s:%d (%s names this process lost within %.1f s of its "
                         "end)", self._pid, self._ip, self._pulse.port,
                         "every other process" if self._pid == 0 else "process 0", self.lost_s)
            except OSError as err:  # the gang still works; a lost peer is then found at the silence threshold
                log.warning("process %d's pulse could not listen on %s (%s): if a peer is lost, the job learns it "
                            "at JAX's heartbeat timeout, not within %.1f s", self._pid, self._ip, err, self.lost_s)
        if self._links is not None:
            self._links.start()
        super().start()
        return self

    def close(self) -> None:
        """Stop, and wait until the thread is out of the coordination client (one inside it at interpreter exit
        aborts the process)."""
        if self._tether is not None:
            self._tether.close()
        if self._links is not None:
            self._links.close()
        if self._pulse is not None:
            try:  # before the pulse closes: a link made after it is refused, and the record says why
                self._coord.set(f"{self._left_prefix}{self._pid}", "1", overwrite=True)
            except (CoordinationError, RuntimeError) as err:
                log.debug("process %d's leaving not recorded: %s", self._pid, err)
            self._pulse.close(leaving=True)  # leaving the job is not a loss: the links hear BYE
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.interval_s + PROBE_TIMEOUT_SECONDS + 2.0)

    def _run(self) -> None:
        counter = 0
        while not self._stop.is_set():
            counter += 1
            try:
                record: dict[str, Any] = {"n": counter, "pod": self._pod}
                if self._ip:
                    record["ip"] = self._ip
                if self._pulse is not None:
                    record["pulse"] = self._pulse.port
                self._coord.set(f"{self._prefix}{self._pid}", json.dumps(record), overwrite=True)
                if counter == 1 and self._pid == 0 and self._pulse is not None:
                    self._coord.set(self._pulse_key, json.dumps(record), overwrite=True)  # what the others link to
                records = self._read() if self._pid == 0 else {}
                if self._pid != 0:
                    self._found(self._read_silent(), "process 0 reports")
                    if self._links is not None and 0 not in self._pulses:
                        self._read_pulse_of_0()
            except (CoordinationError, RuntimeError, ValueError) as err:
                if not self._stop.is_set():
                    self.service_gone(str(err))
                    log.error("the coordination service%s refused process %d's liveness record (%s): a process of "
                              "the job has ended (process 0, the service's host, unless another was named above); "
                              "JAX ends this process too", f" at {self._address}" if self._address else "",
                              self._pid, err)
                return
            # Only process 0 reads the records: another process's liveness would find every peer silent at the
            # threshold (the spurious "process 0 of 2 has not been heard from" after every start, issue 48)
            events = self._liveness.observe(records, self._clock()) if self._pid == 0 else []
            if self._act(events):
                return
            if self._links is not None:
                for p, address in self._pulses.items():
                    self._links.target(p, address)
            expected = self._n - 1 if self._pid == 0 else 1
            settled = self._links is None or self._links.settled(expected)
            self._stop.wait(self.interval_s if settled else min(self.interval_s, 0.25))

    def _read_pulse_of_0(self) -> None:
        try:
            value = self._get_json(self._pulse_key)
        except ValueError:  # not JSON: not a record of this runtime's
            return
        address = pulse_of(value)
        if address is not None:
            self._pulses[0] = address
            self._pods[0] = value.get("pod") if isinstance(value, dict) else None

    def _left(self, p: int) -> bool:
        """Whether process ``p`` recorded that it left the job (:meth:`close`); False when that cannot be read. Asked
        only of a pulse that refused (a process that left refuses): one that does not answer may be process 0 on a
        stopped or cut-off host, whose coordination service would not answer either, and the watch must not wait."""
        try:
            return self._get_json(f"{self._left_prefix}{p}") == 1
        except (CoordinationError, RuntimeError, ValueError):
            return False

    def _get_json(self, key: str) -> Any:
        """The JSON value at ``key`` (read through its directory: the coordinator has no non-blocking get); None
        when it is absent. Raises ValueError when it is not JSON."""
        directory, _, name = key.rpartition("/")
        found = self._coord.dir_get(directory + "/")
        raw = next((v for k, v in found.items() if k.rsplit("/", 1)[-1] == name), None)
        return json.loads(raw) if raw else None

    def _act(self, events: list[tuple[str, int, float]]) -> bool:
        """Say each event, publish and report what changed; end this process for a lost peer (with ``end``):
        whether it ended."""
        with self._acting:
            liveness = self._liveness
            lost: list[str] = []
            for kind, p, seconds in events:
                if kind == "silent":
                    log.warning("%s", silent_line(p, self._n, self._pods.get(p), seconds, self._heartbeat_s,
                                                  self._committed()))
                elif kind == DEAD and self._left(p):  # refused: its host answers, so does the service
                    log.info("process %d of %d left the job before this process linked to its pulse: not a loss",
                             p, self._n)
                elif kind in (DEAD, GONE):
                    liveness.lose(p)
                    if kind == GONE:
                        self._gone = _union(self._gone, (p,))
                    lost.append(lost_line(p, self._n, self._pods.get(p), kind, self._pulses[p], seconds,
                                          self._heartbeat_s, self._committed()))
                else:
                    log.info("process %d of %d is heard from again after %.1f s", p, self._n, seconds)
            if self._pid == 0:
                self._publish(_union(liveness.silent, self._blamed))
                if liveness.silent != self._silent:
                    self._found(liveness.silent, "")
            elif lost:
                self._found(_union(self._silent, liveness.silent), "")
            if lost and self._end is not None and not self._stop.is_set():
                self.report_again()
                self._end("; ".join(lost))  # says them (end_process's line)
                return True
            for line in lost:
                log.error("%s", line)
            return False

    def _publish(self, silent: tuple[int, ...]) -> None:
        """Process 0: write the silent set where every other process reads it, when it changed."""
        if silent == self._published:
            return
        self._published = silent
        try:
            self._coord.set(self._silent_key, json.dumps(list(silent)), overwrite=True)
        except (CoordinationError, RuntimeError, ValueError) as err:
            log.debug("the silent set was not published: %s", err)

    def _service_gone_for_sure(self, why: str) -> None:
        """The tether's knock found the coordination service gone (refused, reset or no answer): report process 0
        (unless another is named) and, with ``end``, end this process now rather than at JAX's heartbeat timeout
        (a service that died on a live host has JAX end this process within milliseconds anyway)."""
        self.service_gone(why)
        if self._end is not None and not self._stop.is_set():
            self.report_again()
            self._end(f"the coordination service is gone ({why}): process 0's pod does not answer or its "
                      f"service ended; ending this process now rather than at JAX's heartbeat timeout")

    def service_gone(self, why: str) -> None:
        """The coordination service is gone (``why``): process 0, its host, is reported, unless another process
        is already (JAX ending process 0 for that loss takes the service with it). Not on process 0 itself."""
        if self._pid != 0 and not self.lost:
            log.debug("the coordination service is gone: %s", why)
            self._found((0,), "the coordination service is gone:")

    def _found(self, processes: tuple[int, ...], source: str) -> None:
        """What the watch finds silent now; the union with the blamed processes is reported."""
        self._silent = processes
        if processes:
            self._any_lost.set()
        else:
            self._any_lost.clear()
        self._lost(source)

    def _lost(self, source: str) -> None:
        """Tell ``on_lost`` the silent and blamed processes, once per change of that set."""
        with self._report:
            processes = _union(self._silent, self._blamed)
            if processes == self.lost:
                return
            self.lost = processes
            if source and processes:
                log.warning("%s process(es) %s of %d silent: if JAX ends this process for them, its exit is reported "
                            "as their loss", source, ", ".join(map(str, processes)), self._n)
            try:
                self._on_lost(processes)
            except Exception as err:  # noqa: BLE001 - a report is best effort; the watch goes on
                log.warning("peer-lost report failed: %s: %s", type(err).__name__, err)

    def report_again(self) -> None:
        """Tell ``on_lost`` the reported processes again (not when none): what the runtime sends with them, its
        last finished step, may have moved since (a step that was past its collectives when the peer died
        finishes). Called once on the exit path, after :meth:`wait_lost`."""
        with self._report:
            if not self.lost:
                return
            try:
                self._on_lost(self.lost)
            except Exception as err:  # noqa: BLE001 - a report is best effort
                log.warning("peer-lost report failed: %s: %s", type(err).__name__, err)

    def blame(self, error: str) -> tuple[int, ...]:
        """The processes a failed collective's ``error`` names (:mod:`reprieve.collective_error`), reported at once
        through ``on_lost`` (the supervisor hears of them before JAX can abort this process); ``()`` when it names
        none for sure (then nothing changes). Never raises: the service may be gone too."""
        try:
            addresses = gloo_addresses(self._coord.dir_get_bytes(GLOO_PREFIX), self._device_processes())
        except Exception as err:  # noqa: BLE001 - best effort: the watch still names the peer if it can
            log.debug("the gloo addresses were not read: %s", err)
            return ()
        named = blamed_processes(error, addresses, self._pid)
        if named:
            self._blamed = _union(self._blamed, named)
            self._lost("the failed collective names")
        return named

    def wait_lost(self, error: str = "") -> tuple[int, ...]:
        """For a process whose collective just failed with ``error``: report the peers it names at once
        (:meth:`blame`), then wait (at most the time it takes to find a peer silent and hear of it) until the watch
        finds a peer silent; the reported processes, or ``()``. A peer that died on a node that still answers resets
        its connections at once, long before JAX's heartbeat timeout. The wait stays even when the error named
        the peer: this process leaving the job early would close its own connections, and other survivors' errors
        would then name it."""
        self.blame(error)
        self._any_lost.wait(self.threshold_s + 2 * self.interval_s)
        return self.lost

    def _read_silent(self) -> tuple[int, ...]:
        try:
            value = self._get_json(self._silent_key)
        except ValueError:
            return self._silent
        if value is None:
            return ()
        return tuple(sorted({p for p in value if type(p) is int})) if isinstance(value, list) else self._silent

    def _read(self) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for key, raw in self._coord.dir_get(self._prefix).items():
            tail = key.rsplit("/", 1)[-1]
            if not tail.isdigit():
                continue
            try:
                value = json.loads(raw)
            except ValueError:
                continue
            p = int(tail)
            out[p] = value.get("n")
            self._pods[p] = value.get("pod")
            address = pulse_of(value)
            if address is not None and p not in self._pulses:
                self._pulses[p] = address
        return out


def pulse_of(record: Any) -> tuple[str, int] | None:
    """The pulse a liveness record names (its pod IP and its pulse's port), or None (an older runtime's record, no
    IP, a malformed value) (pure)."""
    if not isinstance(record, dict):
        return None
    ip, port = record.get("ip"), record.get("pulse")
    return (ip, port) if isinstance(ip, str) and ip and type(port) is int else None


def _union(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(set(a) | set(b)))
