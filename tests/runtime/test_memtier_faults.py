"""The memory tier's faults with real processes: real ``jax.distributed`` gangs on CPU (one device per process),
real tmpfs memory directories (one per "pod"), real replica servers on loopback TCP, the real storage tier.

Each test plays what the operator would do: run attempt ``A`` until the fault, kill the gang, lose the pods the
fault takes (their memory directories), start attempt ``A+1`` (a replacement pod gets an empty directory), and
check where every process restored from and that the run ends with the parameters and data position of an
uninterrupted run. Memory copies after steps 4, 9, 14, ...; storage checkpoints after steps 9, 19, ...
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from reprieve.memtier import schedule
from reprieve.memtier.layout import DATA_FILE, MANIFEST_FILE, CopyName
from reprieve.memtier.manifest import Manifest

from tests.runtime import helpers_memtier
from tests.runtime.helpers_agreement import Gang, node_notice, write_notice_file
from tests.runtime.helpers_memtier import Pod, finish, launch, new_pod, run_until_stopped, shm_base

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

TOTAL = 25


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    d = shm_base(tmp_path)
    yield d
    helpers_memtier.kill_launched()
    shutil.rmtree(d, ignore_errors=True)


def restored(gang_logs: list[Path]) -> list[str]:
    """The gang's sources from the restore's log line (``0=memory, 1=peer``)."""
    text = gang_logs[0].read_text()
    m = re.search(r"restored step (\d+) on process 0 from .* \(gang: ([^)]*)\)", text)
    assert m, text[-3000:]
    return [m.group(1), *(kv.split("=")[1] for kv in m.group(2).split(", "))]


def ring(pods: list[Pod]) -> dict[int, Pod | None]:
    return {i: pods[(i + 1) % len(pods)] for i in range(len(pods))}


def test_a_process_lost_without_notice_restores_from_its_peers_memory(tmp_path: Path, base: Path) -> None:
    pods = [new_pod(base, "pod-0"), new_pod(base, "pod-1")]
    gang = launch(tmp_path, pods, ring(pods), attempt=1, steps=TOTAL, stop_at=14)
    run_until_stopped(gang, 2, die=1)
    pods[1].lose()
    pods[1] = new_pod(base, "pod-1b")  # the replacement: another node, empty memory
    gang = launch(tmp_path, pods, ring(pods), attempt=2, steps=TOTAL)
    finals = finish(gang, 2, TOTAL)
    assert restored(gang.logs) == ["14", "memory", "peer"]
    assert finals[0]["restored_from"] == {"step": 14, "tier": "memory", "sources": ["memory", "peer"]}


def test_processes_that_skipped_different_saves_restore_a_step_every_one_wrote_from_memory(
        tmp_path: Path, base: Path) -> None:
    """Issue #48: a save after every step and copies slower than a step, each process skipping where its own copy
    runs late (process 0's copy of 6 is held 2 s, so it skips 7; process 1's copy of 7, so it skips 8). Process 1
    is then lost with its pod (it holds process 0's replicas). The survivors restore step 6, the newest step both
    wrote, from memory: process 0 its own copy, process 1 the copy its holder kept beside its newest (7). Before,
    the holder kept only 7 and process 0 only 6 and 8: no step was whole in memory, and with no storage checkpoint
    the gang started over. Process 0 widens the interval for every process at the skips."""
    total = 12
    pods = [new_pod(base, "pod-0"), new_pod(base, "pod-1")]
    late = {0: {"REPRIEVE_MEMTIER_TEST_SLOW_COPY": "6:2", "WORKER_NO_WAIT_AT": "7"},
            1: {"REPRIEVE_MEMTIER_TEST_SLOW_COPY": "7:2", "WORKER_NO_WAIT_AT": "8", "WORKER_STOP_UNREPLICATED": "1"}}
    gang = launch(tmp_path, pods, ring(pods), attempt=1, steps=total, stop_at=8, mem_every=1, ckpt_every=100,
                  extra=late)
    run_until_stopped(gang, 2)
    logs = [log.read_text() for log in gang.logs]
    assert "memory save of step 7 skipped" in logs[0] and "memory save of step 8 skipped" not in logs[0], logs[0]
    assert "memory save of step 8 skipped" in logs[1] and "memory save of step 7 skipped" not in logs[1], logs[1]
    assert re.search(r"memory copies every 2 steps from step \d+ \(schedule 2\), every step before: .*process 0 "
                     r"step 7", logs[0]), logs[0][-3000:]
    assert helpers_memtier.storage_steps(tmp_path) == []  # nothing in storage to fall back to
    pods[1].lose()
    pods[1] = new_pod(base, "pod-1b")
    gang = launch(tmp_path, pods, ring(pods), attempt=2, steps=total, mem_every=1, ckpt_every=100)
    finals = finish(gang, 2, total)  # the run ends with an uninterrupted run's parameters and data position
    assert restored(gang.logs) == ["6", "memory", "peer"]
    assert [f["restored_from"] for f in finals] == [{"step": 6, "tier": "memory", "sources": ["memory", "peer"]}] * 2
    for i, log in enumerate(gang.logs):
        restored_state = re.search(rf"restored step 6 on process {i} from .*resuming at step 7", log.read_text())
        assert restored_state, log.read_text()[-3000:]


def test_a_noticed_preemption_restores_the_agreed_step_from_memory(tmp_path: Path, base: Path) -> None:
    """A notice on process 1's node: the agreed step is saved to storage and, beside it, to memory and the peer.
    Attempt 2 runs process 1 in a new pod (a spare on another node, its memory empty): it reads the agreed step
    from its old peer's memory and process 0 from its own, not from storage (docs/memory.md, "After a notice")."""
    import time

    pods = [new_pod(base, "pod-0"), new_pod(base, "pod-1")]
    notices = {i: {"REPRIEVE_NOTICE_FILE": str(tmp_path / f"annotations-{i}"), "WORKER_STEP_SECONDS": "0.3"}
               for i in range(2)}  # slow steps: the agreed step comes well before the last one
    gang = launch(tmp_path, pods, ring(pods), attempt=1, steps=TOTAL, hold_at=6, extra=notices)
    for i in range(2):  # both processes hold after step 6's save (until the file "go")
        gang.wait_for_file(f"held-{i}", 120)
    write_notice_file(tmp_path / "annotations-1", node_notice("gke-spot", "node-b", time.time() + 9))
    time.sleep(0.5)  # the notice watcher polls every 0.2 s: the notice is in before the loop goes on
    (tmp_path / "go").touch()
    assert gang.wait(120) == [42, 42], gang.tail(40)
    agreed = re.search(r"agreed checkpoint at step (\d+) committed", gang.logs[0].read_text())
    assert agreed, gang.tail(40)
    step = agreed.group(1)
    for log in gang.logs:
        assert f"agreed step {step}: memory copy committed" in log.read_text(), gang.tail(40)
    pods[1] = new_pod(base, "pod-1b")  # the noticed node's pod is gone with its memory
    gang = launch(tmp_path, pods, ring(pods), attempt=2, steps=TOTAL)
    finish(gang, 2, TOTAL)
    assert restored(gang.logs) == [step, "memory", "peer"]


def noticed_on_node_b(tmp_path: Path, base: Path, slow: dict[str, str], *, to_memory: bool = False,
                      doomed: tuple[str, ...] = ("node-b",)) -> tuple[list[Pod], list[str], str]:
    """Attempt 1 of a gang whose process 0 runs on node-a and process 1 on node-b, with ``slow`` (env) for process
    0: a notice on each of ``doomed`` after step 6 (REPRIEVE_NOTICE_TO_MEMORY=1 with ``to_memory``: the agreed
    step in memory alone where its copies outlive the notice; else storage, a memory copy beside it); returns the
    pods, both processes' logs and the agreed step."""
    import time

    pods = [new_pod(base, "pod-0"), new_pod(base, "pod-1")]
    extra = {i: {"REPRIEVE_NOTICE_FILE": str(tmp_path / f"annotations-{i}"), "WORKER_STEP_SECONDS": "0.3",
                 "REPRIEVE_NODE_NAME": f"node-{'ab'[i]}", "REPRIEVE_NOTICE_TO_MEMORY": "1" if to_memory else "0"}
             for i in range(2)}
    extra[0].update(slow)
    gang = launch(tmp_path, pods, ring(pods), attempt=1, steps=TOTAL, hold_at=6, extra=extra)
    for i in range(2):
        gang.wait_for_file(f"held-{i}", 120)
    for i, node in enumerate(doomed):  # node-b's notice in process 1's file, a second node's in process 0's
        write_notice_file(tmp_path / f"annotations-{1 - i}", node_notice("gke-spot", node, time.time() + 9))
    time.sleep(0.5)  # the notice watcher polls every 0.2 s
    (tmp_path / "go").touch()
    assert gang.wait(120) == [42, 42], gang.tail(40)
    logs = [log.read_text() for log in gang.logs]
    agreed = re.search(r"agreed checkpoint at step (\d+) committed", logs[0])
    assert agreed, gang.tail(40)
    return pods, logs, agreed.group(1)


def seconds_between(log: str, first: str, then: str) -> float:
    """Seconds from the log line holding ``first`` to the next one holding ``then`` (the lines' timestamps)."""
    from datetime import datetime

    def at(text: str, start: int) -> tuple[float, int]:
        i = log.index(text, start)
        line_start = log.rindex("\n", 0, i) + 1
        stamp = datetime.strptime(log[line_start:line_start + 23], "%Y-%m-%d %H:%M:%S,%f")
        return stamp.timestamp(), i

    t0, i = at(first, 0)
    t1, _ = at(then, i)
    return t1 - t0


def test_a_process_whose_pod_stays_leaves_without_waiting_for_its_put_to_the_noticed_peer(
        tmp_path: Path, base: Path) -> None:
    """Issue #48 (the 1 GiB goodput run): a notice on process 1's node. Process 0's pod stays, so the restart reads
    process 0's agreed copy from process 0's own pod: process 0 leaves once that copy is committed there, without
    waiting for its put to process 1's pod, which goes (held 30 s here; before, the exit waited 1 s for it, then 5 s
    more while closing). Attempt 2 still restores the agreed step from memory: process 0 from its own pod, process
    1 (a new pod on another node) its copy from process 0's pod."""
    late = [s for s in range(5, 14) if s != 9]  # the agreed step's copy (the periodic copy of 9 is not held)
    slow = {"REPRIEVE_MEMTIER_TEST_SLOW_COPY": ",".join(f"{s}:30" for s in late),
            "WORKER_NO_WAIT_AT": ",".join(map(str, late))}
    pods, logs, step = noticed_on_node_b(tmp_path, base, slow)
    assert f"agreed step {step}: memory copy committed here" in logs[0], logs[0][-3000:]
    assert (f"leaving with the copy of step {step} committed in this pod, its put to the peer unfinished"
            in logs[0]), logs[0][-3000:]
    left = seconds_between(logs[0], f"agreed checkpoint at step {step} committed", "exiting with code 42")
    assert left < 2.0, logs[0][-3000:]  # before: 6 s (1 s for the copy, 5 s more in the tier's close)
    assert f"agreed step {step}: memory copy committed " in logs[1], logs[1][-3000:]  # its pod goes: at the peer
    pods[1] = new_pod(base, "pod-1b")  # the noticed node's pod is gone with its memory
    gang = launch(tmp_path, pods, ring(pods), attempt=2, steps=TOTAL)
    finish(gang, 2, TOTAL)
    assert restored(gang.logs) == [step, "memory", "peer"]


def test_a_notice_whose_copies_outlive_it_leaves_its_agreed_step_in_memory_alone_and_loses_no_step(
        tmp_path: Path, base: Path) -> None:
    """Issue #48 (a noticed restart at 1 GiB spent 1.6-3.0 s in the agreed storage save): a notice on process 1's
    node; process 0's pod (node-a) stays and process 1's peer is that pod, whose node each process learned from the
    restore round's reports. Process 0's copy of the agreed step is committed in its pod (not sent to process 1's,
    which goes), process 1's here and at its peer: both outlive the notice, so the gang saves no storage checkpoint
    for it; attempt 2 (process 1 in a new pod on another node)
    restores the agreed step from memory, process 0 from its own pod and process 1 from its peer's, and the run ends
    as an uninterrupted one."""
    pods, logs, step = noticed_on_node_b(tmp_path, base, {}, to_memory=True)
    for log in logs:
        assert (f"agreed step {step} held in memory by all 2 process(es): no storage save (every copy outlives the "
                "notices)") in log, log[-3000:]
    assert int(step) not in helpers_memtier.storage_steps(tmp_path), helpers_memtier.storage_steps(tmp_path)
    # process 0's pod stays: its copy is read there, and not sent to process 1's pod, which goes with node-b
    assert f"agreed step {step}: memory copy committed here (this pod stays)" in logs[0], logs[0][-3000:]
    assert f"memory copy of step {step} not sent to the peer" in logs[0], logs[0][-3000:]
    assert f"agreed step {step}: memory copy committed here and at the peer" in logs[1], logs[1][-3000:]
    pods[1] = new_pod(base, "pod-1b")  # the noticed node's pod is gone with its memory
    # the notice is still in the file (as on a kept pod): the restored copy records it as saved for, no second save
    still = {i: {"REPRIEVE_NOTICE_FILE": str(tmp_path / f"annotations-{i}")} for i in range(2)}
    gang = launch(tmp_path, pods, ring(pods), attempt=2, steps=TOTAL, extra=still)
    finals = finish(gang, 2, TOTAL)  # an uninterrupted run's parameters and data position
    assert restored(gang.logs) == [step, "memory", "peer"]
    assert all(f["restored_from"]["step"] == int(step) for f in finals), finals
    assert f"was already saved for: the restored checkpoint, step {step}" in gang.logs[1].read_text()


def test_a_notice_on_both_nodes_of_a_process_and_its_peer_sends_the_agreed_step_to_storage(
        tmp_path: Path, base: Path) -> None:
    """Notices on node-b (process 1's, heard by process 1) and node-a (process 0's, heard by process 0): every copy
    of the agreed step would go with the two nodes, which the gang learns from the verdicts it exchanges (each
    process heard one notice), so every process saves the step to storage; attempt 2, both pods new, restores it
    from storage."""
    pods, logs, step = noticed_on_node_b(tmp_path, base, {}, to_memory=True, doomed=("node-b", "node-a"))
    for log in logs:
        assert f"agreed step {step}: not held in memory where the restart reads it" in log, log[-3000:]
    assert int(step) in helpers_memtier.storage_steps(tmp_path), helpers_memtier.storage_steps(tmp_path)
    pods = [new_pod(base, "pod-0b"), new_pod(base, "pod-1b")]
    gang = launch(tmp_path, pods, ring(pods), attempt=2, steps=TOTAL)
    finals = finish(gang, 2, TOTAL)
    assert restored(gang.logs)[0] == step
    assert all(f["restored_from"]["step"] == int(step) for f in finals), finals


def test_an_older_copy_in_flight_at_the_agreed_exit_is_left_unfinished_and_never_restored(
        tmp_path: Path, base: Path) -> None:
    """Process 0's periodic copy of step 4 is still being sent (held 30 s) when the agreed save comes: no memory
    copy beside it, and process 0 leaves at once instead of waiting for the older copy (before: 5 s in the tier's
    close). The unfinished put is never a copy at its holder, and attempt 2 restores the agreed step, which only
    storage holds whole, not step 4; the run ends as an uninterrupted one."""
    slow = {"REPRIEVE_MEMTIER_TEST_SLOW_COPY": "4:30", "WORKER_NO_WAIT_AT": ",".join(map(str, range(4, 14)))}
    pods, logs, step = noticed_on_node_b(tmp_path, base, slow)
    assert f"agreed step {step}: no memory copy beside the storage save (the previous copy" in logs[0], logs[0]
    assert "leaving with the copy of step 4 unfinished: the restart reads the agreed step" in logs[0], logs[0]
    left = seconds_between(logs[0], f"agreed checkpoint at step {step} committed", "exiting with code 42")
    assert left < 2.0, logs[0][-3000:]  # before: 5 s
    held = sorted(e.name for e in (pods[1].mem / "peer").iterdir())
    assert str(CopyName(4, 1, 0)) not in held, held  # never committed at the holder
    pods[1] = new_pod(base, "pod-1b")
    gang = launch(tmp_path, pods, ring(pods), attempt=2, steps=TOTAL)
    finals = finish(gang, 2, TOTAL)  # an uninterrupted run's parameters and data position
    assert restored(gang.logs)[0] == step
    assert all(f["restored_from"]["step"] == int(step) for f in finals), finals


def test_a_corrupt_copy_is_skipped_for_the_next_source(tmp_path: Path, base: Path) -> None:
    pods = [new_pod(base, "pod-0"), new_pod(base, "pod-1")]
    gang = launch(tmp_path, pods, ring(pods), attempt=1, steps=TOTAL, stop_at=14)
    run_until_stopped(gang, 2)
    data = pods[1].mem / "own" / str(CopyName(14, 1, 1)) / DATA_FILE
    raw = bytearray(data.read_bytes())
    raw[8] ^= 0xFF
    data.write_bytes(bytes(raw))
    gang = launch(tmp_path, pods, ring(pods), attempt=2, steps=TOTAL)
    finish(gang, 2, TOTAL)
    assert restored(gang.logs) == ["14", "memory", "peer"]  # process 1 read its replica from pod 0
    assert "fails its checksum" in gang.logs[1].read_text()


def test_a_process_and_its_peer_lost_together_fall_back_to_storage(tmp_path: Path, base: Path) -> None:
    """Three pods in a ring (0 -> 1 -> 2 -> 0): losing process 1 and the pod holding its replica (pod 2) loses
    process 1's step 14 everywhere; the gang restores step 9 (storage's, and the one every process kept in memory
    beside 14, the gang's step when it wrote 14: docs/memory.md, "bounded"): process 0 from its own memory, process
    2 from its replica in pod 0, process 1 from storage; bit-identical."""
    pods = [new_pod(base, f"pod-{i}") for i in range(3)]
    gang = launch(tmp_path, pods, {0: pods[1], 1: pods[2], 2: pods[0]}, attempt=1, steps=TOTAL, stop_at=14)
    run_until_stopped(gang, 3, die=1)
    # 14 was the newest copy everywhere: when each process wrote it, its own list held no 14 yet, so the gang's step
    # was 9 at most, and each kept 9 in its pod and at its holder beside 14
    assert (pods[0].mem / "own" / str(CopyName(9, 1, 0)) / MANIFEST_FILE).exists()
    assert (pods[0].mem / "peer" / str(CopyName(9, 1, 2)) / MANIFEST_FILE).exists()
    for i in (1, 2):
        pods[i].lose()
        pods[i] = new_pod(base, f"pod-{i}b")
    gang = launch(tmp_path, pods, {0: pods[1], 1: pods[2], 2: pods[0]}, attempt=2, steps=TOTAL)
    finish(gang, 3, TOTAL)
    assert restored(gang.logs) == ["9", "memory", "storage", "peer"]
    assert "memory holds step 14 (attempt 1) without processes [1]" in gang.logs[0].read_text()


def test_a_storage_step_fills_in_only_the_processes_memory_lacks(tmp_path: Path, base: Path) -> None:
    """Storage saves the same step as memory (14); the copies of processes 1 and 2 are lost everywhere (their
    nodes, and process 2's replica on process 0's): processes 1 and 2 read storage, together (each says so before
    its reads, so the storage readers know one another and share what they both need), while process 0 keeps
    reading memory (mixed), instead of sending the whole gang to storage.

    Why this long: two attempts of a three-process gang; each process start imports JAX and joins
    jax.distributed (about 10 s per attempt on an idle 2-core machine, up to a minute under a full load)."""
    pods = [new_pod(base, f"pod-{i}") for i in range(3)]
    peers = {0: pods[1], 1: pods[2], 2: pods[0]}
    gang = launch(tmp_path, pods, peers, attempt=1, steps=TOTAL, stop_at=14, ckpt_every=5)
    run_until_stopped(gang, 3, die=1)
    for i in (1, 2):
        pods[i].lose()
        pods[i] = new_pod(base, f"pod-{i}b")
    shutil.rmtree(pods[0].mem / "peer")  # process 2's replica
    gang = launch(tmp_path, pods, {0: pods[1], 1: pods[2], 2: pods[0]}, attempt=2, steps=TOTAL, ckpt_every=5)
    finish(gang, 3, TOTAL)
    assert restored(gang.logs) == ["14", "memory", "storage", "storage"]
    for log in gang.logs[1:]:
        assert "processes [1, 2] read step 14 from storage together" in log.read_text(), log.read_text()[-3000:]
    assert "from storage together" not in gang.logs[0].read_text()


def test_a_copy_from_an_older_attempt_is_fenced(tmp_path: Path, base: Path) -> None:
    """Attempt 2 restores step 14 and saves step 19; a stale writer of attempt 1 then leaves step 24 copies in
    both pods (planted here). Attempt 3 must restore attempt 2's step 19: attempt 2 started from 14 < 24.

    Why this long: three attempts of a two-process gang (each start imports JAX and joins jax.distributed)."""
    pods = [new_pod(base, "pod-0"), new_pod(base, "pod-1")]
    gang = launch(tmp_path, pods, ring(pods), attempt=1, steps=TOTAL, stop_at=14)
    run_until_stopped(gang, 2)
    gang = launch(tmp_path, pods, ring(pods), attempt=2, steps=TOTAL, stop_at=19)
    run_until_stopped(gang, 2)
    for pod in pods:
        for tree in ("own", "peer"):
            for copy in (pod.mem / tree).iterdir():
                _plant_stale(copy, step=24, attempt=1)
    gang = launch(tmp_path, pods, ring(pods), attempt=3, steps=TOTAL)
    finals = finish(gang, 2, TOTAL)
    assert restored(gang.logs) == ["19", "memory", "memory"]
    assert finals[1]["restored_from"]["step"] == 19


def test_a_changed_process_count_restores_from_memory(tmp_path: Path, base: Path) -> None:
    """Two processes save step 14; one process (in pod 0, which holds both copies) restores it: 2 -> 1."""
    pods = [new_pod(base, "pod-0"), new_pod(base, "pod-1")]
    gang = launch(tmp_path, pods, ring(pods), attempt=1, steps=TOTAL, stop_at=14)
    run_until_stopped(gang, 2)
    pods[1].lose()
    gang = launch(tmp_path, pods[:1], {}, attempt=2, steps=TOTAL)
    finish(gang, 1, TOTAL)
    assert restored(gang.logs) == ["14", "memory"]


def _plant_stale(copy: Path, *, step: int, attempt: int) -> None:
    """A copy as a stale process of ``attempt`` would have written it for ``step`` (its data: the same bytes)."""
    m = Manifest.from_bytes((copy / MANIFEST_FILE).read_bytes(), str(copy))
    stale = Manifest(**{**m.__dict__, "step": step, "attempt": attempt, "base": None})
    target = copy.parent / str(CopyName(step, attempt, m.writer))
    shutil.copytree(copy, target)
    (target / MANIFEST_FILE).write_bytes(stale.to_bytes())
    assert json.loads(stale.to_bytes().rsplit(b"\ncrc32c=", 1)[0])["step"] == step


def spare_server(tmp_path: Path, spare: Pod, *, crash_at: str | None = None) -> subprocess.Popen[bytes]:
    """A spare pod's replica server (what its reprieve-supervisor serves), serving once it printed its address;
    ``crash_at`` (e.g. ``receive:9``): it dies half-way through receiving that step."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "runtime")}
    if crash_at:
        env["REPRIEVE_MEMTIER_TEST_CRASH_AT"] = crash_at
    with open(tmp_path / "spare.log", "ab") as log:
        server = subprocess.Popen([sys.executable, "-m", "reprieve.memtier.server", "--dir", str(spare.mem),
                                   "--port", str(spare.port)], env=env, stdout=subprocess.PIPE, stderr=log)
    assert server.stdout is not None and server.stdout.readline().strip().decode() == spare.address
    return server


def attempt_2_without_pod_0(tmp_path: Path, base: Path, pods: list[Pod], spare: Pod) -> Gang:
    """Process 0's pod lost with its memory; attempt 2 runs to the end with process 0 in a new pod, its replicas
    at the spare and process 1's at the new pod."""
    pods[0].lose()
    pods[0] = new_pod(base, "pod-0b")
    gang = launch(tmp_path, pods, {0: spare, 1: pods[0]}, attempt=2, steps=TOTAL)
    finish(gang, 2, TOTAL)
    return gang


def test_a_peer_lost_while_it_receives_a_copy(tmp_path: Path, base: Path) -> None:
    """Process 0's replicas live in a pod that only holds replicas (a spare's replica server). It dies half-way
    through receiving step 9 and comes back (its supervisor restarted): training never waits for it, the torn
    copy is never listed, replication resumes. Then process 0's pod is lost: it restores from that replica.

    Why this long: two attempts of a two-process gang and two starts of the spare's replica server."""
    pods = [new_pod(base, "pod-0"), new_pod(base, "pod-1")]
    spare = new_pod(base, "spare")
    server = spare_server(tmp_path, spare, crash_at="receive:9")
    # the gang holds after step 9 until the spare's supervisor has restarted its server (the file "go")
    gang = launch(tmp_path, pods, {0: spare, 1: pods[0]}, attempt=1, steps=TOTAL, stop_at=14, hold_at=9)
    try:
        assert server.wait(60) == 86, "the replica server did not die half-way through step 9"
        held = sorted(e.name for e in (spare.mem / "peer").iterdir())
        assert held == [str(CopyName(4, 1, 0)), str(CopyName(9, 1, 0).in_flight)], held  # step 9 torn, unlisted
        server = spare_server(tmp_path, spare)
        (tmp_path / "go").touch()
        run_until_stopped(gang, 2)
        # beside 14, process 0's copy of 4: the newest step the whole gang replicated (its 9 never arrived)
        held = sorted(e.name for e in (spare.mem / "peer").iterdir())
        assert held == [str(CopyName(4, 1, 0)), str(CopyName(14, 1, 0))], held
        assert "not replicated to " + spare.address in gang.logs[0].read_text()
        gang = attempt_2_without_pod_0(tmp_path, base, pods, spare)
    finally:
        server.kill()
        server.wait(10)
    # process 1 reads its own rows at home, but the replicated leaves' replica 0 was process 0's: from the spare
    assert restored(gang.logs) == ["14", "peer", "peer"]


def test_a_process_lost_before_it_replicated_its_newest_copy_restores_the_step_before_from_memory(
        tmp_path: Path, base: Path) -> None:
    """Process 0's replica server (a spare's) dies while it receives step 14, then process 0's pod is lost: its
    newest copy anywhere is step 9, at the spare. Process 1 keeps its own copy of 9 beside 14 until the whole gang
    has replicated 14, so the gang restores 9 from memory instead of reading storage.

    Why this long: two attempts of a two-process gang and two starts of the spare's replica server."""
    pods = [new_pod(base, "pod-0"), new_pod(base, "pod-1")]
    spare = new_pod(base, "spare")
    server = spare_server(tmp_path, spare, crash_at="receive:14")
    try:
        gang = launch(tmp_path, pods, {0: spare, 1: pods[0]}, attempt=1, steps=TOTAL, stop_at=14,
                      extra={0: {"WORKER_STOP_UNREPLICATED": "1", "WORKER_LOCKSTEP": "1"},
                             1: {"WORKER_LOCKSTEP": "1"}})
        run_until_stopped(gang, 2, die=0)
        assert server.wait(60) == 86, "the replica server did not die half-way through step 14"
        own = sorted(e.name for e in (pods[1].mem / "own").iterdir())
        assert own == [str(CopyName(9, 1, 1)), str(CopyName(14, 1, 1))], own  # 14 is not the gang's yet
        server = spare_server(tmp_path, spare)
        gang = attempt_2_without_pod_0(tmp_path, base, pods, spare)
    finally:
        server.kill()
        server.wait(10)
    # process 1's own rows come from its own copy, the replicated leaves (replica 0: process 0's) from the spare;
    # without the kept copy of 9, process 1 had only 14 and read storage: ["9", "peer", "storage"]
    assert restored(gang.logs) == ["9", "peer", "peer"]
    assert "restored step 9 on process 1 from" in gang.logs[1].read_text()


def test_a_time_schedule_is_remeasured_capped_and_the_same_steps_on_every_process(tmp_path: Path,
                                                                                    base: Path) -> None:
    """``REPRIEVE_MEMORY_INTERVAL_SECONDS`` with a slow warm-up (the first 8 steps take 0.4 s, then 0.02 s):
    process 0 turns it into steps after the first save (every step or two: the warm-up's), re-measures and
    publishes a new schedule once the steps are fast (0.5 s would be ~25 steps, capped at half the storage
    interval of 20 steps), every process switches at the same step, and the run ends with a memory copy newer
    than the newest periodic storage checkpoint."""
    pods = [new_pod(base, "pod-0"), new_pod(base, "pod-1")]
    total, ckpt_every = 120, 20
    slow_then_fast = {i: {"REPRIEVE_MEMORY_INTERVAL_SECONDS": "0.5", "WORKER_STEP_SECONDS": "0.02",
                          "WORKER_SLOW_STEPS": "8", "WORKER_SLOW_SECONDS": "0.4"} for i in range(2)}
    gang = launch(tmp_path, pods, ring(pods), attempt=1, steps=total, mem_every=0, ckpt_every=ckpt_every,
                  extra=slow_then_fast)
    codes = gang.wait(180)
    assert codes == [0, 0], gang.tail(40)
    # the tier's line for each schedule (memtier.schedule.interval_line; "memory saves every N steps ..." before it)
    published = [(int(every or 1), int(start), int(anchor or start), int(version), float(step_s))
                 for every, start, anchor, version, step_s in re.findall(
                     r"memory (?:saves|copies) every (?:(\d+) steps|step) (?:\(~[^)]*\) )?from step (\d+)"
                     r"(?:, counted from step (\d+))? \(schedule (\d+)\)?: .*a step takes ([\d.]+) ?s",
                     gang.logs[0].read_text())]
    assert len(published) >= 2 and [p[3] for p in published] == list(range(1, len(published) + 1)), gang.tail(40)
    assert published[0][0] <= 2, published  # measured in the warm-up: 0.5 s is a step or two
    last_every, _, _, _, fast_s = published[-1]
    assert last_every == min(ckpt_every // 2, round(0.5 / fast_s)), published  # re-measured, capped by storage
    plans: tuple[schedule.Schedule, ...] = tuple(schedule.Schedule(e, s, v, a) for e, s, a, v, _ in published)
    saved = []
    for step in range(total):
        current, plans = schedule.in_force(plans, step)
        if step == schedule.first_save(0) or (current is not None and current.due(step)):
            saved.append(step)
    newest = saved[-1]
    assert total - 1 - newest < ckpt_every // 2, saved  # newer than the last periodic storage step (99)
    # every process saved the same steps: both held their copy of the newest, and pod 0 process 1's replica, until
    # the finished job deleted them (the line names what it deleted)
    held = [re.findall(r"the job finished: deleted its \d+ copies in \S+: (.*)", log.read_text()) for log in gang.logs]
    for i, lines in enumerate(held):
        assert lines, gang.tail(20)
        own = sorted(c for c in lines[-1].split(", ") if c.startswith("own/"))
        assert own[-1].startswith(f"own/s{newest:010d}_a1_p{i}"), (i, lines)
    assert f"peer/{CopyName(newest, 1, 1)}" in held[0][-1].split(", "), held[0]
    for pod in pods:
        assert list((pod.mem / "own").iterdir()) == [], pod  # nothing left behind by a finished job


def test_a_new_run_with_its_own_checkpoint_root_ignores_the_pods_copies_of_another_root(tmp_path: Path,
                                                                                       base: Path) -> None:
    """Issue #46, 1: the same memory directories (and replica servers) used by a new run with a new, empty
    REPRIEVE_CHECKPOINT_URI restored the previous run's copies and named the new directory as their source. Every
    process now ignores the other root's copies, its own pod's and those its peer's server lists, each with a line,
    and the new run starts at step 0."""
    pods = [new_pod(base, "pod-0"), new_pod(base, "pod-1")]
    gang = launch(tmp_path / "first", pods, ring(pods), attempt=1, steps=TOTAL, stop_at=14)
    run_until_stopped(gang, 2)
    gang = launch(tmp_path / "second", pods, ring(pods), attempt=1, steps=TOTAL)
    finals = finish(gang, 2, TOTAL)
    assert [f["restored_from"] for f in finals] == [None, None]
    old = tmp_path / "first" / "ckpt"
    for i, log in enumerate(gang.logs):
        text = log.read_text()
        assert f"no checkpoint under {tmp_path / 'second' / 'ckpt'}: starting at step 0" in text, text[-3000:]
        assert f"in {pods[i].mem} belongs to checkpoint root {old}, not this run's" in text, text[-3000:]
        assert (f"in the peer {pods[1 - i].address} belongs to checkpoint root {old}, not this run's"
                in text), text[-3000:]
        assert "restored step 14" not in text
