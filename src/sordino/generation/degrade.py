"""Degrade instead of drop: fewer remaining steps for a generation that would be late.

At every step boundary a generation asks :meth:`StepDegrader.remaining` how many of
its planned remaining steps to run. Two things can lower them:

- its **deadline**: when the steps left, at the pace its steps have been taking,
  would finish after its deadline, the remaining steps shrink to what fits;
- the **global factor** (:meth:`StepDegrader.set_step_factor`, what the guardian's
  ``degrade_steps`` action calls): 0.5 halves every generation's remaining steps.

Never below the floor of the request's priority class (the total steps it gets), and
never for a protected priority (premium: level 1 by default) unless configured.

A generation whose deadline has passed ends at the next step boundary
(:meth:`StepDegrader.check_deadline`): it fails with
:class:`~sordino.errors.DeadlineExceeded` (a queue timeout's status) instead of running
steps whose image nobody can use; counted as ``ended_at_deadline``.
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
        self, *, done: int, remaining: int, now: float, deadline: float | None
    ) -> None:
        """At a step boundary, with ``remaining`` steps still to run after ``done``: raise
        :class:`DeadlineExceeded` (and count it) once ``now`` is past ``deadline``.

        Never without a deadline; every priority (a protected one is never cut, so it
        runs its full plan until then). Only a deadline that has passed: a run whose
        steps merely look too slow is cut by :meth:`remaining` and left to finish, since
        its pace changes under bursts (W3: ending on the predicted pace ended requests
        that would have made it; docs/benchmarks.md).
        """
        if deadline is None or remaining <= 0 or now < deadline:
            return
        self.ended_at_deadline += 1
        raise DeadlineExceeded(
            f"the generation was ended at a step boundary ({done} steps done, {remaining} "
            f"to go): its deadline passed {(now - deadline) * 1000:.0f} ms ago; raise its "
            "timeout, ask for fewer steps or reduce load"
        )

    def statistics(self) -> DegradeStatistics:
        return DegradeStatistics(
            self._factor, self.degraded_requests, self.steps_saved, self.ended_at_deadline
        )
