"""``reprieve``: see and check checkpoints, and run a training script with restarts on a laptop.

    reprieve ls [URI]                every checkpoint: step, attempt, kind, state, size, when, run; quarantined and
                                     damaged ones (chunk files not the size reprieve.json implies)
    reprieve inspect [URI[@STEP]]    one checkpoint: leaves, shapes, dtypes, shardings, sizes, topology, data
                                     positions, run identity, versions (default: the one a restore takes)
    reprieve verify [URI[@STEP]]     read every chunk and check every checksum; exit 0 OK, 1 corrupt, 2 not found
    reprieve verify --all [URI]      the same for every committed checkpoint under the root
    reprieve run [--max-restarts N] -- python train.py
                                     the local restart loop (as the operator restarts a gang on a cluster)

``URI`` is a path, ``file://``, ``gs://`` or ``s3://`` (with the same credentials and endpoints a job uses), or a
checkpoint's own directory; without one, ``REPRIEVE_CHECKPOINT_URI`` or ``./checkpoints`` (where a job run here saves).
A root of ``reprieve.orbax.OrbaxCheckpointer`` (Orbax's format) is listed and inspected by its ``reprieve`` items. ``--json`` prints what a script reads instead of text. ``ls``, ``inspect`` and
``verify`` only read: nothing is created, cleaned or quarantined. The words come from
:mod:`reprieve.checkpoint.catalog` (pure), the reading from :mod:`reprieve.checkpoint.reader`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

EXIT_OK, EXIT_CORRUPT, EXIT_USAGE, EXIT_UNVERIFIED = 0, 1, 2, 3  # 3: the storage did not answer (verify: not corrupt)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reprieve", description="See, check and run Reprieve checkpoints "
                                     "(docs/runtime.md, 'The reprieve command').")
    parser.add_argument("--version", action="version", version=f"reprieve {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, text in (("ls", "list the checkpoints under a root"),
                       ("inspect", "describe one checkpoint (default: the one a restore takes)"),
                       ("verify", "read one checkpoint whole and check every checksum (exit 0 OK, 1 corrupt, 3 "
                                  + "the storage stopped answering)")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("uri", nargs="?", default=None, metavar="URI" if name == "ls" else "URI[@STEP]",
                       help="default: REPRIEVE_CHECKPOINT_URI, else ./checkpoints")
        p.add_argument("--json", action="store_true", help="print JSON for scripts")
        p.add_argument("--request-retries", type=int, default=None, metavar="N",
                       help="retry an object store request N times before giving up (backoff 1 s doubling to 32 "
                       "s; default: TensorStore's, minutes for a store that is down)")
        if name == "verify":
            p.add_argument("--all", action="store_true", help="every committed checkpoint under the root")
    run = sub.add_parser("run", help="run a training script, restarting it after every saved preemption",
                         description="The local restart loop: the script runs as attempt 1, 2, ... as long as it "
                         "exits with the restart code after an agreed save; any other exit ends the loop with its "
                         "code. Ctrl-C saves at the next step and stops (exit 130); a second Ctrl-C kills.")
    run.add_argument("--max-restarts", type=int, default=None, metavar="N", help="stop after N restarts")
    run.add_argument("script", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG...]")
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = _parser().parse_args(argv)
    if args.command == "run":
        from .supervisor.process import run as supervise

        return supervise(args.script, local=True, max_restarts=args.max_restarts, prog="reprieve run",
                         usage="usage: reprieve run [--max-restarts N] -- COMMAND [ARG...]\n")
    from .checkpoint import catalog

    try:
        uri = args.uri if args.uri is not None else _default_uri()
        target = catalog.parse_target(uri)
    except ValueError as e:
        print(f"reprieve {args.command}: {e}", file=err)
        return EXIT_USAGE
    if args.command == "ls" and target.step is not None:
        print(f"reprieve ls: lists a whole root; for one checkpoint: reprieve inspect {uri}", file=err)
        return EXIT_USAGE
    if getattr(args, "all", False) and target.step is not None:
        print(f"reprieve verify: --all verifies every checkpoint under a root, {uri} names one; drop --all or "
              "@STEP", file=err)
        return EXIT_USAGE
    if args.request_retries is not None and args.request_retries < 0:
        print(f"reprieve {args.command}: --request-retries {args.request_retries}: expected 0 or more", file=err)
        return EXIT_USAGE
    command = _verify_all if getattr(args, "all", False) else {"ls": _ls, "inspect": _inspect,
                                                                "verify": _verify}[args.command]
    from .checkpoint import reader
    from .checkpoint.metadata import unavailable

    try:
        return command(target, reader.open_root(target.uri, request_retries=args.request_retries), args.json, out)
    except FileNotFoundError as e:
        print(f"reprieve {args.command}: {e}", file=err)
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - storage errors (credentials, endpoints): said in one line
        if unavailable(e):
            print(f"reprieve {args.command}: {target.uri}: the storage did not answer ({e}); nothing is said of "
                  "the checkpoints: try again once it answers", file=err)
            return EXIT_UNVERIFIED
        print(f"reprieve {args.command}: {target.uri}: {type(e).__name__}: {e}", file=err)
        return EXIT_USAGE


def _default_uri() -> str:
    from .config import RuntimeConfig
    from .env import Env

    return Env(os.environ).text("REPRIEVE_CHECKPOINT_URI", RuntimeConfig.checkpoint_uri)


def _ls(target: Any, st: Any, as_json: bool, out: TextIO) -> int:
    from .checkpoint import catalog, layout, reader

    entries, fences, metas, reasons, damage = reader.listing(st)
    orbax = not entries and reader.is_orbax_root(st)
    if orbax:
        fences = st.read_fences(layout.ORBAX_FENCES_DIR)
        rows = catalog.orbax_rows(reader.orbax_steps(st), fences)
    else:
        rows = catalog.rows(entries, fences, metas, reasons, damage)
    if as_json:
        newest = catalog.latest(rows)
        _dump({"uri": st.loc.uri(), "format": "orbax" if orbax else "reprieve", "checkpoints": rows,
               "latest": None if newest is None else newest["name"], "attempts": sorted(fences),
               "sizes_checked": st.knows_sizes and not orbax}, out)
    else:
        print(catalog.format_ls(st.loc.uri(), rows, fences, sizes_checked=st.knows_sizes, orbax=orbax), file=out)
    return EXIT_OK


def _inspect(target: Any, st: Any, as_json: bool, out: TextIO) -> int:
    from .checkpoint import catalog, reader

    if _is_orbax(st):
        step, item = _orbax_step(st, target)
        description = catalog.describe_orbax(st.loc.uri(), step, item)
    else:
        name, meta = reader.choose(st, target)
        description = catalog.describe(st.loc.uri(), name, meta)
    if as_json:
        _dump(description, out)
    else:
        print(catalog.format_inspect(description), file=out)
    return EXIT_OK


def _verify(target: Any, st: Any, as_json: bool, out: TextIO) -> int:
    from .checkpoint import catalog, reader
    from .checkpoint.metadata import CheckpointCorruptError

    _not_orbax(st)
    try:
        name, meta = reader.choose(st, target)
    except CheckpointCorruptError as e:  # its metadata: as corrupt as a chunk
        report = reader.report(st, str(target.step), [str(e)])
    else:
        report = reader.verify(st, name, meta)
    if as_json:
        _dump(report, out)
    else:
        print(catalog.format_verify(report), file=out)
    return _VERDICT_EXIT[report["verdict"]]


_VERDICT_EXIT = {"OK": EXIT_OK, "CORRUPT": EXIT_CORRUPT, "UNVERIFIED": EXIT_UNVERIFIED}


def _verify_all(target: Any, st: Any, as_json: bool, out: TextIO) -> int:
    """``verify --all``: every committed checkpoint (fenced-out ones too: they are on the storage), oldest first."""
    from .checkpoint import catalog, reader
    from .checkpoint.metadata import CheckpointCorruptError, unavailable

    _not_orbax(st)
    reports: list[dict[str, Any]] = []
    entries = sorted(st.list_entries(uncommitted=False))
    for entry in entries:
        try:
            meta = reader.read_meta(st, entry.committed)
        except CheckpointCorruptError as e:
            reports.append(reader.report(st, entry.committed, [str(e)]))
            continue
        except Exception as e:  # only the storage not answering is said here; the rest goes up
            if not unavailable(e):
                raise
            reports.append(reader.report(st, entry.committed, [], f"reading its {e}"))
        else:
            reports.append(reader.verify(st, entry.committed, meta))
        if reports[-1]["verdict"] == "UNVERIFIED":
            break  # the storage stopped answering: the rest would wait for it the same way
    if not reports:
        raise FileNotFoundError(f"no committed checkpoint under {st.loc.uri()}")
    bad = [r["name"] for r in reports if r["verdict"] == "CORRUPT"]
    unverified = [e.committed for e in entries[len(reports) - 1:]] if reports[-1]["verdict"] == "UNVERIFIED" else []
    if as_json:
        _dump({"uri": st.loc.uri(), "ok": not bad and not unverified, "checkpoints": reports,
               "unverified": unverified}, out)
    else:
        print("\n".join(catalog.format_verify(r) for r in reports), file=out)
        said = f"{len(bad)} corrupt ({', '.join(bad)})" if bad else "none corrupt" if unverified else "all OK"
        if unverified:
            said += f"; {len(unverified)} not verified, the storage stopped answering ({', '.join(unverified)})"
        print(f"{len(reports) - len(unverified[:1])} of {len(entries)} checkpoint(s) verified: {said}", file=out)
    return EXIT_CORRUPT if bad else EXIT_UNVERIFIED if unverified else EXIT_OK


def _is_orbax(st: Any) -> bool:
    from .checkpoint import reader

    return not st.list_entries(uncommitted=False) and reader.is_orbax_root(st)


def _not_orbax(st: Any) -> None:
    if _is_orbax(st):
        raise FileNotFoundError(f"{st.loc.uri()} holds reprieve.orbax.OrbaxCheckpointer's checkpoints (Orbax's "
                                "format): `reprieve verify` reads the default format's chunks and checksums only. "
                                f"`reprieve ls {st.loc.uri()}` and `reprieve inspect` list its steps and reprieve "
                                "items; to check a step's arrays, restore it with Orbax "
                                "(ocp.CheckpointManager(URI).restore(STEP))")


def _orbax_step(st: Any, target: Any) -> tuple[int, dict[str, Any]]:
    """The Orbax step ``target`` names, or the newest visible one, with its ``reprieve`` item."""
    from .checkpoint import catalog, layout, reader

    steps = reader.orbax_steps(st)
    rows = catalog.orbax_rows(steps, st.read_fences(layout.ORBAX_FENCES_DIR))
    if target.step is None:
        newest = catalog.latest(rows)
        if newest is None:
            raise FileNotFoundError(f"no complete checkpoint under {st.loc.uri()} (Orbax's format)")
        step = int(newest["step"])
    elif target.step not in steps:
        raise FileNotFoundError(f"no checkpoint of step {target.step} under {st.loc.uri()} (Orbax's format; steps "
                                f"there: {', '.join(map(str, sorted(steps))) or 'none'})")
    else:
        step = target.step
    item = steps[step]
    if isinstance(item, str):
        raise FileNotFoundError(f"{st.loc.uri()}/{step}: {item}")
    return step, item


def _dump(value: Any, out: TextIO) -> None:
    json.dump(value, out, indent=1, sort_keys=True, default=str)
    out.write("\n")


def _version() -> str:
    from . import __version__

    return __version__


if __name__ == "__main__":
    raise SystemExit(main())
