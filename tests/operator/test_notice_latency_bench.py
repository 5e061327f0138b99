"""benchmarks/notice_latency.py at a tiny scale: the benchmark itself keeps working (it once broke unnoticed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


def test_notice_latency_benchmark_runs_and_reports_every_job() -> None:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "notice_latency.py"), "--nodes", "20",
                          "--jobs", "10", "--replicas", "4", "--trials", "3", "--per-job", "--load", "40"],
                         capture_output=True, text=True, timeout=280, check=False)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout[-2000:] + out.stderr[-3000:]
    report, _ = json.JSONDecoder().raw_decode(out.stdout[out.stdout.index("{"):])
    assert report["jobs_measured"] == 6  # 3 tainted nodes x 2 jobs with pods on each
    # trials 0 and 2: the jobs' pods watch their notice object; trial 1: they do not (the per-pod annotation)
    assert (report["object_jobs_measured"], report["annotation_jobs_measured"]) == (4, 2)
    for path in ("object", "annotation"):  # the numbers are the benchmark's to judge
        assert 0 < report[f"{path}_p50_s"] <= report[f"{path}_p99_s"] <= report[f"{path}_max_s"]
    # one write per job, no Event but the job's own; the fallback: 4 pods + the object per job, and their Events
    assert report["object_writes_per_notice"] == 2 and report["object_events_per_notice"] == 2
    assert report["annotation_writes_per_notice"] == 10 and report["annotation_events_per_notice"] == 12
    assert report["peer_direct_patch_p50_s"] > 0 and report["operator_rss_mb"] > 0
    assert set(report["operator_peak_rss_mb_by_stage"]) == {"start-up", "goodput", "notices", "one notice per job"}
    # one notice per job: the trials' nodes no trial struck (12 and 16) at once, 2 jobs each (jobs 4 and 9 watching
    # their object, 3 and 8 not); each hit job measured once, beside its own peer
    assert report["per_job_jobs_hit"] == 4 and report["per_job_jobs_measured"] == 4
    assert (report["per_job_object_jobs_measured"], report["per_job_annotation_jobs_measured"]) == (2, 2)
    assert report["per_job_object_writes_per_notice"] <= 4  # objects written: at most one per job hit
    assert report["per_job_peer_direct_patch_p50_s"] > 0
    # the API server's floor for the burst's object path: one ConfigMap a watching job hit, created by hand
    assert 0 < report["per_job_object_floor_p50_s"] <= report["per_job_object_floor_p99_s"]
    # the background load: asked and achieved (raw keep-alive HTTP from one process)
    assert report["load_writes_per_s_asked"] == 40 and report["load_writes_per_s_achieved"] >= 30
    assert "goodput accounting on for all 10 jobs" in out.stdout, out.stdout[-2000:]
    # the operator's figures are printed before the bursts' peer (which has taken a 50,000-pod API server down)
    before = out.stdout[out.stdout.index("before the bursts' peer:"):out.stdout.index("{")]
    assert "one notice per job, object: taint -> every pod of a job hears the notice" in before, out.stdout[-3000:]
    assert "operator RSS" in before
