"""``reprieve-operator`` / ``python -m reprieve_operator``: run the operator (kopf, standalone)."""

from __future__ import annotations

import argparse
import logging
import os

import kopf


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="reprieve-operator", description=__doc__)
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="namespace to watch (repeatable; globs allowed); default: all namespaces")
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("REPRIEVE_METRICS_PORT", "8080")),
                   help="Prometheus /metrics port (0 disables)")
    p.add_argument("--liveness-port", type=int, default=int(os.environ.get("REPRIEVE_HEALTH_PORT", "0")),
                   help="serve kopf's /healthz on this port (0 disables)")
    p.add_argument("--resync-seconds", type=float, default=60.0,
                   help="period of the safety-net reconcile of every unfinished job")
    p.add_argument("--log-level", default=os.environ.get("REPRIEVE_LOG_LEVEL", "INFO"))
    p.add_argument("--notice-horizon-seconds", type=float,
                   default=float(os.environ.get("REPRIEVE_NOTICE_HORIZON_SECONDS", "600")),
                   help="deliver a notice once its deadline is at most this far away; until then it is held "
                        "(a maintenance scheduled days ahead does not make jobs Preempting for days)")
    p.add_argument("--signals-json", default=None,
                   help="signal table as JSON (default: $REPRIEVE_SIGNALS_JSON, else built-in defaults)")
    return p.parse_args(argv)


def _limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives every thread its own heap arena; with a 32-thread API pool that multiplies RSS. Must run
    before any thread starts (same as MALLOC_ARENA_MAX=2)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc
        pass


def main(argv: list[str] | None = None) -> None:
    _limit_malloc_arenas()
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLogger().level > logging.DEBUG:
        # kopf logs every handler run at INFO ("Handler 'pod_event' succeeded"): one line per pod event.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    from . import main as registration  # noqa: F401  (registers the handlers)

    if args.notice_horizon_seconds <= 0:
        raise SystemExit(f"--notice-horizon-seconds must be > 0, got {args.notice_horizon_seconds}")
    memo = kopf.Memo(metrics_port=args.metrics_port, signals_json=args.signals_json, namespaces=args.namespace,
                     resync_seconds=args.resync_seconds, notice_horizon_seconds=args.notice_horizon_seconds)
    kopf.run(
        standalone=True,  # one replica (Deployment strategy Recreate); no peering objects needed
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None,
        memo=memo,
    )


if __name__ == "__main__":
    main()
