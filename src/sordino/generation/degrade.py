"""Degrade instead of drop: fewer remaining steps for a generation that would be late.

At every step boundary a generation asks :meth:`StepDegrader.remaining` how many of
its planned remaining steps to run. Two things can lower them:

- its **deadline**: when the steps left, at the pace its steps have been taking,
  would finish after its deadline, the remaining steps shrink to what fits;
- the **global factor** (:meth:`StepDegrader.set_step_factor`, what the guardian's
  ``degrade_steps`` action calls): 0.5 halves every generation's remaining steps.

Never below the floor of the request's priority class (the total steps it gets), and
never for a protected priority (premium: level 1 by default) unless configured.

A generation with a deadline that can no longer make it even so ends at the step
boundary (:meth:`StepDegrader.check_deadline`): its deadline has passed, or — for an
unprotected priority — its fewest remaining steps (its floor) at its pace would finish
after it. It fails with :class:`~sordino.errors.DeadlineExceeded` (a queue timeout's
status) instead of running steps whose image nobody can use; counted as
``ended_at_deadline``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sordino.config.iterative import DegradeConfig
from sordino.errors import DeadlineExceeded

__all__ = ["DegradeStatistics", "StepDegrader"]


@dataclass(frozen=True, slots=True)
class DegradeStatistics:
    """What degradation did since start: requests degraded, steps they did not run."""

    factor: float | None
    degraded_requests: int
    steps_saved: int
    ended_at_deadline: int = 0


class StepDegrader:
    """The degrade-instead-of-drop policy, shared by every iterative model of a runtime."""

    def __init__(self) -> None:
        self._factor: float | None = None
        self.degraded_requests = 0
        self.steps_saved = 0
        self.ended_at_deadline = 0

    @property
    def factor(self) -> float | None:
        return self._factor

    def set_step_factor(self, factor: float | None) -> None:
        """Scale every generation's remaining steps by ``factor`` (None: back to normal).

        ``factor`` is in (0, 1]; floors and protected priorities still hold.
        """
        if (factor is not None and not (0.0 < factor <= 1.0)) or isinstance(factor, bool):
            raise ValueError(f"step factor must be in (0, 1] or None, got {factor!r}")
        self._factor = None if factor is None or factor == 1.0 else float(factor)

    def remaining(
        self,
        config: DegradeConfig,
        *,
        priority: int,
        done: int,
        remaining: int,
        now: float,
        deadline: float | None,
        step_s: float | None,
        factor: bool = True,
    ) -> int:
        """How many of ``remaining`` planned steps to run (``done`` steps already ran).

        ``factor`` False: the step factor is not applied (a run it already cut).
        """
        if not config.enabled or remaining <= 1:
            return remaining
        if config.protect_priority and priority <= config.protect_priority:
            return remaining
        floor = config.floors.get(priority, config.min_steps)
        least = max(1, floor - done)
        if least >= remaining:
            return remaining
        wanted = remaining
        if factor and self._factor is not None:
            wanted = max(1, math.ceil(remaining * self._factor))
        if deadline is not None and step_s is not None and step_s > 0:
            fits = int((deadline - now) / step_s)
            wanted = min(wanted, max(fits, 1))
        return max(least, min(wanted, remaining))

    def note(self, saved: int, *, first: bool) -> None:
        """Count ``saved`` steps not run; ``first`` when the request was not degraded before."""
        if saved > 0:
            self.steps_saved += saved
            if first:
                self.degraded_requests += 1

    def check_deadline(
        self,
        config: DegradeConfig,
        *,
        priority: int,
        done: int,
        remaining: int,
        now: float,
        deadline: float | None,
        step_s: float | None,
        can_cut: bool = True,
    ) -> None:
        """At a step boundary, with ``remaining`` steps still to run after ``done``: raise
        :class:`DeadlineExceeded` (and count it) when the generation cannot finish in time.

        Never without a deadline. Ended when ``now`` is past the deadline; for an
        unprotected priority also when its fewest remaining steps — down to its floor
        when degrade is on, all of them otherwise — at ``step_s`` a step would end after
        the deadline. A protected priority, never cut, ends only once its deadline passed.
        """
        if deadline is None or remaining <= 0:
            return
        left_s = deadline - now
        if left_s > 0:
            if step_s is None or step_s <= 0:
                return
            if config.protect_priority and priority <= config.protect_priority:
                return
            fewest = remaining
            if config.enabled and can_cut:
                floor = config.floors.get(priority, config.min_steps)
                fewest = min(remaining, max(1, floor - done))
            if fewest * step_s <= left_s:
                return
            why = (
                f"its {fewest} remaining steps take about {fewest * step_s * 1000:.0f} ms at "
                f"the current pace, {left_s * 1000:.0f} ms are left"
            )
        else:
            why = f"its deadline passed {-left_s * 1000:.0f} ms ago"
        self.ended_at_deadline += 1
        raise DeadlineExceeded(
            f"the generation was ended at a step boundary ({done} done, {remaining} to go): "
            f"{why}; raise its timeout, ask for fewer steps or reduce load"
        )

    def statistics(self) -> DegradeStatistics:
        return DegradeStatistics(
            self._factor, self.degraded_requests, self.steps_saved, self.ended_at_deadline
        )
