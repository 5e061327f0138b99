"""The benchmarks' state-size option (hack/localcluster/statesize.py; issue #48): the memory tier's room, what a job
needs of the machine, and the refusal with the numbers, table-tested; the soak and the goodput benchmark refuse a
state the machine cannot hold before starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from localcluster import statesize

from tests.benchmark_module import load_benchmark

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("state_mib", "limit"), [
    (0, "256Mi"),       # the example's own ~1 MiB: the floor
    (64, "256Mi"),      # 3 x 65 x 1.1 = 214.5: still under the floor
    (100, "334Mi"),     # 3 x 101 x 1.1 = 333.3
    (1024, "3383Mi"),   # 3 x 1025 x 1.1 = 3382.5
])
def test_the_memory_tiers_room_is_three_copies_and_a_tenth(state_mib: float, limit: str) -> None:
    assert statesize.tier_size_limit(state_mib) == limit


@pytest.mark.parametrize(("state_mib", "processes", "devices", "available", "needed", "why"), [
    (0, 2, 2, 8000, 2 * (7 + 600) + 2048, None),
    # 1 GiB a process fits this 24 GiB machine when quiet: 6 copies with one device a process, 7 with two
    (1024, 2, 1, 22000, 2 * (1025 * 6 + 600) + 2048, None),
    (1024, 2, 2, 19000, 2 * (1025 * 7 + 600) + 2048, None),
    (1024, 2, 2, 17000, 2 * (1025 * 7 + 600) + 2048,
     ("--state-mib 1024: 2 trainer processes of 2 device(s) need about 17598 MiB (7 copies of each one's 1025 MiB "
      "state: 4 in the process (the state on each device, the two tiers' host copies), 3 in its memory tier "
      "volume; 600 MiB a process without it; 2048 MiB for the cluster) and this machine has 17000 MiB available "
      "(MemAvailable): use --state-mib 981 or less")),
    (-1, 2, 2, 8000, None, "--state-mib must be a number >= 0 (MiB), got -1"),
    (float("nan"), 2, 2, 8000, None, "--state-mib must be a number >= 0 (MiB), got nan"),
])
def test_a_state_the_machine_cannot_hold_is_refused_with_the_numbers(state_mib: float, processes: int, devices: int,
                                                                   available: int, needed: int | None,
                                                                   why: str | None) -> None:
    if needed is not None:
        assert statesize.memory_needed_mib(state_mib, processes, devices) == needed
    assert statesize.refusal(state_mib, processes, devices, available) == why


def test_a_checkpoint_storage_in_memory_counts_its_copies_and_says_how_to_need_none() -> None:
    """The soak's storage faults put the checkpoints on a tmpfs: keep + 2 copies of each process's state more."""
    assert statesize.storage_copies(3) == 5
    assert statesize.memory_needed_mib(1024, 2, 2, in_storage=5) == 2 * (1025 * 12 + 600) + 2048
    assert statesize.refusal(1024, 2, 2, 23500) is None
    assert statesize.refusal(1024, 2, 2, 23500, in_storage=5) == (
        "--state-mib 1024: 2 trainer processes of 2 device(s) need about 27848 MiB (12 copies of each one's 1025 MiB "
        "state: 4 in the process (the state on each device, the two tiers' host copies), 3 in its memory tier "
        "volume, 5 in the checkpoint storage's tmpfs (the storage faults: leave them out of --faults to need none); "
        "600 MiB a process without it; 2048 MiB for the cluster) and this machine has 23500 MiB available "
        "(MemAvailable): use --state-mib 842 or less")


def test_the_soak_counts_its_storage_tmpfs_only_when_a_storage_fault_is_planned(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    soak = load_benchmark("soak")
    monkeypatch.setattr(statesize, "mem_available_mib", lambda: 23500)
    base = ["--minutes", "1", "--fault-every", "15", "--state-mib", "1024"]
    assert soak.parse_args([*base, "--faults", "node-lost"])[0].state_mib == 1024
    with pytest.raises(SystemExit) as exit_:
        soak.parse_args([*base, "--faults", "node-lost,storage-full"])
    assert exit_.value.code == 2
    assert "5 in the checkpoint storage's tmpfs" in capsys.readouterr().err


def test_mem_available_is_read_in_mib(tmp_path: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24576000 kB\nMemFree:         1000000 kB\nMemAvailable:   16255000 kB\n")
    assert statesize.mem_available_mib(info) == 15874
    info.write_text("MemTotal:       24576000 kB\n")
    with pytest.raises(RuntimeError, match="has no MemAvailable line"):
        statesize.mem_available_mib(info)


@pytest.mark.parametrize("benchmark", ["soak", "goodput"])
def test_the_benchmarks_refuse_a_state_too_large_before_starting_anything(
        benchmark: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_benchmark(benchmark)
    with pytest.raises(SystemExit) as exit_:
        if benchmark == "soak":
            module.parse_args(["--state-mib", "10000000", "--faults", "node-lost", "--minutes", "1"])
        else:
            monkeypatch.setattr("sys.argv", ["goodput.py", "--state-mib", "10000000"])
            module.main()
    assert exit_.value.code == 2
    assert "--state-mib 1e+07: 2 trainer processes of 2 device(s) need about" in capsys.readouterr().err


def test_the_soaks_memory_tier_grows_with_the_state_unless_given() -> None:
    soak = load_benchmark("soak")
    base = ["--faults", "node-lost", "--minutes", "1", "--fault-every", "15"]
    assert soak.parse_args(base)[0].memory == "256Mi"
    assert soak.parse_args([*base, "--state-mib", "100"])[0].memory == "334Mi"
    assert soak.parse_args([*base, "--state-mib", "100", "--memory", "1Gi"])[0].memory == "1Gi"
    assert soak.parse_args([*base, "--memory", ""])[0].memory == ""  # the tier off
