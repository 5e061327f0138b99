"""The benchmarks' state-size option (``--state-mib``; issue #48): the example LM padded with ``TRAIN_STATE_MIB`` MiB
of trained n-gram memory (``examples/train_lm.py``). What the memory tier's volume then needs, and whether this
machine has the memory for the job: a state too large is refused with the numbers before anything starts (pure,
but for :func:`mem_available_mib`)."""

from __future__ import annotations

import math
from pathlib import Path

# What one trainer process holds of its state at once: the state once per device (the example's parameters are
# replicated over the process's devices; its step donates the state, so the new state is written into the old
# one's buffers), and the host copies of the storage tier's and the memory tier's saves (one each: a replica is
# saved once; each tier keeps its buffers for its next save). Its pod's memory tier volume (tmpfs, counted in the
# machine's memory): the copy being written, its newest complete copy and the copy it holds for a peer (measured:
# benchmarks/RESULTS.md, "The example at a real state size"). Not counted: a warm process's landing memory (the
# state once per device, reprieve.landing), which is populated only where the machine has room for it twice over.
STATE_COPIES_PER_DEVICE = 1
HOST_COPIES = 2
TIER_COPIES = 3
PROCESS_MIB = 600  # a trainer process without its state (Python, JAX, XLA's programs), measured ~450-550 MiB
CLUSTER_MIB = 2048  # the control plane, the kubelets and the operator beside the job
EXAMPLE_MIB = 1  # the example's own parameters and optimizer state
TIER_FLOOR_MIB = 256  # the tier's sizeLimit at the example's own size (its copies are ~1 MiB)


def tier_size_limit(state_mib: float) -> str:
    """``spec.checkpoint.memory.sizeLimit`` for ``state_mib`` MiB of padding: room for :data:`TIER_COPIES` copies of a
    process's state, a tenth more for the manifests and the page rounding."""
    need = math.ceil((state_mib + EXAMPLE_MIB) * TIER_COPIES * 1.1)
    return f"{max(TIER_FLOOR_MIB, need)}Mi"


def copies(devices_per_process: int) -> tuple[int, int]:
    """Copies of a process's state held at once: ``(in the process, in its memory tier volume)``."""
    return STATE_COPIES_PER_DEVICE * devices_per_process + HOST_COPIES, TIER_COPIES


def storage_copies(keep: int) -> int:
    """Copies of each process's state in the soak's checkpoint-storage tmpfs, mounted when storage faults are
    scheduled (``chaos.storage_tmpfs_bytes``: ``keep`` committed, one a restart's deferred retention leaves, one
    being written); the machine's memory holds them."""
    return keep + 2


def memory_needed_mib(state_mib: float, processes: int, devices_per_process: int, *, in_storage: int = 0) -> int:
    """About how much of the machine's memory a job of ``processes`` trainers of ``devices_per_process`` devices
    needs with ``state_mib`` of padding (``in_storage``: copies of each process's state in a checkpoint storage held in
    memory, :func:`storage_copies`)."""
    per_process = (state_mib + EXAMPLE_MIB) * (sum(copies(devices_per_process)) + in_storage) + PROCESS_MIB
    return math.ceil(processes * per_process + CLUSTER_MIB)


def refusal(state_mib: float, processes: int, devices_per_process: int, available_mib: int, *,
            in_storage: int = 0) -> str | None:
    """Why ``--state-mib state_mib`` cannot run here (None: it can), with the numbers."""
    if not math.isfinite(state_mib) or state_mib < 0:
        return f"--state-mib must be a number >= 0 (MiB), got {state_mib:g}"
    need = memory_needed_mib(state_mib, processes, devices_per_process, in_storage=in_storage)
    if need <= available_mib:
        return None
    inside, tier = copies(devices_per_process)
    most = max(0.0, ((available_mib - CLUSTER_MIB) / processes - PROCESS_MIB) / (inside + tier + in_storage)
               - EXAMPLE_MIB)
    storage = (f", {in_storage} in the checkpoint storage's tmpfs (the storage faults: leave them out of --faults to "
               "need none)") if in_storage else ""
    return (f"--state-mib {state_mib:g}: {processes} trainer processes of {devices_per_process} device(s) need about "
            f"{need} MiB ({inside + tier + in_storage} copies of each one's {state_mib + EXAMPLE_MIB:g} MiB state: "
            f"{inside} in the process (the state on each device, the two tiers' host copies), {tier} in its memory "
            f"tier volume{storage}; {PROCESS_MIB} MiB a process without it; {CLUSTER_MIB} MiB for the cluster) and "
            f"this machine has {available_mib} MiB available (MemAvailable): use --state-mib {math.floor(most)} or "
            "less")


def mem_available_mib(meminfo: Path = Path("/proc/meminfo")) -> int:
    """``MemAvailable`` in MiB."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError(f"{meminfo} has no MemAvailable line")
