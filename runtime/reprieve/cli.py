"""``reprieve``: see and check checkpoints, and run a training script with restarts on a laptop.

    reprieve ls URI                  every checkpoint: step, attempt, kind, state, size, when, run; quarantined ones
    reprieve inspect URI[@STEP]      one checkpoint: leaves, shapes, dtypes, shardings, sizes, topology, data
                                     positions, run identity, versions (default: the one a restore takes)
    reprieve verify URI[@STEP]       read every chunk and check every checksum; exit 0 OK, 1 corrupt, 2 not found
    reprieve run [--max-restarts N] -- python train.py
                                     the local restart loop (as the operator restarts a gang on a cluster)

``URI`` is a path, ``file://``, ``gs://`` or ``s3://`` (with the same credentials and endpoints a job uses), or a
checkpoint's own directory. ``--json`` prints what a script reads instead of text. ``ls``, ``inspect`` and
``verify`` only read: nothing is created, cleaned or quarantined. The words come from
:mod:`reprieve.checkpoint.catalog` (pure), the reading from :mod:`reprieve.checkpoint.reader`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

EXIT_OK, EXIT_CORRUPT, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reprieve", description="See, check and run Reprieve checkpoints "
                                     "(docs/runtime.md, 'The reprieve command').")
    parser.add_argument("--version", action="version", version=f"reprieve {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, text in (("ls", "list the checkpoints under a root"),
                       ("inspect", "describe one checkpoint (default: the one a restore takes)"),
                       ("verify", "read one checkpoint whole and check every checksum (exit 0 OK, 1 corrupt)")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("uri", metavar="URI" if name == "ls" else "URI[@STEP]")
        p.add_argument("--json", action="store_true", help="print JSON for scripts")
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
        target = catalog.parse_target(args.uri)
    except ValueError as e:
        print(f"reprieve {args.command}: {e}", file=err)
        return EXIT_USAGE
    if args.command == "ls" and target.step is not None:
        print(f"reprieve ls: lists a whole root; for one checkpoint: reprieve inspect {args.uri}", file=err)
        return EXIT_USAGE
    try:
        return {"ls": _ls, "inspect": _inspect, "verify": _verify}[args.command](target, args.json, out)
    except FileNotFoundError as e:
        print(f"reprieve {args.command}: {e}", file=err)
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - storage errors (credentials, endpoints): said in one line
        print(f"reprieve {args.command}: {target.uri}: {type(e).__name__}: {e}", file=err)
        return EXIT_USAGE


def _ls(target: Any, as_json: bool, out: TextIO) -> int:
    from .checkpoint import catalog, reader

    st = reader.open_root(target.uri)
    entries, fences, metas, reasons = reader.listing(st)
    if not entries and reader.is_orbax_root(st):
        raise FileNotFoundError(f"{st.loc.uri()} holds checkpoints in Orbax's format (reprieve.orbax."
                                "OrbaxCheckpointer); the reprieve command reads the default format: use Orbax's tools")
    rows = catalog.rows(entries, fences, metas, reasons)
    if as_json:
        newest = catalog.latest(rows)
        _dump({"uri": st.loc.uri(), "checkpoints": rows, "latest": None if newest is None else newest["name"],
               "attempts": sorted(fences)}, out)
    else:
        print(catalog.format_ls(st.loc.uri(), rows, fences), file=out)
    return EXIT_OK


def _inspect(target: Any, as_json: bool, out: TextIO) -> int:
    from .checkpoint import catalog, reader

    st = reader.open_root(target.uri)
    _not_orbax(st)
    name, meta = reader.choose(st, target)
    description = catalog.describe(st.loc.uri(), name, meta)
    if as_json:
        _dump(description, out)
    else:
        print(catalog.format_inspect(description), file=out)
    return EXIT_OK


def _verify(target: Any, as_json: bool, out: TextIO) -> int:
    from .checkpoint import catalog, reader
    from .checkpoint.metadata import CheckpointCorruptError

    st = reader.open_root(target.uri)
    _not_orbax(st)
    try:
        name, meta = reader.choose(st, target)
    except CheckpointCorruptError as e:  # its metadata: as corrupt as a chunk
        report: dict[str, Any] = {"uri": st.loc.uri(), "name": str(target.step), "ok": False, "chunks": 0,
                                  "bytes": 0, "problems": [str(e)]}
    else:
        report = reader.verify(st, name, meta)
    if as_json:
        _dump(report, out)
    else:
        print(catalog.format_verify(report), file=out)
    return EXIT_OK if report["ok"] else EXIT_CORRUPT


def _not_orbax(st: Any) -> None:
    from .checkpoint import reader

    if not st.list_entries(uncommitted=False) and reader.is_orbax_root(st):
        raise FileNotFoundError(f"{st.loc.uri()} holds checkpoints in Orbax's format (reprieve.orbax."
                                "OrbaxCheckpointer); the reprieve command reads the default format: use Orbax's tools")


def _dump(value: Any, out: TextIO) -> None:
    json.dump(value, out, indent=1, sort_keys=True, default=str)
    out.write("\n")


def _version() -> str:
    from . import __version__

    return __version__


if __name__ == "__main__":
    raise SystemExit(main())
