"""The guardian: metric rules that detect, act, verify, roll back and leave a record.

- ``loop.py``: :class:`Guardian`, the control loop over the hub's in-memory series;
- ``triggers.py``: a trigger's state between evaluations and its running actions;
- ``records.py``: the diagnostic records (and alerts) of each action;
- ``metrics.py``: a trigger's metric over a window of per-second rows;
- ``actions.py``: the actions (``apply``/``verify``/``revert``) and what they act
  through (:class:`Controls`, the :class:`Defragmenter` and :class:`StepDegrader`
  protocols other parts implement);
- ``recovery.py``: progressive recovery of restarted and added instances;
- ``alerts.py``: alert channels, delivered off the request path.

The server builds it (``server/runtime.py``) when ``self_healing.enabled``.
"""

from __future__ import annotations

from sordino.guardian.actions import (
    Action,
    Applied,
    Controls,
    Defragmenter,
    StepDegrader,
    build_action,
    check_supported,
)
from sordino.guardian.alerts import SLACK_ENV, AlertSender
from sordino.guardian.loop import Guardian
from sordino.guardian.metrics import SUPPORTED, Measure, measure
from sordino.guardian.records import EVENT_KIND
from sordino.guardian.recovery import Recovery

__all__ = [
    "EVENT_KIND",
    "SLACK_ENV",
    "SUPPORTED",
    "Action",
    "AlertSender",
    "Applied",
    "Controls",
    "Defragmenter",
    "Guardian",
    "Measure",
    "Recovery",
    "StepDegrader",
    "build_action",
    "check_supported",
    "measure",
]
