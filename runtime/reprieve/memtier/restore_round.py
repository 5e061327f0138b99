"""The restore of a job with a memory tier: one agreement round fixes the step and every process's sources, each
process reads its part, and a round whose reads failed somewhere is played again without the bad copy.

Round ``r`` (all processes, through the JAX coordination service's KV, like the storage tier's restore):

1. every process publishes what it can reach: the copies in its pod's memory directory, the copies its peer's
   replica server holds, the fence records it finds, its pod's location and node; process 0 adds the storage
   tier's visible checkpoints;
2. every process computes the same :func:`.decide.decide` from all the reports (pure);
3. memory or mixed: each process reads its part (:mod:`.restore`: its own pod's copy through a mapping, another
   pod's over TCP, storage when it needs a writer memory lacks) and publishes its verdict; if every verdict is
   ``ok`` the restore is done, else the copies that failed are excluded and round ``r+1`` decides again;
4. storage: the storage tier's own restore (every process together, with its quarantine and fallback).

Afterwards every process records in its pod's memory directory (and its peer's) that this attempt started from
the restored ``(step, attempt)``: the fence record :func:`.decide.visible` reads.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from .. import identity
from ..capabilities import StepReads
from ..identity import resuming
from . import decide, wire
from .decide import Holding
from .layout import CopyName
from .restore import NeedsStorage, SourceError, open_sources, restore_state
from .sources import MEMORY, PEER, SOURCES, STORAGE, choose_holder

log = logging.getLogger(__name__)

_KV = "reprieve/mem"
MAX_ROUNDS = 16
_restores = itertools.count()


def _holding_json(h: Holding) -> dict[str, Any]:
    return {"name": str(h.name), "n": h.num_processes, "loc": h.location, "tree": h.tree,
            "base": None if h.base is None else list(h.base), "bytes": h.nbytes, "root": h.root}


def _holding(raw: dict[str, Any]) -> Holding | None:
    from .layout import parse_name

    name = parse_name(str(raw.get("name")))
    if name is None or name.tmp:
        return None
    base = raw.get("base")
    root = raw.get("root")
    return Holding(name, int(raw["n"]), str(raw["loc"]), str(raw.get("tree", "own")),
                   None if base is None else (int(base[0]), int(base[1])), int(raw.get("bytes", 0)),
                   None if root is None else str(root))


def foreign(h: Holding, root: str, where: str) -> str | None:
    """Why the copy ``h`` (in ``where``) is not this run's to restore: it belongs to another storage root, or
    records none (pure). None: it is this root's."""
    if h.root == root:
        return None
    whose = (f"checkpoint root {h.root}" if h.root is not None
             else "no checkpoint root (written by an older reprieve)")
    return (f"memory copy {h.tree}/{h.name} in {where} belongs to {whose}, not this run's {root}: ignored (each "
            "run's copies belong to its REPRIEVE_CHECKPOINT_URI; delete it to free the memory it takes)")


def _ours(tier: Any, holdings: list[Holding], where: str) -> list[Holding]:
    """``holdings`` less the copies of another storage root, each said in one line."""
    out = []
    for h in holdings:
        why = foreign(h, tier.root, where)
        if why is None:
            out.append(h)
        else:
            log.warning("%s", why)
    return out


def local_report(tier: Any, storage: Any) -> dict[str, Any]:
    """What this process can reach (step 1 of the round): only the copies of this run's storage root."""
    holdings = _ours(tier, tier.dir.holdings(tier.location), tier.dir.path)
    fences = dict(tier.dir.fences())
    if tier.peer is not None:
        try:
            listing = wire.Client(tier.peer, timeout_s=30.0, token=tier.token).list()
            loc = str(listing.get("location") or tier.peer)
            theirs = [_holding({**raw, "n": raw.get("num_processes"), "loc": loc, "bytes": raw.get("nbytes", 0)})
                      for raw in listing.get("holdings", [])]
            holdings += _ours(tier, [h for h in theirs if h is not None], f"the peer {tier.peer}")
            for a, b in (listing.get("fences") or {}).items():
                fences.setdefault(int(a), None if b is None else (int(b[0]), int(b[1])))
        except (wire.WireError, OSError, ValueError, KeyError, TypeError) as err:
            log.warning("memory restore: the peer's replica server %s did not answer (%s); its copies are not "
                        "used", tier.peer, err)
    report: dict[str, Any] = {
        "location": tier.location, "node": tier.cfg.node, "peer": tier.peer,
        "holdings": [_holding_json(h) for h in holdings],
        "fences": {str(a): None if b is None else list(b) for a, b in fences.items()},
        "mixed_ok": isinstance(storage, StepReads),
    }
    if tier.pid == 0:
        report["storage"] = storage_checkpoints(storage)
    return report


