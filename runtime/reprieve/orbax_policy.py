"""``AgreedStepPolicy``: an Orbax save-decision policy that says "save" at Reprieve's agreed step, for loops that
keep their own ``orbax.checkpoint.CheckpointManager`` (MaxText's shape)::

    policy = AgreedStepPolicy(ocp.checkpoint_managers.FixedIntervalPolicy(1000))  # and Orbax's own policies
    job, mngr = policy.init(lambda cfg: ocp.CheckpointManager(
        cfg.checkpoint_uri, options=ocp.CheckpointManagerOptions(save_decision_policy=policy)))
    state, start = job.restore_or(init_fn, abstract)           # the manager's latest step, or (init_fn(), 0)
    for step in job.steps(start, total):
        state = train_step(state, batch)
        mngr.save(step, args=ocp.args.StandardSave(state))      # True at the agreed step (and the policies')
        policy.exit_if_saved(step)                              # there: Orbax's commit, then the restart code

The agreed step is the operator's notice (or SIGTERM, the notice file, ``job.notify``) turned by Reprieve's
agreement into one step for every process, as late as the countdown allows (the last step whose save still
commits before the deadline). ``exit_if_saved`` replaces MaxText's ``if mngr.reached_preemption(step):
mngr.wait_until_finished(); sys.exit()``: it waits for Orbax's commit on every process and exits with
``REPRIEVE_RESTART_EXIT_CODE`` (Orbax's loop would exit 0, which reads as "finished"). The checkpoints are Orbax's
own, written by the program's manager: Reprieve adds no item, fence or record to them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .checkpoint.manager import RestoreResult
from .job import Job


class AgreedStepPolicy:
    """Orbax's ``SaveDecisionPolicy`` protocol (``should_save(step, previous_steps, *, context)``): True at
    Reprieve's agreed step, else what ``others`` say (any of them).

    The job's decision is taken at every ``CheckpointManager.save`` call, first, so put this policy outermost
    (``AnySavePolicy([AgreedStepPolicy(), ...])`` would skip it at a step another policy already saves, and
    the agreed step would pass undecided: the job exits 1, loudly).

    Args:
        others: Orbax policies also asked at every step (``FixedIntervalPolicy``, ``ContinuousCheckpointingPolicy``,
            ...); Orbax's ``PreemptionCheckpointingPolicy`` is not needed (Reprieve owns SIGTERM).
    """

    def __init__(self, *others: Any) -> None:
        self.others = others
        self.job: Job | None = None
        self.agreed: int | None = None  # the agreed step, once the job said so

    def bind(self, job: Job) -> None:
        """Decide with ``job`` (:meth:`init` binds the job it creates)."""
        self.job = job

    def init(self, make_manager: Callable[[Any], Any], **init_kwargs: Any) -> tuple[Job, Any]:
        """``reprieve.init(checkpointer=...)`` with ``make_manager(config)`` (the program's Orbax
        ``CheckpointManager``) built after ``jax.distributed`` is up; returns ``(job, manager)``."""
        import reprieve

        made: list[Any] = []

        def factory(config: Any, coordinator: Any) -> ManagerCommits:
            made.append(make_manager(config))
            return ManagerCommits(made[0])

        job = reprieve.init(checkpointer=factory, **init_kwargs)
        self.bind(job)
        return job, made[0]

    def should_save(self, step: Any, previous_steps: Sequence[Any], *, context: Any) -> bool:
        if self.job is None:
            raise RuntimeError("AgreedStepPolicy.should_save: no job; create it with policy.init(make_manager) or "
                               "call policy.bind(job) before the first CheckpointManager.save")
        if self.job.should_stop(step.step):
            self.agreed = step.step
            return True
        return any(p.should_save(step, previous_steps, context=context) for p in self.others)

    def exit_if_saved(self, step: int) -> None:
        """At the agreed step: wait until Orbax's save of it is committed on every process, then exit with the
        restart code (does not return). Elsewhere: nothing."""
        if step != self.agreed or self.job is None:
            return
        self.job.save(step, {})  # the agreed save: the job's checkpointer (ManagerCommits) waits for Orbax


class ManagerCommits:
    """A :class:`reprieve.Checkpointer` over the program's own Orbax ``CheckpointManager``: the program saves
    through the manager, the job only waits for its commit (the agreed save) and restores its latest step with
    ``StandardRestore`` (a manager of one item, as ``mngr.save(step, args=ocp.args.StandardSave(state))``)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.last_save_seconds: float | None = None

    def save(self, step: int, state: Any, *, extra: dict[str, Any] | None = None) -> None:
        """The agreed step: the program's ``mngr.save(step, ...)`` must have started its save."""
        if self.manager.latest_step() != step:
            raise RuntimeError(f"the agreed step {step} was not saved by the Orbax CheckpointManager (its latest "
                               f"step is {self.manager.latest_step()}): call mngr.save(step, ...) at every step "
                               "with AgreedStepPolicy as its save_decision_policy, then policy.exit_if_saved(step)")

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def latest_step(self) -> int | None:
        step = self.manager.latest_step()
        return None if step is None else int(step)

    def restore(self, abstract_state: Any, *, step: int | None = None) -> RestoreResult:
        import orbax.checkpoint as ocp

        chosen = self.latest_step() if step is None else step
        if chosen is None:
            raise FileNotFoundError(f"no orbax checkpoint under {self.manager.directory}")
        state = self.manager.restore(chosen, args=ocp.args.StandardRestore(abstract_state))
        return RestoreResult(chosen, state, {})

    def close(self) -> None:
        self.manager.wait_until_finished()  # the manager is the program's: it closes it
