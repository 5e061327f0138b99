"""``reprieve-operator`` / ``python -m reprieve_operator``: run the operator (kopf, standalone)."""

from __future__ import annotations

import argparse
import logging
import os

import kopf

from .policy.restart import PEER_LOST_WAIT_SECONDS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="reprieve-operator", description=__doc__)
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="namespace to watch (repeatable; globs allowed); default: all namespaces")
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("REPRIEVE_METRICS_PORT", "8080")),
                   help="Prometheus /metrics port (0 disables)")
    p.add_argument("--metrics-job-label", action=argparse.BooleanOptionalAction,
                   default=os.environ.get("REPRIEVE_METRICS_JOB_LABEL", "true").lower() not in ("0", "false", "no"),
                   help="label per-job series with the job's name (off: aggregate per namespace, for fleets with "
                        "very many jobs)")
    p.add_argument("--liveness-port", type=int, default=int(os.environ.get("REPRIEVE_HEALTH_PORT", "0")),
                   help="serve kopf's /healthz on this port (0 disables)")
    p.add_argument("--resync-seconds", type=float, default=60.0,
                   help="period of the safety-net reconcile of every unfinished job")
    p.add_argument("--log-level", default=os.environ.get("REPRIEVE_LOG_LEVEL", "INFO"))
    p.add_argument("--notice-horizon-seconds", type=float,
                   default=float(os.environ.get("REPRIEVE_NOTICE_HORIZON_SECONDS", "600")),
                   help="deliver a notice once its deadline is at most this far away; until then it is held "
                        "(a maintenance scheduled days ahead does not make jobs Preempting for days)")
    p.add_argument("--peer-lost-wait-seconds", type=float,
                   default=float(os.environ.get("REPRIEVE_PEER_LOST_WAIT_SECONDS", str(PEER_LOST_WAIT_SECONDS))),
                   help="how long a worker that exited because it lost a peer waits for that peer to show lost "
                        "(its pod or node) before the exit counts as a failure")
    p.add_argument("--leader-elect", action="store_true",
                   default=os.environ.get("REPRIEVE_LEADER_ELECT", "") in ("1", "true"),
                   help="run as one of several replicas: act only while holding a Lease (standbys wait)")
    p.add_argument("--leader-election-namespace", default=None,
                   help="namespace of the Lease (default: $POD_NAMESPACE, else the ServiceAccount's namespace)")
    p.add_argument("--leader-election-name", default="reprieve-operator", help="name of the Lease")
    p.add_argument("--lease-seconds", type=int, default=15, help="Lease duration (client-go's default)")
    p.add_argument("--renew-seconds", type=int, default=10, help="renew deadline (client-go's default)")
    p.add_argument("--retry-seconds", type=int, default=2, help="retry period (client-go's default)")
    p.add_argument("--log-format", choices=("plain", "json"),
                   default=os.environ.get("REPRIEVE_LOG_FORMAT", "plain"),
                   help="json: one JSON object per line (for Cloud Logging, Loki, ...)")
    p.add_argument("--kueue", action=argparse.BooleanOptionalAction,
                   default=os.environ.get("REPRIEVE_KUEUE", "").lower() in ("1", "true"),
                   help="jobs labelled kueue.x-k8s.io/queue-name wait for Kueue's admission (docs/kueue.md)")
    p.add_argument("--signals-json", default=None,
                   help="signal table as JSON (default: $REPRIEVE_SIGNALS_JSON, else built-in defaults)")
    return p.parse_args(argv)


def _limit_malloc_arenas(arenas: int = 2, mmap_threshold: int = 128 * 1024) -> None:
    """glibc gives every thread its own heap arena; with a 32-thread API pool that multiplies RSS. Must run
    before any thread starts (same as MALLOC_ARENA_MAX=2). A block of at least ``mmap_threshold`` bytes (a LIST
    page's body, its decoded strings) is mapped on its own and handed back when freed: glibc's default raises that
    threshold to the largest block freed so far (up to 32 MiB), after which a start-up's burst of large blocks lands
    in the heap, and the heap between the blocks that live on is never handed back."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, arenas)  # M_ARENA_MAX
        libc.mallopt(-3, mmap_threshold)  # M_MMAP_THRESHOLD: fixed (no dynamic raise)
    except (OSError, AttributeError):  # not glibc
        pass


def _json_formatter() -> logging.Formatter:
    """kopf's JSON formatter with the severity names log collectors know (Cloud Logging: WARNING, not warn)
    and the logger's name."""
    from kopf._core.actions.loggers import ObjectJsonFormatter

    class Formatter(ObjectJsonFormatter):  # type: ignore[misc]
        def add_fields(self, log_record: dict[str, object], record: logging.LogRecord,
                       message_dict: dict[str, object]) -> None:
            log_record["severity"] = record.levelname
            log_record["logger"] = record.name
            super().add_fields(log_record, record, message_dict)

    return Formatter(refkey="object")  # type: ignore[no-any-return]


