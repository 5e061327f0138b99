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

**A peer that does not answer ends the gang early.** A process that dies on a host that still answers resets its
connections, and its survivors' collectives fail at once; a node that vanishes, or a pod cut off the network,
closes nothing, and the survivors would sit in their collectives until JAX's heartbeat timeout. So process 0
probes the pod of a peer whose record has not changed for ``probe_after_s`` (two missed writes, before the
silence threshold): a TCP connect to its pod IP (each record carries it) on ``probe_port``. A connect that is
refused or accepted is an answer (the pod is there: a slow or stalled process, left to the threshold and JAX); no
answer within ``probe_timeout_s`` (or an unreachable host) means the peer is gone or cut off: it is reported at
once, and process 0 ends (SIGABRT, as JAX would at its timeout), which takes the coordination service with it and
ends every other process within milliseconds. Every other process does the same when its tether's knock finds
the service gone (:mod:`reprieve.tether`: the knock is its probe). The job restarts seconds sooner; nothing else
changes (the exit is the one JAX would have forced, reported as the same peers' loss). The operator probes the
same address for the same reason (``reprieve_operator.reconcile.unreachable``).

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
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Self

from . import termination
from .background import Daemon
from .collective_error import GLOO_PREFIX, blamed_processes, gloo_addresses
from .coordination import CoordinationError, Coordinator
from .tether import ServiceTether, unanswered_connect

log = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 1.5  # a pod that accepts no connect within this (a SYN and its first resend) is gone


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

    def quiet(self, now: float, after_s: float) -> list[int]:
        """The processes not silent yet whose records have not changed for ``after_s``: worth a probe."""
        return [p for p, (_, since) in self._last.items() if p not in self._silent and now - since >= after_s]

    def gone(self, p: int, now: float) -> tuple[str, int, float]:
        """``p``'s pod does not answer: silent now, before the threshold; the event ``("gone", p, seconds)``."""
        self._silent.add(p)
        return ("gone", p, now - self._last[p][1])


def tcp_answers(ip: str, port: int, timeout: float) -> bool:
    """Whether ``ip`` answers a TCP connect to ``port`` within ``timeout``: accepted, refused or reset is an
    answer (the pod's network is there; nothing need listen); no answer in time, or an unreachable host, is not
    (:func:`reprieve.tether.unanswered_connect`). Any other error (no file descriptor left, a name that does not
    resolve) says nothing about the peer and counts as an answer: never a reason to end the gang."""
    try:
        socket.create_connection((ip, port), timeout=timeout).close()
    except OSError as err:
        return not unanswered_connect(err)
    return True


def unanswered(ips: Mapping[int, str], port: int, timeout: float,
               answers: Callable[[str, int, float], bool] = tcp_answers) -> set[int]:
    """The processes of ``ips`` (process -> pod IP) whose pods do not answer, probed at once (a thread each): a
    lost node takes all its processes, and probing them one after another would cost their timeouts in a row.
    One address is probed in the caller's thread, and so is each where no thread can start (the interpreter is
    exiting: the watch still runs while a failed step's exit path waits for it)."""
    results: dict[int, bool] = {}

    def probe(p: int) -> None:
        results[p] = answers(ips[p], port, timeout)

    threads: list[threading.Thread] = []
    if len(ips) > 1:
        for p in ips:
            thread = threading.Thread(target=probe, args=(p,), name=f"reprieve-probe-{p}", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # no new threads at interpreter shutdown
                break
            threads.append(thread)
    for thread in threads:
        thread.join()
    for p in ips:
        if p not in results:
            probe(p)
    return {p for p, ok in results.items() if not ok}


def gone_line(process: int, n: int, pod: str | None, ip: str, port: int, seconds: float, timeout: float,
              heartbeat_s: float) -> str:
    """The line process 0 logs for a peer whose pod does not answer (pure)."""
    where = f" (pod {pod})" if pod else ""
    return (f"process {process} of {n}{where} has not been heard from for {seconds:.1f} s and its pod does not "
            f"answer at {ip}:{port} within {timeout:.1f} s: its node is gone or it is cut off the network; ending "
            f"this process now rather than at JAX's heartbeat timeout (in about "
            f"{max(0.0, heartbeat_s - seconds - timeout):.0f} s), so the job restarts without waiting")


def end_process(why: str) -> None:
    """End this process as JAX's heartbeat timeout would (SIGABRT), after flushing the logs: the early end of
    :class:`PeerWatch` (``why``: what was found)."""
    log.error("ending process %d now: %s", os.getpid(), why)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # ending anyway
            handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os.abort()


def silent_line(process: int, n: int, pod: str | None, seconds: float, heartbeat_s: float,
                committed: int | None) -> str:
    """The line process 0 logs for a silent peer (pure)."""
    where = f" (pod {pod})" if pod else ""
    resume = "the last committed checkpoint" if committed is None else f"the last committed checkpoint, step {committed}"
    return (f"process {process} of {n}{where} has not been heard from for {seconds:.1f} s: if it has died (killed, "
            f"out of memory, its node gone), JAX ends this process within about {max(0.0, heartbeat_s - seconds):.0f}"
            f" s (\"another task died\") and the job restarts from {resume}")


def termination_message(processes: tuple[int, ...]) -> str:
    """The container's termination message of a process that only knows ``processes`` are silent (``""``:
    none): what the operator reads from a Recreate pod's ``state.terminated.message`` (pure)."""
    return termination.merged("", {"peerLost": list(processes)})


def write_termination_message(processes: tuple[int, ...], path: str = termination.TERMINATION_LOG, *,
                              attempt: int | None = None, last: tuple[int, float] | None = None) -> None:
    """Set ``peerLost`` in the container's termination message (:mod:`reprieve.termination`), with the attempt
    and this process's last finished step and when (``lastStep``, ``lastStepAt``: unix seconds) when known;
    never raises."""
    fields: dict[str, object] = {"peerLost": list(processes)}
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
                 probe_port: int = 0, probe_timeout_s: float = PROBE_TIMEOUT_SECONDS,
                 answers: Callable[[str, int, float], bool] = tcp_answers,
                 end: Callable[[str], object] | None = None) -> None:
        """``ip``: this process's pod IP, written into its record for process 0's probes; ``end``: how to end this
        process once a peer is known gone (:func:`end_process`; None: never early, JAX's timeout ends it)."""
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
        self.probe_after_s = 2 * self.interval_s  # two missed writes
        self._ip = ip
        self._probe_port = probe_port
        self.probe_timeout_s = probe_timeout_s
        self._answers = answers
        self._end = end
        self._probed: dict[int, float] = {}  # process -> when its pod was last probed (at most once a threshold)
        self._pods: dict[int, str | None] = {}
        self._ips: dict[int, str] = {}
        self._silent_key = f"reprieve/{attempt}/silent/set"
        self._on_lost = on_lost
        self._device_processes = device_processes  # device id -> process index (jax.devices())
        self.lost: tuple[int, ...] = ()  # the silent processes last reported to ``on_lost``
        self._silent: tuple[int, ...] = ()  # what the watch found (process 0's liveness, or its published set)
        self._blamed: tuple[int, ...] = ()  # what failed collectives named (blame): never taken back
        self._report = threading.Lock()  # the watch's thread and the training thread both report
        self._any_lost = threading.Event()  # the watch found a peer silent
        self._tether: ServiceTether | None = None  # processes but 0: process 0's death, the instant it happens

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
        super().start()
        return self

    def close(self) -> None:
        """Stop, and wait until the thread is out of the coordination client (one inside it at interpreter exit
        aborts the process)."""
        if self._tether is not None:
            self._tether.close()
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.interval_s + 2.0)

    def _run(self) -> None:
        liveness = Liveness([p for p in range(self._n) if p != self._pid], self.threshold_s, self._clock())
        counter = 0
        published: tuple[int, ...] = ()  # process 0: the set last written to the silent key
        while not self._stop.is_set():
            counter += 1
            try:
                record: dict[str, Any] = {"n": counter, "pod": self._pod}
                if self._ip:
                    record["ip"] = self._ip
                self._coord.set(f"{self._prefix}{self._pid}", json.dumps(record), overwrite=True)
                records = self._read() if self._pid == 0 else {}
                if self._pid != 0:
                    self._found(self._read_silent(), "process 0 reports")
            except (CoordinationError, RuntimeError, ValueError) as err:
                if not self._stop.is_set():
                    self.service_gone(str(err))
                    log.error("the coordination service%s refused process %d's liveness record (%s): a process of "
                              "the job has ended (process 0, the service's host, unless another was named above); "
                              "JAX ends this process too", f" at {self._address}" if self._address else "",
                              self._pid, err)
                return
            events = liveness.observe(records, self._clock())
            if self._pid == 0 and self._end is not None:
                events += self._probe_quiet(liveness)
            gone: list[str] = []
            for kind, p, seconds in events:
                if kind == "silent":
                    log.warning("%s", silent_line(p, self._n, self._pods.get(p), seconds, self._heartbeat_s,
                                                  self._committed()))
                elif kind == "gone":
                    gone.append(gone_line(p, self._n, self._pods.get(p), self._ips[p], self._probe_port, seconds,
                                          self.probe_timeout_s, self._heartbeat_s))
                    log.error("%s", gone[-1])
                else:
                    log.info("process %d of %d is heard from again after %.1f s", p, self._n, seconds)
            if self._pid == 0 and _union(liveness.silent, self._blamed) != published:
                published = _union(liveness.silent, self._blamed)
                try:
                    self._coord.set(self._silent_key, json.dumps(list(published)), overwrite=True)
                except (CoordinationError, RuntimeError, ValueError) as err:
                    log.debug("the silent set was not published: %s", err)
            if self._pid == 0 and liveness.silent != self._silent:
                self._found(liveness.silent, "")
            if gone and self._end is not None and not self._stop.is_set():
                self.report_again()
                self._end("; ".join(gone))
                return
            self._stop.wait(self.interval_s)

    def _probe_quiet(self, liveness: Liveness) -> list[tuple[str, int, float]]:
        """Probe the pods of the peers quiet for ``probe_after_s`` (each at most once a threshold); a ``gone`` event
        for each that does not answer."""
        now = self._clock()
        due = {p: self._ips[p] for p in liveness.quiet(now, self.probe_after_s)
               if p in self._ips and now - self._probed.get(p, -1e18) >= self.threshold_s}
        if not due:
            return []
        for p in due:
            self._probed[p] = now
        try:
            lost = unanswered(due, self._probe_port, self.probe_timeout_s, self._answers)
        except Exception as err:  # noqa: BLE001 - the watch must go on: the threshold and JAX still decide
            log.debug("probing quiet peers %s failed: %s", sorted(due), err)
            return []
        for p in sorted(set(due) - lost):
            log.info("process %d of %d is quiet but its pod answers at %s:%d: left to the silence threshold",
                     p, self._n, due[p], self._probe_port)
        now = self._clock()
        return [liveness.gone(p, now) for p in sorted(lost)]

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
                log.debug("peer-lost report failed: %s", err)

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
                log.debug("peer-lost report failed: %s", err)

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
        found = self._coord.dir_get(self._silent_key.rsplit("/", 1)[0] + "/")
        raw = next((v for k, v in found.items() if k.rsplit("/", 1)[-1] == "set"), None)
        try:
            value = json.loads(raw) if raw else []
        except ValueError:
            return self._silent
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
            out[int(tail)] = value.get("n")
            self._pods[int(tail)] = value.get("pod")
            if isinstance(value.get("ip"), str) and value["ip"]:
                self._ips[int(tail)] = value["ip"]
        return out


def _union(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(set(a) | set(b)))
