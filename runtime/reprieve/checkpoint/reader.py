"""Reading a checkpoint root without writing to it: the I/O half of the ``reprieve`` command (``ls``, ``inspect``,
``verify``). Works on paths, ``file://``, ``gs://`` and ``s3://`` through :mod:`.storage`; never creates, fences,
cleans or quarantines anything (a job's :class:`~reprieve.checkpoint.CheckpointManager` does that). What it reads
is turned into words by :mod:`.catalog`.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
from typing import Any

from . import layout, spec
from .catalog import Target
from .chunk_files import CRC32C_BYTES
from .layout import CheckpointName
from .metadata import CheckpointCorruptError, CheckpointMeta, unavailable
from .storage import Storage, open_storage

IN_FLIGHT = 8  # chunk reads at once while verifying
ORBAX_RECORD = "reprieve/metadata"  # the ``reprieve`` item of an Orbax step (reprieve.orbax.RECORD_FILE)
ORBAX_STEP_METADATA = "_CHECKPOINT_METADATA"  # Orbax's own per-step file: its items and commit time


def open_root(uri: str, request_retries: int | None = None) -> Storage:
    """The root at ``uri``, read-only. Raises FileNotFoundError when a local root does not exist."""
    return open_storage(uri, fsync=False, create=False, request_retries=request_retries)


def is_orbax_root(st: Storage) -> bool:
    """Whether the root holds ``reprieve.orbax.OrbaxCheckpointer``'s fences (Orbax's format, not this one)."""
    return bool(st.list_dir(layout.ORBAX_FENCES_DIR))


def read_meta(st: Storage, name: str) -> CheckpointMeta:
    """``reprieve.json`` of checkpoint ``name``. Raises CheckpointCorruptError naming the file."""
    where = f"{st.loc.uri()}/{name}/{layout.METADATA_FILE}"
    raw = st.read_file(f"{name}/{layout.METADATA_FILE}")
    if raw is None:
        raise CheckpointCorruptError(f"{where} is missing")
    return CheckpointMeta.from_json(raw, where)


def listing(st: Storage) -> tuple[list[CheckpointName], dict[int, frozenset[str]], dict[str, CheckpointMeta | str],
                                  dict[str, str], dict[str, str]]:
    """``(entries, fences, metadata of committed entries or why unreadable, quarantine reasons, damage)``; damage:
    what :func:`chunk_size_problems` found in a committed entry, by name."""
    entries = st.list_entries(uncommitted=True)
    fences = st.read_fences()
    metas: dict[str, CheckpointMeta | str] = {}
    damage: dict[str, str] = {}
    for e in entries:
        if e.state == "committed":
            try:
                metas[e.committed] = meta = read_meta(st, e.committed)
            except CheckpointCorruptError as err:
                metas[e.committed] = str(err)
                continue
            problems = chunk_size_problems(st, e.committed, meta)
            if problems:
                damage[e.committed] = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3
                                                                  else "")
    reasons: dict[str, str] = {}
    for name, reason in quarantined(st):
        if st.loc.is_object_store:  # a record of a copy whose data is gone
            entries.append(name)
        reasons[str(name)] = reason
    return entries, fences, metas, reasons, damage


def chunk_size_problems(st: Storage, name: str, meta: CheckpointMeta) -> list[str] | None:
    """Chunk files of checkpoint ``name`` that are missing or not the size ``reprieve.json`` implies (a truncated or
    half-written chunk), from their sizes alone (no chunk is read); None where the storage tells no sizes without
    reading (object stores: only ``verify`` finds it there)."""
    if not st.knows_sizes:
        return None
    import ml_dtypes  # noqa: F401 - registers bfloat16, int4, float8... with numpy
    import numpy as np

    problems = []
    for leaf in meta.leaves:
        if leaf.kind == "json" or leaf.index is None or leaf.shape is None or leaf.dtype is None \
                or leaf.chunk_shape is None:
            continue  # meta.problems() says what is wrong with such a leaf
        want = math.prod(leaf.chunk_shape) * np.dtype(spec.zarr_dtype(leaf.dtype)).itemsize + CRC32C_BYTES
        for region in _chunk_regions(leaf.shape, leaf.chunk_shape):
            key = f"{name}/" + layout.chunk_key(leaf.index, tuple(lo // c for (lo, _), c in
                                                                   zip(region, leaf.chunk_shape, strict=True)))
            got = st.file_size(key)
            if got != want:
                problems.append(f"leaf {leaf.path}: chunk {key} " + ("is missing" if got is None else
                                f"holds {got} bytes, {want} expected (truncated or not fully written)"))
    return problems


def quarantined(st: Storage) -> list[tuple[CheckpointName, str]]:
    """Every quarantined copy under the root and why it was quarantined, oldest step first."""
    out = []
    for step, attempt, order, qid in st.quarantined():
        name = CheckpointName(step, attempt, "corrupt", order)
        if st.loc.is_object_store:  # a record of a copy whose data is gone
            raw = st.read_file(f"{layout.CORRUPT_DIR}/{qid}")
            out.append((name, f"{_reason(raw)} (data deleted; record {layout.CORRUPT_DIR}/{qid})"))
        else:
            out.append((name, _reason(st.read_file(f"{qid}/QUARANTINED.json"))))
    return sorted(out, key=lambda nr: (nr[0].step, nr[0].attempt, nr[0].copy))


def _reason(raw: bytes | None) -> str:
    if raw is None:
        return "reason not recorded"
    try:
        return str(json.loads(raw).get("reason") or "reason not recorded")
    except (ValueError, AttributeError):
        return "reason unreadable"


def choose(st: Storage, target: Target) -> tuple[str, CheckpointMeta]:
    """The checkpoint ``target`` names (``@STEP``), or the one a restore takes first. Raises FileNotFoundError
    (none) or CheckpointCorruptError (its metadata)."""
    from . import fencing

    committed = st.list_entries(uncommitted=False)
    visible = fencing.visible(committed, st.read_fences())
    if target.step is None:
        if not visible:
            raise FileNotFoundError(f"no complete checkpoint under {st.loc.uri()}")
        name = visible[-1]
    else:
        same = [c for c in committed if c.step == target.step and target.attempt in (None, c.attempt)]
        if not same:
            have = ", ".join(str(c.step) for c in sorted(committed)) or "none"
            raise FileNotFoundError(f"no complete checkpoint of step {target.step} under {st.loc.uri()} "
                                    f"(steps there: {have})")
        name = max(same, key=lambda c: (c in visible, c.attempt))  # the visible one, else the newest attempt's
    return name.committed, read_meta(st, name.committed)


def verify(st: Storage, name: str, meta: CheckpointMeta) -> dict[str, Any]:
    """Read every chunk of every array of checkpoint ``name`` (TensorStore checks each chunk's crc32c; a missing
    chunk is an error, not the fill value) and check the metadata against the name and itself.

    The report's ``verdict``: ``OK``; ``CORRUPT`` (``problems`` names each leaf and chunk); ``UNVERIFIED`` when the
    storage stopped answering (``unreachable`` says where): nothing more is read, and nothing is said of the data
    not read."""
    problems: list[str] = []
    unreachable: str | None = None
    parsed = layout.parse_name(name)
    if parsed is not None:
        problems += meta.problems(parsed.step, parsed.attempt)
    chunks = nbytes = 0
    for leaf in meta.leaves:
        if leaf.kind == "json":
            continue
        if leaf.index is None or leaf.shape is None or leaf.dtype is None or leaf.chunk_shape is None:
            continue  # meta.problems() said so
        where = f"leaf {leaf.path} ({layout.array_dir(leaf.index)})"
        try:
            md = spec.zarr3_metadata(leaf.shape, leaf.dtype, leaf.chunk_shape)
            store = st.open_array(f"{name}/{layout.array_dir(leaf.index)}", md, create=False, read=True).result()
        except Exception as err:  # noqa: BLE001 - every leaf is checked; each failure is named
            if unavailable(err):
                unreachable = f"{where}: opening its array: {err}"
                break
            problems.append(f"{where}: cannot open its array (zarr.json missing, unreadable or not what "
                            f"{layout.METADATA_FILE} says): {err}")
            continue
        inflight: collections.deque[tuple[Any, Any]] = collections.deque()
        try:
            for region in _chunk_regions(leaf.shape, leaf.chunk_shape):
                if len(inflight) >= IN_FLIGHT:
                    nbytes += _finish(inflight)
                inflight.append((region, store[tuple(slice(a, b) for a, b in region)].read()))
                chunks += 1
            while inflight:
                nbytes += _finish(inflight)
        except Exception as err:  # noqa: BLE001
            region = inflight[0][0] if inflight else None
            said = f"{where}, chunk {list(region) if region else '?'}: {err}"
            if unavailable(err):
                unreachable = said
                break
            problems.append(said)
    return report(st, name, problems, unreachable, chunks, nbytes)


def report(st: Storage, name: str, problems: list[str], unreachable: str | None = None, chunks: int = 0,
           nbytes: int = 0) -> dict[str, Any]:
    """``verify``'s report (also of a checkpoint whose metadata already says it is corrupt, or that the storage did
    not serve at all): its verdict follows from ``problems`` and ``unreachable``."""
    verdict = "CORRUPT" if problems else "UNVERIFIED" if unreachable else "OK"
    return {"uri": st.loc.uri(), "name": name, "ok": verdict == "OK", "verdict": verdict, "chunks": chunks,
            "bytes": nbytes, "problems": problems, "unreachable": unreachable}


def _finish(inflight: collections.deque[tuple[Any, Any]]) -> int:
    _, future = inflight[0]
    data = future.result()
    inflight.popleft()
    return int(data.nbytes)


def orbax_steps(st: Storage) -> dict[int, dict[str, Any] | str]:
    """The committed step directories of a ``reprieve.orbax.OrbaxCheckpointer`` root: their ``reprieve`` item (the
    attempt, the job's ``extra``, every process's data position) and Orbax's own step metadata (its items and commit
    time, under ``"orbax"``), or why the item cannot be read. Orbax's in-progress ``<step>.orbax-checkpoint-tmp-*``
    directories are not steps."""
    out: dict[int, dict[str, Any] | str] = {}
    for top in sorted({k.split("/", 1)[0] for k in st.list_dir("")}):
        if not top.isdigit():
            continue
        raw = st.read_file(f"{top}/{ORBAX_RECORD}")
        try:
            record = json.loads(raw) if raw is not None else None
        except ValueError as err:
            out[int(top)] = f"its reprieve item {top}/{ORBAX_RECORD} is not JSON: {err}"
            continue
        if not isinstance(record, dict):
            out[int(top)] = f"no reprieve item ({top}/{ORBAX_RECORD} is missing): not written by OrbaxCheckpointer"
            continue
        try:
            orbax_meta = json.loads(st.read_file(f"{top}/{ORBAX_STEP_METADATA}") or b"{}")
        except ValueError:
            orbax_meta = {}
        out[int(top)] = {**record, "orbax": orbax_meta if isinstance(orbax_meta, dict) else {}}
    return out


def _chunk_regions(shape: list[int], chunk: list[int]) -> Any:
    if any(n == 0 for n in shape):
        return iter(())
    if not shape:
        return iter([()])
    grid = [range(math.ceil(n / c)) for n, c in zip(shape, chunk, strict=True)]
    return (tuple((k * c, min((k + 1) * c, n)) for k, c, n in zip(idx, chunk, shape, strict=True))
            for idx in itertools.product(*grid))