def storage_checkpoints(storage: Any) -> list[list[int]]:
    """``[step, attempt]`` of the storage tier's visible checkpoints (attempt 0: not known for this checkpointer)."""
    if isinstance(storage, StepReads):
        return [[int(s), int(a)] for s, a in storage.visible_checkpoints()]
    latest = storage.latest_step()
    return [] if latest is None else [[int(latest), 0]]


def restore(tier: Any, storage: Any, abstract: Any, *, timeout_s: float = 1800.0,
            check: Callable[[Any, Any, str], None] | None = None) -> Any:
    """Restore the newest complete step from the nearest sources; the result is the storage tier's
    ``RestoreResult`` shape with ``restored_from`` set. FileNotFoundError (on every process) when there is
    nothing to restore. ``check(record, None, where)``: ``Job.restore_or``'s run-identity check, run on the
    memory copy's ``reprieve`` record once every process has read its part (it raises alike on every process:
    all copies of a step carry the same record); a storage restore runs it inside the storage tier."""
    from ..checkpoint.manager import RestoreResult

    coord, pid, n = tier.coord, tier.pid, tier.nproc
    prefix = f"{_KV}/a{tier.attempt}/restore/{next(_restores)}"
    excluded: set[tuple[CopyName, str]] = set()
    bad_storage: set[tuple[int, int]] = set()
    t0 = time.perf_counter()
    plan = decide.Plan("none")
    for rnd in range(MAX_ROUNDS):
        key = f"{prefix}/r{rnd}"
        coord.set(f"{key}/report/{pid}", json.dumps(local_report(tier, storage)), overwrite=True)
        reports = [json.loads(coord.get(f"{key}/report/{p}", timeout_s)) for p in range(n)]
        plan = _plan(tier, reports, excluded, bad_storage)
        if rnd == 0:
            _check_pairing(tier, reports)
            _learn_peer_node(tier, reports)
        log.info("memory restore round %d: %s (%s)", rnd, plan.tier, plan.reason)
        if plan.tier in ("none", "storage"):
            break
        verdict, result = _carry_out(tier, storage, plan, abstract, check, key=key, timeout_s=timeout_s)
        coord.set(f"{key}/verdict/{pid}", json.dumps(verdict), overwrite=True)
        verdicts = [json.loads(coord.get(f"{key}/verdict/{p}", timeout_s)) for p in range(n)]
        refused = next((v["refused"] for v in verdicts if v.get("refused")), None)
        if refused is not None:  # every process raises the same, before any array is used
            raise identity.RunMismatchError(refused)
        if all(v["ok"] for v in verdicts):
            assert result is not None and plan.step is not None and plan.attempt is not None
            sources = [v["source"] for v in verdicts]
            if check is not None:
                record = result[1].get("reprieve") if isinstance(result[1], dict) else None
                check(record, None, f"memory copy of step {plan.step} (attempt {plan.attempt}) in {tier.dir.path}")
            stored = _storage(reports, bad_storage)
            return _done(tier, RestoreResult(plan.step, result[0], result[1], result[2]), plan, sources, t0,
                         storage_step=max((st for st, _ in stored), default=None))
        for v in verdicts:
            for name, loc in v.get("bad", []):
                parsed = _holding({"name": name, "n": 0, "loc": loc})
                if parsed is not None:
                    excluded.add((parsed.name, loc))
            if v.get("bad_storage"):
                bad_storage.add((plan.step or 0, plan.attempt or 0))
        log.warning("memory restore round %d failed on processes %s; deciding again without the copies that failed",
                    rnd, [p for p, v in enumerate(verdicts) if not v["ok"]])
    try:
        # every process together: quarantine and fallback included; with nothing in memory (plan "none") the
        # storage tier says whether the root may start at step 0 (one holding only quarantined checkpoints may not)
        result = storage.restore(abstract, step=None)
    except FileNotFoundError:
        if plan.tier != "none":
            raise
        _fence(tier, None)
        tier.restored_from = None
        raise FileNotFoundError(f"nothing to restore: {plan.reason}") from None
    record = result[2].get("reprieve") if isinstance(result[2], dict) else None
    attempt = record.get("attempt") if isinstance(record, dict) else None
    plan = decide.Plan("storage", int(result[0]), int(attempt) if isinstance(attempt, int) else plan.attempt or 0,
                       n, {}, plan.reason)
    if not isinstance(result, RestoreResult):
        result = RestoreResult(result[0], result[1], result[2], getattr(result, "process_extra", None))
    return _done(tier, result, plan, [STORAGE.name] * n, t0, storage_step=int(result[0]))


