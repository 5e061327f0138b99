"""What live progress reports cost the training loop: ``job.steps()`` with and without reporting, one run.

    .venv/bin/python benchmarks/progress.py [--step-ms 10] [--steps 500] [--blocks 8] [--interval 0.1]

One process, single-device JAX (no gang: reporting happens on process 0 only). A "step" sleeps ``--step-ms``
(the GIL is released, as it is while XLA computes). Blocks alternate between the peer (``job.steps()``, no
reporter: the training thread still stores its one tuple per step, which cannot be switched off) and the same
loop with a :class:`reprieve.progress.ProgressReporter` running every ``--interval`` seconds (default 0.1 s,
50x the shipped 5 s, so any contention shows) and patching a real HTTP server on loopback with the same JSON
merge patch the API server gets (plain HTTP, not TLS: the TLS handshake the real client pays is emulated by
none; it happens in the reporter's thread, off the GIL for the most part). Reported: median seconds per
step of each, the difference and its share of the step (target: < 0.1 % of a 10 ms step), and the
training-thread statements themselves in ns (timeit).
"""

from __future__ import annotations

import argparse
import http.server
import json
import statistics
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))


class _Sink(http.server.BaseHTTPRequestHandler):
    patches, cpu = 0, 0.0

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        json.loads(body)
        _Sink.patches += 1
        try:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the reporter gave up waiting (its timeout, under load) and closed: what an API server shrugs off

    def log_message(self, format: str, *args: Any) -> None:
        return


class LoopbackClient:
    """The KubeClient's patch, as plain HTTP to a local server (the benchmark's stand-in API server)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def patch_pod_annotations(self, namespace: str, pod: str, annotations: dict[str, Any], *,
                              timeout_s: float | None = None) -> None:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s or 5.0)
        try:
            body = json.dumps({"metadata": {"annotations": annotations}}).encode()
            conn.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod}", body,
                         {"Content-Type": "application/merge-patch+json"})
            conn.getresponse().read()
        finally:
            conn.close()


def run_block(job: Any, start: int, steps: int, step_s: float) -> float:
    t0 = time.perf_counter()
    for _step in job.steps(start, start + steps):
        time.sleep(step_s)
    return (time.perf_counter() - t0) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=500, help="steps per block")
    parser.add_argument("--blocks", type=int, default=8, help="blocks per variant (alternating)")
    parser.add_argument("--interval", type=float, default=0.1, help="reporter interval, seconds")
    args = parser.parse_args()

    import reprieve
    from reprieve.policy import SavePolicy
    from reprieve.progress import LoopProgress, ProgressReporter

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = LoopbackClient(server.server_address[1])
    step_s = args.step_ms / 1000
    work = Path(tempfile.mkdtemp(prefix="reprieve-progress-bench-"))
    times: dict[str, list[float]] = {"off": [], "on": []}
    patches, cpu = 0, 0.0
    for block in range(2 * args.blocks):
        variant = "off" if block % 2 == 0 else "on"
        job = reprieve.init(env={"REPRIEVE_CHECKPOINT_URI": str(work / f"b{block}")}, install_sigterm=False,
                            policy=SavePolicy(interval_steps=0, save_last=False))
        reporter = None
        if variant == "on":
            reporter = ProgressReporter(client, "bench", "bench-0", 1, interval_s=args.interval)  # type: ignore[arg-type]
            reporter.start(job.loop.fields)
        per_step = run_block(job, 0, args.steps, step_s)
        if reporter is not None:
            reporter.close()
            patches += reporter.patches
            cpu += reporter.cpu_seconds
        job.abandon()
        times[variant].append(per_step)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    paired = statistics.median(b - a for a, b in zip(times["off"], times["on"], strict=True))

    # The training thread's own statements per step (what reporting adds to it), in isolation.
    lp = LoopProgress()
    pending: Any = __import__("collections").deque(maxlen=100_000)
    n = 1_000_000

    def tracked() -> None:
        for step in range(n):
            now = time.perf_counter()
            lp.last = (step - 1, now)
            if lp.first is None:
                lp.first = lp.last
            pending.append(0.01)
            if len(pending) > 50_000:
                pending.clear()

    def bare() -> None:
        for _step in range(n):
            time.perf_counter()

    ns = (min(timeit.repeat(tracked, number=1, repeat=3)) - min(timeit.repeat(bare, number=1, repeat=3))) / n * 1e9

    diff = paired
    cpu_per_patch = cpu / max(1, patches)
    print(f"step {args.step_ms:g} ms, {args.blocks} blocks x {args.steps} steps per variant, reporter every "
          f"{args.interval:g} s ({patches} patches sent over loopback HTTP)")
    print(f"{'':38}{'seconds/step':>14}")
    print(f"{'no reporting (peer)':38}{off:>14.6f}")
    print(f"{'live reporting':38}{on:>14.6f}")
    print(f"{'difference (median of block pairs)':38}{diff * 1e6:>12.1f}us  = {diff / off:+.4%} of the step "
          f"(ratio {on / off:.5f}; block-to-block spread {statistics.pstdev(times['off']) * 1e6:.0f}us)")
    print(f"{'reporter thread CPU per patch':38}{cpu_per_patch * 1e6:>12.0f}us  -> at most "
          f"{cpu_per_patch / args.interval:.4%} of wall time at this interval, "
          f"{cpu_per_patch / 5.0:.5%} at the shipped 5 s")
    print(f"{'training-thread statements (timeit)':38}{ns:>12.0f}ns  = {ns * 1e-9 / step_s:.5%} of the step")
    print(f"block medians off: {', '.join(f'{t * 1e3:.3f}' for t in times['off'])} ms")
    print(f"block medians on:  {', '.join(f'{t * 1e3:.3f}' for t in times['on'])} ms")
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
