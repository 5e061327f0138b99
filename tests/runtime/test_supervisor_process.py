"""reprieve-supervisor as a real process, outside a cluster (the environment is its only assignment): signals, exit
codes, reaping, the contract check; and the runtime's side of the warm-process link with a real socket.
The cluster half (assignments, exit reports, warm take-over) is tests/runtime/test_supervisor_cluster.py."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from localcluster.testing import wait_for
from reprieve.trace_ahead import latest_metadata

from tests.runtime.helpers_pagecache import evict

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
PARKED = [{"event": "warming"}, {"event": "ready"}]  # a warm process: in reprieve.init(), then parked

SUPERVISOR_BIN = str(Path(sys.executable).parent / "reprieve-supervisor")
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("REPRIEVE_", "KUBERNETES_"))}


def run_supervisor(script: str, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([SUPERVISOR_BIN, "--", sys.executable, "-c", textwrap.dedent(script)],
                            env={**CLEAN, "OUT": str(tmp_path), **env}, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_file(path: Path, timeout: float = 30) -> str:
    """The text of ``path`` once it has some. The scripts write a few bytes with ``write_text`` (one ``write``):
    the file can be seen empty after its ``open``, never half written."""
    return wait_for(lambda: path.exists() and path.read_text(), timeout, f"{path} to be written")


def zombies_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if int(fields[1]) == pid and fields[0] == b"Z":
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_bytes().split(b") ")[1][:1] != b"Z"


def test_sigterm_is_forwarded_and_the_trainers_code_passed_on(tmp_path: Path) -> None:
    sup = run_supervisor("""
        import os, pathlib, signal, sys, time
        out = pathlib.Path(os.environ["OUT"])
        def bye(*_):
            (out / "got-sigterm").write_text(os.environ["REPRIEVE_SUPERVISED"])
            sys.exit(42)
        signal.signal(signal.SIGTERM, bye)
        (out / "running").write_text(str(os.getpid()))
        time.sleep(60)
    """, tmp_path)
    wait_file(tmp_path / "running")
    sup.send_signal(signal.SIGTERM)
    _, err = sup.communicate(timeout=30)
    assert sup.returncode == 42, err
    assert (tmp_path / "got-sigterm").read_text() == "1"
    assert "forwarding SIGTERM to the trainer" in err and "exiting with code 42" in err


def test_a_trainer_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    sup = run_supervisor("""
        import os, pathlib, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pathlib.Path(os.environ["OUT"], "running").write_text(str(os.getpid()))
        time.sleep(60)
    """, tmp_path, REPRIEVE_TERMINATION_GRACE_SECONDS="1")
    pid = int(wait_file(tmp_path / "running"))
    t0 = time.monotonic()
    sup.send_signal(signal.SIGTERM)
    _, err = sup.communicate(timeout=30)
    assert sup.returncode == 137, err  # 128 + SIGKILL, as a container's code
    assert time.monotonic() - t0 > 0.9  # not before the grace; the line below says it was this grace, not another
    assert not alive(pid)
    said = re.search(r"still running ([0-9.]+)s after SIGTERM \(grace 1s, REPRIEVE_TERMINATION_GRACE_SECONDS\): "
                     r"sending SIGKILL", err)
    assert said is not None and 1.0 <= float(said.group(1)) < 3, err  # the time it waited, not the setting


def test_exit_codes_pass_through_outside_a_cluster(tmp_path: Path) -> None:
    for code in (0, 3, 42):
        sup = run_supervisor(f"import sys; sys.exit({code})", tmp_path)
        _, err = sup.communicate(timeout=30)
        assert sup.returncode == code, err
    sup = run_supervisor("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", tmp_path)
    _, err = sup.communicate(timeout=30)
    assert sup.returncode == 137, err


def test_orphans_are_reaped(tmp_path: Path) -> None:
    """The trainer leaves a grandchild behind that exits later: reparented to the supervisor (PID 1 in a
    container, a child subreaper here), it must be reaped, not left a zombie."""
    sup = run_supervisor("""
        import os, pathlib, time
        out = pathlib.Path(os.environ["OUT"])
        child = os.fork()
        if child == 0:
            grandchild = os.fork()
            if grandchild == 0:
                time.sleep(1.0)
                os._exit(7)
            (out / "grandchild").write_text(str(grandchild))
            os._exit(0)
        os.waitpid(child, 0)
        (out / "trainer").write_text(str(os.getpid()))
        time.sleep(60)
    """, tmp_path)
    grandchild = int(wait_file(tmp_path / "grandchild"))
    wait_file(tmp_path / "trainer")
    # reaped: gone from /proc (a zombie, exited and not reaped, stays there)
    wait_for(lambda: not Path(f"/proc/{grandchild}").exists(), 30, f"grandchild {grandchild} to be reaped",
             describe=lambda: f"zombie children of the supervisor: {zombies_of(sup.pid)}")
    assert zombies_of(sup.pid) == []
    sup.send_signal(signal.SIGTERM)
    sup.communicate(timeout=30)


def test_contract_mismatch_exits_2_naming_both_versions(tmp_path: Path) -> None:
    sup = run_supervisor("import pathlib; pathlib.Path('ran').write_text('x')", tmp_path, REPRIEVE_CONTRACT="2")
    _, err = sup.communicate(timeout=30)
    assert sup.returncode == 2
    assert "contract version '2'" in err and "speaks version 1" in err
    assert not (tmp_path / "ran").exists()


def test_bad_usage_and_a_missing_command(tmp_path: Path) -> None:
    no_command = subprocess.run([SUPERVISOR_BIN], env=CLEAN, capture_output=True, text=True, timeout=30, check=False)
    assert no_command.returncode == 2 and "no command given" in no_command.stderr
    bad_knob = subprocess.run([SUPERVISOR_BIN, "--", "true"], env={**CLEAN, "REPRIEVE_PREWARM": "sometimes"},
                              capture_output=True, text=True, timeout=30, check=False)
    assert bad_knob.returncode == 2 and "REPRIEVE_PREWARM must be 1 or 0, got 'sometimes'" in bad_knob.stderr
    missing = subprocess.run([SUPERVISOR_BIN, "--", "no-such-trainer-xyz"], env=CLEAN, capture_output=True,
                             text=True, timeout=30, check=False)
    assert missing.returncode == 127 and "no-such-trainer-xyz" in missing.stderr


# --- the runtime's side of the link (a warm process, with a real socket and reprieve.init) -----------------

WARM_TRAINER = """
    import json, os, sys
    import jax  # imports are what a warm process is for
    if os.environ.get("TOUCH_DEVICES"):
        jax.devices()  # not allowed before reprieve.init() in a warm process
    import reprieve
    assert "REPRIEVE_ATTEMPT" not in os.environ
    if os.environ.get("TRACE_AHEAD_POLL_SECONDS"):  # how often a parked spare looks again (and says so)
        import logging
        from reprieve.trace_ahead import TraceAhead
        TraceAhead.POLL_SECONDS = float(os.environ["TRACE_AHEAD_POLL_SECONDS"])
        logging.basicConfig(level=logging.WARNING)
        logging.getLogger("reprieve.trace_ahead").setLevel(logging.DEBUG)
    if os.environ.get("PARKED_STATE"):  # what the process holds once parked (its "ready" line)
        from reprieve.supervisor import trainer as link_mod
        send = link_mod.SupervisorLink.send
        def spy(self, event, **fields):
            if event == "ready":
                import gc
                from jax._src import xla_bridge
                with open(os.environ["PARKED_STATE"], "w") as f:
                    json.dump({"modules": sorted(m for m in sys.modules if m.startswith("reprieve")),
                               "plugins": xla_bridge._plugins_registered,
                               "backends": xla_bridge.backends_are_initialized(),
                               "frozen": gc.get_freeze_count(), "walked": len(gc.get_objects())}, f)
            return send(self, event, **fields)
        link_mod.SupervisorLink.send = spy
    def ahead(topology):  # what a step would be traced for, and whether a device was touched to know it
        from jax._src import xla_bridge
        with open(os.environ["TRACE_AHEAD"] + ".tmp", "w") as f:
            json.dump({**topology.to_json(), "devices_touched": xla_bridge.backends_are_initialized()}, f)
        os.replace(os.environ["TRACE_AHEAD"] + ".tmp", os.environ["TRACE_AHEAD"])  # seen whole or not at all
        if os.environ.get("LOWER_AHEAD_AFTER"):  # a step traced to lower ahead, once the test made this file
            import time
            import jax.numpy as jnp
            while not os.path.exists(os.environ["LOWER_AHEAD_AFTER"]):
                time.sleep(0.01)
            reprieve.lower_ahead(jax.jit(lambda x: x * 2), jax.ShapeDtypeStruct((4,), jnp.float32))
    job = reprieve.init(install_sigterm=False, watch_pod=False,
                        trace_ahead=ahead if os.environ.get("TRACE_AHEAD") else None)
    print(json.dumps({k: os.environ.get(k) for k in ("REPRIEVE_ATTEMPT", "REPRIEVE_PROCESS_ID",
          "REPRIEVE_WARM_FD", "REPRIEVE_SUPERVISOR_FD")} | {"attempt": job.config.attempt}), flush=True)
    for step in job.steps(0, 3):
        job.save(step, {"x": step})
