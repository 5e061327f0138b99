"""Runtime metrics: values, Prometheus text, and both exporters over real HTTP on a free port."""

from __future__ import annotations

import urllib.request

import pytest
from reprieve.metrics import Metrics

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def filled() -> Metrics:
    m = Metrics()
    m.inc("reprieve_notices_total", source="sigterm", reason="sigterm")
    m.inc("reprieve_notices_total", source="sigterm", reason="sigterm")
    m.inc("reprieve_notices_total", source="annotation", reason='gke "spot"')
    m.set("reprieve_agreed_step", 1234)
    m.set("reprieve_step_average_seconds", 0.125)
    m.observe("reprieve_restore_seconds", 0.3)
    m.pending_steps.extend([0.004, 0.02, 0.02])
    m.inc("reprieve_saves_total", kind="final")
    return m


def test_values_and_text() -> None:
    m = filled()
    assert m.get("reprieve_notices_total", source="sigterm", reason="sigterm") == 2
    text = m.render()
    assert 'reprieve_notices_total{reason="sigterm",source="sigterm"} 2.0' in text
    assert 'reprieve_notices_total{reason="gke \\"spot\\"",source="annotation"} 1.0' in text
    assert "reprieve_agreed_step 1234.0" in text and "reprieve_last_committed_step -1.0" in text
    assert "# TYPE reprieve_saves_total counter" in text
    # histograms: cumulative buckets, _sum and _count; step times appended without a lock are observed too
    assert "# TYPE reprieve_step_seconds histogram" in text
    assert 'reprieve_step_seconds_bucket{le="0.005"} 1.0' in text
    assert 'reprieve_step_seconds_bucket{le="0.025"} 3.0' in text and 'reprieve_step_seconds_bucket{le="+Inf"} 3.0' in text
    assert "reprieve_step_seconds_count 3.0" in text and "reprieve_step_seconds_sum 0.044" in text
    assert 'reprieve_restore_seconds_bucket{le="0.25"} 0.0' in text and 'reprieve_restore_seconds_bucket{le="0.5"} 1.0' in text
    assert m.histogram("reprieve_step_seconds") == (3, pytest.approx(0.044))


def test_unknown_metric_is_an_error() -> None:
    with pytest.raises(KeyError, match="unknown metric 'reprieve_nope'"):
        Metrics().set("reprieve_nope", 1)


@pytest.mark.parametrize("exporter", ["prometheus_client", "stdlib"])
def test_exporters_serve_the_values(exporter: str) -> None:
    m = filled()
    if exporter == "stdlib":
        port = m._serve_stdlib(0, "127.0.0.1")
    else:
        pytest.importorskip("prometheus_client")
        port = m._serve_prometheus_client(0, "127.0.0.1")
    try:
        m.set("reprieve_agreed_step", 99)  # served live, not a snapshot at start
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        m.close()
    assert "reprieve_agreed_step 99.0" in body
    assert 'reprieve_notices_total{reason="sigterm",source="sigterm"} 2.0' in body
    assert 'reprieve_saves_total{kind="final"} 1.0' in body
    assert 'reprieve_step_seconds_bucket{le="0.025"} 3.0' in body and "reprieve_step_seconds_count 3.0" in body
    assert 'reprieve_restore_seconds_bucket{le="+Inf"} 1.0' in body