def configure_logging(level: str, fmt: str) -> None:
    """Plain lines, or one JSON object per line with kopf's own formatter (its per-object loggers then add
    the object's namespace and name as fields)."""
    if fmt == "json":
        kopf.configure(log_format=kopf.LogFormat.JSON, log_refkey="object", verbose=level.upper() == "DEBUG")
        for handler in logging.getLogger().handlers:
            handler.setFormatter(_json_formatter())
        logging.getLogger().setLevel(level.upper())
    else:
        logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLogger().level > logging.DEBUG:
        # kopf logs every handler run at INFO ("Handler 'pod_event' succeeded"): one line per pod event.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def warm_up(api_client: object, namespaces: list[str]) -> None:
    """Make the kubernetes client build its request validators now, while standing by: the first call of
    each API method costs 1-5 s (pydantic), which would otherwise delay a failover."""
    from .apply import Api

    api = Api(api_client)  # type: ignore[arg-type]
    core, custom = api.core, api.custom
    ns = namespaces[0] if namespaces and not any(c in namespaces[0] for c in "*?[") else "default"
    calls = [lambda: core.list_node(limit=1, _preload_content=False),
             lambda: core.list_namespaced_pod(ns, limit=1, _preload_content=False),
             lambda: core.list_pod_for_all_namespaces(limit=1, _preload_content=False),
             lambda: custom.list_namespaced_custom_object("reprieve.dev", "v1alpha1", ns, "trainingjobs", limit=1,
                                                          _preload_content=False)]
    for call in calls:
        try:
            call().release_conn()  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001, S110 - a 403 (namespaced RBAC) warms the validator as well
            pass


def main(argv: list[str] | None = None) -> None:
    _limit_malloc_arenas()
    args = parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    from . import main as registration  # registers the handlers
    from . import metrics

    metrics.set_job_label(args.metrics_job_label)
    election = None
    if args.leader_elect:
        from .leadership import Election, ElectionSettings, default_namespace

        try:
            settings = ElectionSettings(namespace=args.leader_election_namespace or default_namespace(),
                                        name=args.leader_election_name, lease_seconds=args.lease_seconds,
                                        renew_seconds=args.renew_seconds, retry_seconds=args.retry_seconds)
        except ValueError as err:
            raise SystemExit(f"reprieve-operator: {err}") from err
        metrics.LEADER.set(0)
        metrics.serve(args.metrics_port)  # a standby is scraped too (reprieve_leader 0)
        standby = registration.standby_health(args.liveness_port)
        warm_up(registration.api_client(), args.namespace)
        election = Election(registration.api_client(), settings).start()
        election.wait_until_leading()
        if standby is not None:
            standby.shutdown()
            standby.server_close()
    metrics.LEADER.set(1)

    if args.notice_horizon_seconds <= 0:
        raise SystemExit(f"--notice-horizon-seconds must be > 0, got {args.notice_horizon_seconds}")
    if args.peer_lost_wait_seconds <= 0:
        raise SystemExit(f"--peer-lost-wait-seconds must be > 0, got {args.peer_lost_wait_seconds}")
    memo = kopf.Memo(metrics_port=args.metrics_port, signals_json=args.signals_json, namespaces=args.namespace,
                     resync_seconds=args.resync_seconds, notice_horizon_seconds=args.notice_horizon_seconds,
                     kueue=args.kueue, peer_lost_wait_seconds=args.peer_lost_wait_seconds)
    kopf.run(
        standalone=True,  # one replica (Deployment strategy Recreate); no peering objects needed
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None,
        memo=memo,
        # kopf would derive one from getpass.getuser(), which fails for a uid without a passwd entry.
        identity=os.environ.get("POD_NAME") or f"reprieve-operator-{os.getpid()}",  # type: ignore[arg-type]
    )
    if election is not None:
        election.release()


if __name__ == "__main__":
    main()