"""


def start_warm(tmp_path: Path, script: str = WARM_TRAINER, **env: str) -> tuple[subprocess.Popen[str], socket.socket]:
    ours, theirs = socket.socketpair()
    os.set_inheritable(theirs.fileno(), True)
    fd = str(theirs.fileno())
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], pass_fds=[theirs.fileno()],
                            env={**CLEAN, "REPRIEVE_WARM_FD": fd, "REPRIEVE_SUPERVISOR_FD": fd,
                                 "REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt"), **env},
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    theirs.close()
    ours.settimeout(60)
    return proc, ours


def test_warm_process_waits_in_init_then_runs_the_assignment(tmp_path: Path) -> None:
    proc, sock = start_warm(tmp_path)
    lines = sock.makefile("rb")
    assert [json.loads(lines.readline()) for _ in range(2)] == PARKED
    # parked: nothing runs before the assignment; what runs next reports attempt 5, which only the assignment says
    sock.sendall(json.dumps({"attempt": 5, "processId": 0, "numProcesses": 1, "coordinator": None}).encode() + b"\n")
    assert json.loads(lines.readline()) == {"event": "init", "attempt": 5, "processId": 0}
    step = json.loads(lines.readline())  # with the devices, if the trainer had touched them by then
    assert {k: v for k, v in step.items() if k != "topology"} == {"event": "step", "step": 0}, step
    assert step["topology"] is None or (step["topology"]["platform"], step["topology"]["num_processes"]) == ("cpu", 1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])
    # the assignment is the environment now; the link's variables are gone (a child must not write to the fd)
    assert seen == {"REPRIEVE_ATTEMPT": "5", "REPRIEVE_PROCESS_ID": "0", "REPRIEVE_WARM_FD": None,
                    "REPRIEVE_SUPERVISOR_FD": None, "attempt": 5}


def test_a_warm_process_parks_with_the_lazy_imports_done_jax_plugins_found_and_its_heap_frozen_then_still_joins(
        tmp_path: Path) -> None:
    from reprieve import prewarm

    parked = tmp_path / "parked.json"
    proc, sock = start_warm(tmp_path, PARKED_STATE=str(parked))
    lines = sock.makefile("rb")
    assert [json.loads(lines.readline()) for _ in range(2)] == PARKED
    state = json.loads(parked.read_text())
    # what init() and the restore would import after the assignment is imported before it (no memory tier here)
    assert set(prewarm.modules_for({})) <= set(state["modules"]), state["modules"]
    assert not set(prewarm.MEMORY_TIER_MODULES) & set(state["modules"])
    # JAX's plugin discovery is done, and no backend exists: the process can still join a gang
    assert (state["plugins"], state["backends"]) == (True, False)
    # the heap of its imports is out of the collector's passes: the attempt's first full collection walks only what
    # the attempt makes (without the freeze, every one of JAX's ~100,000 objects is walked, and none is frozen)
    assert state["frozen"] > 50_000 and state["walked"] < state["frozen"] // 20, state
    sock.sendall(ASSIGN_ALONE)
    assert json.loads(lines.readline()) == {"event": "init", "attempt": 5, "processId": 0}
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_warm_process_that_touched_devices_refuses_with_a_clear_error(tmp_path: Path) -> None:
    proc, sock = start_warm(tmp_path, TOUCH_DEVICES="1")
    message = json.loads(sock.makefile("rb").readline())
    assert message["event"] == "error" and "JAX backend is already initialised (cpu)" in message["message"]
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "RuntimeError" in err and "must not touch devices: no jax.devices()" in err


def test_warm_process_exits_quietly_when_the_supervisor_goes(tmp_path: Path) -> None:
    proc, sock = start_warm(tmp_path)
    lines = sock.makefile("rb")
    assert [json.loads(lines.readline()) for _ in range(2)] == PARKED
    lines.close()  # the file object holds the socket open too
    sock.close()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out == ""  # it never got past reprieve.init()


TOPOLOGY = {"platform": "cpu", "device_kind": "cpu", "num_cores": None, "num_processes": 2, "device_count": 4}
ASSIGN_ALONE = json.dumps({"attempt": 5, "processId": 0, "numProcesses": 1, "coordinator": None}).encode() + b"\n"


def test_a_warm_process_traces_ahead_for_the_devices_its_supervisor_names_before_it_parks(tmp_path: Path) -> None:
    ahead = tmp_path / "ahead.json"
    proc, sock = start_warm(tmp_path, TRACE_AHEAD=str(ahead), REPRIEVE_EXPECTED_TOPOLOGY=json.dumps(TOPOLOGY))
    lines = sock.makefile("rb")
    assert [json.loads(lines.readline()) for _ in range(2)] == PARKED
    assert json.loads(ahead.read_text()) == {**TOPOLOGY, "devices_touched": False}
    sock.sendall(ASSIGN_ALONE)
    assert json.loads(lines.readline()) == {"event": "init", "attempt": 5, "processId": 0}
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_a_warm_process_whose_assignment_comes_with_its_imports_skips_its_warm_up_and_joins(tmp_path: Path) -> None:
    """The supervisor hands an attempt that waits for a warm process over as soon as the process is past its imports
    ("warming"): the process then neither traces ahead nor collects its heap (it still imports what the restore
    needs and freezes its heap), and takes the attempt."""
    ahead, parked = tmp_path / "ahead.json", tmp_path / "parked.json"
    proc, sock = start_warm(tmp_path, TRACE_AHEAD=str(ahead), REPRIEVE_EXPECTED_TOPOLOGY=json.dumps(TOPOLOGY),
                            PARKED_STATE=str(parked))
    lines = sock.makefile("rb")
    assert json.loads(lines.readline()) == {"event": "warming"}
    sock.sendall(ASSIGN_ALONE)  # at once, as the supervisor does for an attempt already waiting
    assert [json.loads(lines.readline()) for _ in range(2)] == [{"event": "ready"},
                                                               {"event": "init", "attempt": 5, "processId": 0}]
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not ahead.exists(), err  # not traced ahead: the step is traced beside the restore
    assert "its assignment came with its imports: no warm-up" in err, err
    state = json.loads(parked.read_text())
    from reprieve import prewarm

    assert set(prewarm.modules_for({})) <= set(state["modules"]), state["modules"]
    assert state["frozen"] > 50_000, state  # frozen all the same (no collection first)


def test_a_warm_process_whose_assignment_comes_while_it_traces_ahead_does_not_lower_the_step(tmp_path: Path) -> None:
    ahead, go = tmp_path / "ahead.json", tmp_path / "go"
    proc, sock = start_warm(tmp_path, TRACE_AHEAD=str(ahead), REPRIEVE_EXPECTED_TOPOLOGY=json.dumps(TOPOLOGY),
                            LOWER_AHEAD_AFTER=str(go))
    lines = sock.makefile("rb")
    assert json.loads(lines.readline()) == {"event": "warming"}
    wait_file(ahead)  # its trace_ahead function runs (the supervisor had nothing for it within its short wait)
    sock.sendall(ASSIGN_ALONE)
    go.write_text("1")  # the function now traces a step to lower ahead, with the assignment already here
    assert [json.loads(lines.readline()) for _ in range(2)] == [{"event": "ready"},
                                                               {"event": "init", "attempt": 5, "processId": 0}]
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "the assignment came while the step was traced: not lowered ahead" in err, err
    assert "ahead in" not in err.split("traced ahead for")[1], err  # no "lowered <step> ahead in ..." after it


@pytest.mark.parametrize("found", ["a checkpoint", "the running attempt's record"])
def test_a_spare_parked_before_the_first_checkpoint_traces_ahead_once_the_topology_is_there(
        tmp_path: Path, found: str) -> None:
    """Either a committed checkpoint or, before one, the record the running attempt's process 0 writes in the root
    after its first step (reprieve.trace_ahead.record_topology): the spare traces ahead for it while parked."""
    import jax
    import jax.numpy as jnp
    from reprieve.checkpoint import CheckpointManager, layout
    from reprieve.trace_ahead import record_topology

    ahead = tmp_path / "ahead.json"
    # no hint: a spare that never ran a trainer; it looks for a checkpoint again every 0.2 s while parked
    proc, sock = start_warm(tmp_path, TRACE_AHEAD=str(ahead), TRACE_AHEAD_POLL_SECONDS="0.2")
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    lines = sock.makefile("rb")
    assert [json.loads(lines.readline()) for _ in range(2)] == PARKED
    assert not ahead.exists()  # the look before "ready" found no checkpoint: nothing to trace for
    unknown = "trace_ahead: the expected topology is not known yet"
    wait_for(lambda: sum(unknown in line for line in err) >= 3, 30, "two looks while parked",
             describe=lambda: "".join(err))
    assert not ahead.exists()  # nor did the looks while parked
    if found == "a checkpoint":
        with CheckpointManager(str(tmp_path / "ckpt"), attempt=1) as mgr:
            mgr.save(3, {"w": jnp.arange(4.0)})
            mgr.wait()
        recorded = json.loads((tmp_path / "ckpt" / layout.committed_name(3, 1) / layout.METADATA_FILE).read_text())
    else:
        jax.devices()
        CheckpointManager(str(tmp_path / "ckpt"), attempt=1).close()  # the root and the attempt's fence
        writer = record_topology(str(tmp_path / "ckpt"), 1, 1)
        assert writer is not None
        writer.join(10)
        recorded = json.loads((tmp_path / "ckpt" / layout.TOPOLOGY_FILE).read_text())
    wait_for(lambda: ahead.exists() or proc.poll() is not None, 30, "the parked spare to trace ahead")
    assert json.loads(ahead.read_text()) == {**recorded["topology"], "devices_touched": False}
    sock.sendall(ASSIGN_ALONE)  # still parked, and takes its assignment as before
    assert json.loads(lines.readline()) == {"event": "init", "attempt": 5, "processId": 0}
    assert proc.wait(timeout=60) == 0, "".join(err)
    reader.join(30)
    assert sum("traced ahead for" in line for line in err) == 1, err  # once, then it stopped looking



def test_a_process_that_exited_gets_no_signal_and_the_log_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """The supervisor logged "sending SIGKILL to pid N" for a process that had ended (issue 46)."""
    import logging

    from reprieve.supervisor import contract
    from reprieve.supervisor import protocol as sm
    from reprieve.supervisor.process import Supervisor

    supervisor = Supervisor(["true"], {}, sm.Settings(), env_assignment=contract.assignment_from_env({}),
                            client=None, namespace="default", pod=None, configmap=None)
    ended = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{ended.pid}/stat").read_bytes().split(b") ")[1][:1] != b"Z":  # ended, not reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with caplog.at_level(logging.INFO, logger="reprieve.supervisor"):
        supervisor._do(sm.Signal(ended.pid, signal.SIGKILL, "training finished: ending the pre-warmed process"))
    assert ended.wait(5) == 0  # exited on its own: not killed
    assert caplog.messages == [(f"training finished: ending the pre-warmed process: pid {ended.pid} has exited "
                               "already; no SIGKILL sent")], caplog.messages


def test_the_old_name_still_runs_the_supervisor_and_says_it_is_deprecated() -> None:
    """#45: the supervisor is reprieve-supervisor; reprieve-run (its name until 0.1) runs the same program for one
    release, with one line on stderr saying so."""
    bin_dir = os.path.dirname(sys.executable)
    new = subprocess.run([os.path.join(bin_dir, "reprieve-supervisor"), "--version"], capture_output=True, check=False,
                         text=True, timeout=60)
    old = subprocess.run([os.path.join(bin_dir, "reprieve-run"), "--version"], capture_output=True, text=True, check=False,
                         timeout=60)
    assert (new.returncode, old.returncode) == (0, 0), (new.stderr, old.stderr)
    assert old.stdout == new.stdout and new.stdout.strip()
    assert "reprieve-run is deprecated: it is now reprieve-supervisor" in old.stderr
    assert "deprecated" not in new.stderr


RESTORING_TRAINER = """
    import logging, os
    logging.basicConfig(level=logging.INFO)
    import reprieve
    job = reprieve.init(install_sigterm=False, watch_pod=False)
    import jax.numpy as jnp
    state, start = job.restore_or(lambda: {"w": jnp.zeros(96 << 18, jnp.float32)})  # 96 MiB
    for step in job.steps(start, start + 2):
        state = {"w": state["w"] + 1}
        job.save(step, state)
