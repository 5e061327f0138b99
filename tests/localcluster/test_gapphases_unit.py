"""A noticed restart's phases read back from trainer logs (hack/localcluster/gapphases.py), on the lines the
runtime and reprieve-supervisor write."""

from __future__ import annotations

from pathlib import Path

import pytest
from localcluster.gapphases import cri_lines, main, phases, stamped

pytestmark = pytest.mark.unit

# One agreed exit, both pods' lines interleaved as a run writes them (pod A stays, pod B's node goes; a spare C).
EXIT = """\
2026-11-30 01:54:19,900 INFO reprieve.job: saving agreed step 128 (notice gke-spot/n-3/1, gke-spot); deadline in 7.1s
2026-11-30 01:54:20,050 INFO reprieve.job: saving agreed step 128 (notice gke-spot/n-3/1, gke-spot); deadline in 6.9s
2026-11-30 01:54:20,300 INFO reprieve.job: agreed checkpoint at step 128 committed on all 2 process(es), 7.86s after
2026-11-30 01:54:20,301 INFO reprieve.job: agreed checkpoint at step 128 committed on all 2 process(es), 7.86s after
2026-11-30 01:54:20,302 reprieve-supervisor[1] INFO attempt 1: the trainer (pid 11) is exiting with code 42: reported
2026-11-30 01:54:20,380 INFO reprieve.job: exiting with code 42: the agreed checkpoint of step 128 is committed
2026-11-30 01:54:20,400 INFO reprieve.job: exiting with code 42: the agreed checkpoint of step 128 is committed
2026-11-30 01:54:20,450 reprieve-supervisor[3] INFO attempt 2: the warm process (pid 33) took over 0.01s after the
2026-11-30 01:54:20,800 reprieve-supervisor[2] INFO attempt 1: trainer (pid 22) exited with code 42 after 9.0s (superseded)
2026-11-30 01:54:20,820 reprieve-supervisor[2] INFO stopping: nothing runs any more: exiting with code 42
2026-11-30 01:54:20,700 reprieve-supervisor[1] INFO attempt 1: trainer (pid 11) exited with code 42 after 9.0s (superseded)
2026-11-30 01:54:20,710 reprieve-supervisor[1] INFO attempt 2: the warm process (pid 12) took over 0.41s after the
2026-11-30 01:54:21,700 INFO reprieve.memtier.restore_round: restored step 128 on process 0 from its own pod's memory
2026-11-30 01:54:21,900 INFO reprieve.memtier.restore_round: restored step 128 on process 1 from a peer's memory
2026-11-30 01:54:22,400 reprieve-supervisor[3] INFO attempt 2: first step done 2.0s after the warm start
2026-11-30 01:54:23,100 reprieve-supervisor[1] INFO attempt 2: first step done 2.4s after the warm start
"""


def test_each_phase_runs_from_its_line_to_the_next_ones_last() -> None:
    (row,) = phases(stamped(EXIT.splitlines()))
    assert row == {"save": 0.4, "close": 0.1, "exit": 0.4, "takeover": -0.09, "restore": 1.19, "first_step": 1.2,
                   "total": 3.2}


def test_exits_are_told_apart_and_a_missing_line_is_none() -> None:
    later = EXIT.replace("01:54:", "01:56:")
    cut = "\n".join(line for line in later.splitlines() if "first step done" not in line)
    rows = phases(stamped([*EXIT.splitlines(), "not a log line", *cut.splitlines()]))
    assert len(rows) == 2
    assert rows[1]["first_step"] is None and rows[1]["total"] is None and rows[1]["restore"] == 1.19


def test_the_command_reads_a_run_directory_and_says_when_it_finds_nothing(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "cluster/nodes/n-0/pods/ns/pod-a/logs/trainer.log"
    log.parent.mkdir(parents=True)
    log.write_text(EXIT)
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "save=0.40 close=0.10 exit=0.40 takeover=-0.09 restore=1.19 first_step=1.20 total=3.20"]
    log.write_text("nothing agreed\n")
    assert main([str(tmp_path)]) == 1
    assert main([str(tmp_path / "missing")]) == 2


def test_real_nodes_kept_pod_logs_are_read_in_the_kubelets_format(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A real-node run keeps each pod's container log as the kubelet wrote it (CRI: time, stream, P/F, text); a
    line the kubelet split into partial records is joined back, and the phases come out as from process nodes."""
    def cri(text: str) -> str:
        out = []
        for i, line in enumerate(text.splitlines()):
            stamp = f"2026-11-30T01:54:{i:02d}.000000000Z"
            if i == 3:  # one line split in two partial records, with the other stream between them
                out += [f"{stamp} stderr P {line[:20]}", f"{stamp} stdout F unrelated",
                        f"{stamp} stderr F {line[20:]}"]
            else:
                out.append(f"{stamp} stderr F {line}")
        return "\n".join(out) + "\n"

    assert cri_lines(["t stderr P ab", "t stdout F x", "t stderr F cd", "garbage", "t stderr F "]) == ["x", "abcd", ""]
    lines = EXIT.splitlines()
    # a goodput run keeps them under the job's namespace, the soak under the node alone: both are read
    for run, where in (("goodput", "ns/node-1"), ("soak", "node-1")):
        for name, mine in (("pod-a", lines[::2]), ("pod-b", lines[1::2])):
            log = tmp_path / run / f"cluster/kept-pod-logs/{where}/ns_{name}_uid/trainer/0.log"
            log.parent.mkdir(parents=True)
            log.write_text(cri("\n".join(mine)))
        assert main([str(tmp_path / run)]) == 0
        assert capsys.readouterr().out.splitlines() == [
            "save=0.40 close=0.10 exit=0.40 takeover=-0.09 restore=1.19 first_step=1.20 total=3.20"]
