"""The trainers' peak memory per pod, sampled from /proc (hack/localcluster/peakmem.py): pure parsing table-tested,
and a real process that touches 200 MiB is seen at its peak under its pod's name, another process is not."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from localcluster.peakmem import PeakMemory, high_water_kib, in_words, pod_of

MARK = "peakmem-test-marker"


@pytest.mark.unit
def test_the_high_water_mark_and_the_pod_are_read_from_proc_texts() -> None:
    assert high_water_kib("Name:\tpython\nVmPeak:\t  900 kB\nVmHWM:\t  204800 kB\nVmRSS:\t 1000 kB\n") == 204800
    assert high_water_kib("Name:\tkthreadd\nState:\tS\n") is None
    assert pod_of(b"PATH=/bin\0REPRIEVE_POD_NAME=bench-0\0HOME=/\0") == "bench-0"
    assert pod_of(b"PATH=/bin\0HOME=/\0") == ""
    assert in_words({"bench-0": 2 * 2**20, "bench-1": 2**19}) == "bench-0 2.00 GiB, bench-1 0.50 GiB"
    assert in_words({}) == "none seen"


@pytest.mark.integration
def test_a_trainer_is_seen_at_its_peak_under_its_pods_name() -> None:
    script = (f"import time; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); del b; "
              f"print('peaked', flush=True); time.sleep(30)  # {MARK}")
    env = {**os.environ, "REPRIEVE_POD_NAME": "bench-0"}
    child = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(30)  # {MARK}"],
                             env={**os.environ, "REPRIEVE_POD_NAME": ""})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "peaked"
        sampler = PeakMemory(lambda cmd: MARK in cmd, interval=0.1).start()
        time.sleep(0.3)
        sampler.stop()
    finally:
        child.kill()
        other.kill()
        child.wait()
        other.wait()
    peaks = sampler.by_pod()
    assert list(peaks) == ["bench-0"], peaks  # the process without a pod name is not a trainer of a pod
    assert peaks["bench-0"] >= 200 * 1024, peaks  # freed before the sample: the high-water mark still says it