"""


ORBAX_TRAINER = RESTORING_TRAINER.replace("job = reprieve.init(install_sigterm=False, watch_pod=False)", """
    from reprieve.orbax import OrbaxCheckpointer
    job = reprieve.init(install_sigterm=False, watch_pod=False, checkpointer=lambda cfg, coord: OrbaxCheckpointer(
        cfg.checkpoint_uri, coordinator=coord, attempt=cfg.attempt))""")


def test_a_trainer_whose_restores_do_not_land_in_host_buffers_reports_no_landing_bytes(tmp_path: Path) -> None:
    """Orbax reads a restore into buffers of its own: the trainer reports no landing bytes, so its next warm process
    does not hold a state's worth of populated memory that nothing would use (capabilities.HostLanding)."""
    assert "OrbaxCheckpointer(" in ORBAX_TRAINER
    proc, ours = start_warm(tmp_path, ORBAX_TRAINER)
    lines = ours.makefile("rb")
    assert [json.loads(lines.readline()) for _ in range(2)] == PARKED
    ours.sendall(json.dumps({"attempt": 1, "processId": 0, "numProcesses": 1, "coordinator": None}).encode() + b"\n")
    events = [json.loads(line) for line in lines]
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    step = next(e for e in events if e["event"] == "step")
    assert "landing" not in step, step