def _plan(tier: Any, reports: list[dict[str, Any]], excluded: set[tuple[CopyName, str]],
          bad_storage: set[tuple[int, int]]) -> decide.Plan:
    holdings: dict[tuple[CopyName, str], Holding] = {}
    fences: dict[int, tuple[int, int] | None] = {}
    for r in reports:
        for raw in r["holdings"]:
            h = _holding(raw)
            if h is not None:
                holdings.setdefault((h.name, h.location), h)
        for a, b in r["fences"].items():
            fences.setdefault(int(a), None if b is None else (int(b[0]), int(b[1])))
    return decide.decide(list(holdings.values()), fences, storage=_storage(reports, bad_storage),
                         current_attempt=tier.attempt, processes=[(p, r["location"]) for p, r in enumerate(reports)],
                         excluded=excluded, mixed_ok=all(r.get("mixed_ok") for r in reports))


def _storage(reports: list[dict[str, Any]], bad_storage: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """The committed storage checkpoints ``(step, attempt)`` process 0 reported, less those a round found
    unusable."""
    return [(int(s), int(a)) for s, a in reports[0].get("storage", []) if (int(s), int(a)) not in bad_storage]


def _carry_out(tier: Any, storage: Any, plan: decide.Plan, abstract: Any,
               check: Callable[[Any, Any, str], None] | None, *, key: str,
               timeout_s: float) -> tuple[dict[str, Any], Any]:
    """This process's part of a memory or mixed plan: its verdict, and ``(state, extra, process_extra)``. The
    run-identity check runs on the copies' manifests before any array is read; a refusal is the verdict
    ``refused`` (every process then raises it).

    In a mixed plan every process says, under ``key``, whether it reads storage, as soon as it knows (before its
    reads) and in any case before it returns; the processes that do read storage read it together
    (``read_step(among=...)``), so that a replicated piece they all lack is read from storage once."""
    chosen = {w: h for w, hs in plan.holders.items() if (h := choose_holder(hs, tier.pid, tier.location))}
    told = plan.tier != "mixed"  # only a mixed plan has processes reading storage beside the others

    def tell(reads_storage: bool) -> None:
        nonlocal told
        if not told:
            told = True
            tier.coord.set(f"{key}/storage/{tier.pid}", "1" if reads_storage else "0", overwrite=True)

    try:
        try:
            sources = open_sources(chosen, tier.dir, process=tier.pid, location=tier.location, token=tier.token)
            refusal = _refusal(tier, sources, check)
            if refusal is not None:
                return {"ok": False, "refused": refusal}, None
            state, extra, extras, remote = restore_state(sources, abstract, num_writers=plan.num_processes,
                                                         process=tier.pid, num_processes=tier.nproc, token=tier.token,
                                                         planned=lambda: tell(False))
            return {"ok": True, "source": (PEER if remote else MEMORY).name}, (state, extra, extras)
        except NeedsStorage as why:
            if plan.tier != "mixed":
                raise SourceError(next(iter(chosen.values())), str(why)) from None
            log.info("memory restore: process %d reads step %d from storage (%s)", tier.pid, plan.step, why)
        assert plan.step is not None and plan.attempt is not None
        tell(True)
        among = [p for p in range(tier.nproc)
                 if p == tier.pid or tier.coord.get(f"{key}/storage/{p}", timeout_s) == "1"]
        if len(among) > 1:
            log.info("memory restore: processes %s read step %d from storage together (each replicated piece "
                     "once)", among, plan.step)
        try:
            result = storage.read_step(plan.step, plan.attempt, abstract, among=among, key=key)
        except Exception as err:  # noqa: BLE001 - reported to every process; the round decides again
            log.error("memory restore: storage checkpoint of step %d unusable on process %d: %s", plan.step,
                      tier.pid, err)
            return {"ok": False, "bad_storage": True, "error": str(err)[:2000]}, None
        return {"ok": True, "source": STORAGE.name}, (result[1], result[2], getattr(result, "process_extra", None))
    except SourceError as err:
        h = err.holder
        log.error("memory restore: process %d cannot use %s/%s at %s: %s", tier.pid, h.tree, h.name, h.location, err)
        if err.corrupt and h.local_to(tier.pid, tier.location):
            tier.dir.delete(h.tree, h.name)  # never restored, and of no use to anyone
            log.warning("memory restore: deleted the corrupt copy %s/%s", h.tree, h.name)
        return {"ok": False, "bad": [[str(err.holder.name), err.holder.location]], "error": str(err)[:2000]}, None
    finally:
        tell(False)  # whatever happened: no process reading storage waits for this one's word


def _refusal(tier: Any, sources: dict[int, Any], check: Callable[[Any, Any, str], None] | None) -> str | None:
    """Why the copies this process opened are not this run's (``check``: the same identity and structure check as
    a storage checkpoint's), with where they lie and how to start from storage instead; None when they are."""
    if check is None:
        return None
    for source in sources.values():
        h, m = source.holder, source.manifest
        where = tier.dir.path if source.local else f"the replica server at {h.location}"
        try:
            check(m.extra.get("reprieve"), m.structure(), f"memory copy {h.tree}/{h.name} in {where}")
        except identity.RunMismatchError as err:
            return (f"{err}. The memory copies lie in each pod's REPRIEVE_MEMORY_DIR ({tier.dir.path} here): to "
                    "restore from storage instead, delete the copies there (the own/ and peer/ folders)")
    return None


def _done(tier: Any, result: Any, plan: decide.Plan, sources: list[str], t0: float, *,
          storage_step: int | None) -> Any:
    """``result`` with ``restored_from`` and ``storage_step`` (the newest committed step in storage, which a
    restore from memory does not move: the job reports it as its committed checkpoint, not the memory step)."""
    base = (int(result[0]), int(plan.attempt or 0))
    _fence(tier, base)
    tier.base = base
    tier.restored_from = {"step": int(result[0]), "tier": plan.tier, "sources": sources}
    result.restored_from = tier.restored_from
    result.storage_step = storage_step
    # From memory this is the restore's one line (``Read.log`` adds none); from storage the job's line names the URI.
    tail = "" if plan.tier == "storage" else ": " + resuming(int(result[0]), result[2].get("reprieve")
                                                            if isinstance(result[2], dict) else None)
    log.info("restored step %d on process %d from %s in %.3fs (gang: %s)%s", result[0], tier.pid,
             SOURCES[sources[tier.pid]].where, time.perf_counter() - t0,
             ", ".join(f"{p}={s}" for p, s in enumerate(sources)), tail)
    return result


def _fence(tier: Any, base: tuple[int, int] | None) -> None:
    tier.dir.write_fence(tier.attempt, base)
    if tier.peer is not None:
        try:
            wire.Client(tier.peer, timeout_s=10.0, token=tier.token).fence(tier.attempt, base)
        except (wire.WireError, OSError) as err:
            log.warning("memory restore: could not record attempt %d's start at the peer %s: %s", tier.attempt,
                        tier.peer, err)


def _learn_peer_node(tier: Any, reports: list[dict[str, Any]]) -> None:
    """The peer's node from the round's reports where the assignment did not say it (the first attempt's pods are
    made before their peers' nodes are known), for a notice's agreed step (:meth:`MemoryTier.outlives`)."""
    if tier.peer is not None and not tier.peer_node:
        tier.peer_node = next((r.get("node") for r in reports if r.get("location") == tier.peer and r.get("node")),
                              None)


def _check_pairing(tier: Any, reports: list[dict[str, Any]]) -> None:
    problems = decide.pairing_problems({p: (r.get("location"), r.get("node"), r.get("peer"))
                                        for p, r in enumerate(reports)})
    for p, why in problems.items():
        log.error("memory tier pairing: %s: both copies would be lost together; pair it with a pod on another "
                  "node%s", why, " (this process keeps its own copies only)" if p == tier.pid else "")
    if tier.pid in problems:
        tier.peer = None