def warm_attempt(tmp_path: Path, script: str, n: int, **env: str) -> tuple[dict[str, object], str]:
    """One attempt ``n`` of ``script`` in a warm process, to its end: its first-step event and its log."""
    proc, ours = start_warm(tmp_path, script, **env)
    lines = ours.makefile("rb")
    assert [json.loads(lines.readline()) for _ in range(2)] == PARKED
    ours.sendall(json.dumps({"attempt": n, "processId": 0, "numProcesses": 1, "coordinator": None}).encode() + b"\n")
    events = [json.loads(line) for line in lines]
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return next(e for e in events if e["event"] == "step"), err


def test_a_warm_process_populates_the_landing_memory_its_restore_then_lands_in(tmp_path: Path) -> None:
    """The first trainer reports the bytes its state lands; the next warm process, told them, populates them while
    it is parked, and its restore lands in them (and gives back the rest)."""
    def attempt(n: int, **env: str) -> tuple[dict[str, object], str]:
        return warm_attempt(tmp_path, RESTORING_TRAINER, n, **env)

    first, err = attempt(1)
    assert first["landing"] == 96 << 20  # no restore yet: the state it made, as a restore would land it
    assert "landing memory" not in err  # no hint, no pool
    evict(tmp_path / "ckpt")  # as on another node: read, not mapped from the page cache
    second, err = attempt(2, REPRIEVE_WARM_LANDING_BYTES=str(first["landing"]))
    assert f"landing memory: {96 << 20} bytes populated ahead" in err, err
    assert f"landing memory: {96 << 20} of {96 << 20} bytes populated ahead were used by the restore; 0 given back" \
        in err, err
    assert err.count("were used by the restore") == 1, err  # said once, not at every save after it
    assert "restored step 1" in err and second["landing"] == 96 << 20


DONATING_TRAINER = """
    import logging, os
    logging.basicConfig(level=logging.INFO)
    import reprieve
    job = reprieve.init(install_sigterm=False, watch_pod=False)
    import jax, jax.numpy as jnp
    step_fn = jax.jit(lambda s: {"w": s["w"] + 1}, donate_argnums=0)
    abstract = {"w": jax.ShapeDtypeStruct((96 << 18,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(
        jax.devices()[0]))}  # 96 MiB
    job.compile_ahead(step_fn, abstract)  # it donates: the hint is asked of it at the first step
    state, start = job.restore_or(lambda: {"w": jnp.zeros(96 << 18, jnp.float32)}, abstract)
    for step in job.steps(start, start + 2):
        state = step_fn(state)
        job.save(step, state)
"""


def test_a_warm_process_populates_the_memory_xla_allocates_for_a_donating_steps_copy(tmp_path: Path) -> None:
    """A step that donates the state on a CPU device: the trainer reports the bytes its restore copies into memory
    XLA allocates; the next warm process, told them, populates them in its C heap, and the restore's copy reuses
    that memory (only the slack beyond the hint goes back after it)."""
    def attempt(n: int, **env: str) -> tuple[dict[str, object], str]:
        return warm_attempt(tmp_path, DONATING_TRAINER, n, **env)

    first, err = attempt(1)
    assert first["owned"] == 96 << 20, first  # no restore yet: the state it made, as a restore would copy it
    assert "memory XLA allocates" not in err
    second, err = attempt(2, REPRIEVE_WARM_OWNED_BYTES=str(first["owned"]))
    populated = re.search(r"memory XLA allocates: (\d+) bytes populated ahead in", err)
    assert populated and int(populated.group(1)) >= 96 << 20, err
    assert f"{96 << 20} bytes of it copied into memory the CPU devices own" in err, err
    back = re.search(r"memory XLA allocates: (\d+) bytes populated ahead; (\d+) given back after the restore's copy",
                     err)
    assert back and int(back.group(2)) < int(back.group(1)) - (64 << 20), err  # the copy kept what it reused
    assert "restored step 1" in err and second["owned"] == 96 << 20
    # a spare (no trainer ran in its pod): the figure its job's checkpoint records, as the step donates
    found = latest_metadata({"REPRIEVE_CHECKPOINT_URI": str(tmp_path / "ckpt")}, "test", "")
    assert found is not None and found[0].owned_bytes == 96 << 20
    _, err = attempt(3)
    back = re.search(r"memory XLA allocates: (\d+) bytes populated ahead; (\d+) given back after the restore's copy",
                     err)
    assert back and int(back.group(2)) < int(back.group(1)) - (64 << 20) and "restored step 3" in err, err
