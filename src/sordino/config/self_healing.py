"""The ``self_healing`` section: the guardian's triggers, actions, budget and recovery.

A trigger watches one metric (per model with ``model:``, else over every model) and,
when its threshold holds over its window, runs its action; ``actions: [a, b]`` is an
escalation list (the next runs when the previous did not clear the condition). Each
action is written as the brief writes it: ``restart_worker``, ``"throttle_requests_by
20%"``, ``"scale_workers +2"`` (see :data:`ACTIONS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import Field, field_validator, model_validator

from sordino.config.addresses import http_url_problem
from sordino.config.base import Section
from sordino.config.threshold import Threshold, parse_threshold
from sordino.config.units import Duration
from sordino.errors import ConfigError

__all__ = [
    "ACTIONS",
    "ActionSpec",
    "RecoveryConfig",
    "SelfHealingConfig",
    "TriggerConfig",
    "parse_action",
]

ACTIONS: dict[str, str] = {
    "restart_worker": "restart_worker",
    "trigger_defrag": "trigger_defrag",
    "throttle_requests": "throttle_requests (by 20%) or 'throttle_requests_by N%'",
    "throttle_requests_by": "'throttle_requests_by N%'",
    "scale_workers": "'scale_workers +N' or 'scale_workers -N'",
    "switch_device": "switch_device",
    "shed_low_priority": "shed_low_priority",
    "cache_recent_results": "cache_recent_results",
    "skip_non_critical": "skip_non_critical",
    "degrade_steps": "degrade_steps (to 50% of the steps) or 'degrade_steps N%'",
    "alert": "alert",
}
"""Every action a trigger may name, with the forms it is written in."""

_ACTION = re.compile(r"^\s*(?P<name>[a-z_]+)(?:\s+(?P<arg>[+-]?\s*[0-9]*\.?[0-9]+\s*%?))?\s*$")
_ACTION_FORMS = "actions: " + ", ".join(ACTIONS.values())


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One parsed action: its name and amount (a fraction for %, a count for ±N)."""

    name: str
    amount: float | None
    text: str

    def __str__(self) -> str:
        return self.text


def parse_action(text: str) -> ActionSpec:
    """Parse ``"scale_workers +2"``, ``"throttle_requests_by 20%"``, ``"alert"``, ..."""
    match = _ACTION.match(text) if isinstance(text, str) else None
    if match is None or match.group("name") not in ACTIONS:
        raise ConfigError(f"unknown action {text!r}; {_ACTION_FORMS}")
    name, arg = match.group("name"), (match.group("arg") or "").replace(" ", "")
    if name == "scale_workers":
        if not re.fullmatch(r"[+-][0-9]+", arg) or int(arg) == 0:
            raise ConfigError(f"action {text!r}: write 'scale_workers +N' or 'scale_workers -N'")
        return ActionSpec(name, float(int(arg)), text.strip())
    if name in ("throttle_requests", "throttle_requests_by", "degrade_steps"):
        default = {"throttle_requests": 0.2, "degrade_steps": 0.5}.get(name)
        if not arg:
            if default is None:
                raise ConfigError(f"action {text!r}: write 'throttle_requests_by N%', e.g. 20%")
            return ActionSpec(name, default, text.strip())
        if not arg.endswith("%") or arg.startswith(("+", "-")):
            raise ConfigError(f"action {text!r}: give the amount as a percentage, e.g. 20%")
        fraction = float(arg[:-1]) / 100
        if not 0 < fraction < 1:
            raise ConfigError(f"action {text!r}: the percentage lies between 0% and 100%")
        return ActionSpec(
            "throttle_requests" if name.startswith("throttle") else name, fraction, text.strip()
        )
    if arg:
        raise ConfigError(f"action {text!r}: {name} takes no amount; {_ACTION_FORMS}")
    return ActionSpec(name, None, text.strip())


class TriggerConfig(Section):
    """One rule: when ``metric`` crosses ``threshold`` over ``window``, act."""

    metric: str
    """What to watch: error_rate, p50_latency, p99_latency, qps, queue_depth,
    memory_fragmentation, memory_in_use, worker_busy, device_temperature, power,
    slo_attainment, network_latency, frame_delay."""
    threshold: str | float
    """'5%', '80°C', '500ms', '> 2000', 'above 0.7 for 5m', 'sudden_drop>40% in 1m'."""
    window: Duration | None = Field(default=None, gt=0)
    """How much recent data the metric is measured over (default: the threshold's
    'for/in' window, else 30 s)."""
    model: str | None = None
    """Watch (and act on) this model only; without it, every model together."""
    action: str | None = None
    """The one action to run (or use ``actions``)."""
    actions: tuple[str, ...] = ()
    """Escalation: the first action, then the next when the previous did not clear."""
    cooldown: Duration | None = Field(default=None, ge=0)
    """Least time between two actions of this trigger (default: the window)."""
    verify_window: Duration | None = Field(default=None, gt=0)
    """How long after an action its effect is judged (default: the window)."""
    hysteresis: float = Field(default=0.1, ge=0, lt=1)
    """The condition counts as cleared only this far (relative) inside the threshold."""

    @field_validator("actions", mode="before")
    @classmethod
    def _listed(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _parsable(self) -> TriggerConfig:
        if (self.action is None) == (not self.actions):
            raise ValueError(
                "a trigger needs 'action: NAME' or 'actions: [NAME, ...]' (one of them); "
                + _ACTION_FORMS
            )
        try:
            self.parsed_threshold()
            for text in self.action_texts:
                parse_action(text)
        except ConfigError as exc:  # pydantic reports only ValueError as a validation error
            raise ValueError(str(exc)) from None
        return self

    @property
    def action_texts(self) -> tuple[str, ...]:
        return (self.action,) if self.action is not None else self.actions

    def parsed_actions(self) -> tuple[ActionSpec, ...]:
        return tuple(parse_action(text) for text in self.action_texts)

    def parsed_threshold(self) -> Threshold:
        return parse_threshold(str(self.threshold), self.metric)

    @property
    def window_s(self) -> float:
        if self.window is not None:
            return self.window
        return self.parsed_threshold().window_s

    @property
    def cooldown_s(self) -> float:
        return self.window_s if self.cooldown is None else self.cooldown

    @property
    def verify_s(self) -> float:
        return self.window_s if self.verify_window is None else self.verify_window

    @property
    def name(self) -> str:
        """How records and ``sordino guardian status`` name this trigger."""
        where = f" of {self.model}" if self.model else ""
        return f"{self.metric}{where} {self.threshold}"


class RecoveryConfig(Section):
    """How a restarted or added instance comes back into traffic."""

    warmup_requests: int = Field(default=10, ge=0)
    """Synthetic requests a new instance runs before it takes any traffic."""
    health_check: str = "/health?deep=true"
    """The check that must pass before each ramp step (only the deep health check)."""
    rollback_on_failure: bool = True
    """Revert an action's configuration change when its verify window shows it made the
    watched metric or the p99 latency worse."""
    ramp: tuple[float, ...] = (0.1, 0.5, 1.0)
    """The share of traffic a new instance takes in each step, ending at 1.0."""
    ramp_step: Duration = Field(default=2.0, gt=0)
    """How long each ramp step lasts."""

    @field_validator("health_check")
    @classmethod
    def _deep(cls, value: str) -> str:
        if value.split("?")[0] not in ("/health", "/v2/health/ready"):
            raise ValueError(
                f"health_check {value!r} is not supported: use '/health?deep=true' or "
                "'/v2/health/ready?deep=true'"
            )
        return value

    @field_validator("ramp")
    @classmethod
    def _ramp(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or value[-1] != 1.0 or any(not 0 < v <= 1 for v in value):
            raise ValueError("ramp lists shares in (0, 1] ending at 1.0, e.g. [0.1, 0.5, 1.0]")
        if list(value) != sorted(value):
            raise ValueError("ramp shares must grow, e.g. [0.1, 0.5, 1.0]")
        return value


class SelfHealingConfig(Section):
    """The guardian: metric rules that act, verify and roll back by themselves."""

    enabled: bool = False
    """Run the guardian. When not given, a block with ``triggers`` is on and one without
    is off, so a block that lists triggers acts unless it says ``enabled: false``
    (``sordino start --guardian-mode true|false`` sets it either way)."""
    interval: Duration = Field(default=0.5, gt=0, le=10)
    """How often the triggers are evaluated on the in-memory series."""
    triggers: tuple[TriggerConfig, ...] = ()
    """The rules, each evaluated on its own."""
    recovery: RecoveryConfig = RecoveryConfig()
    max_actions_per_hour: int = Field(default=30, ge=1)
    """The budget: actions started in any hour, over every trigger."""
    alert_channels: tuple[str, ...] = ()
    """Where alerts go: 'slack:#channel' (URL in $SORDINO_SLACK_WEBHOOK),
    'webhook:URL', 'file:PATH', 'log'."""
    max_instances: int = Field(default=8, ge=1)
    """scale_workers never grows a model past this many instances per device."""
    min_instances: int = Field(default=1, ge=1)
    """scale_workers never shrinks a model below this many instances per device."""
    non_critical_tags: tuple[str, ...] = ("non-critical",)
    """Request tags (X-Sordino-Tag or parameters.tag) that skip_non_critical refuses."""
    exclude_models: tuple[str, ...] = ()
    """Models the guardian leaves alone: their figures count towards no trigger, and no
    action targets, throttles or sheds them (a node's ``self_healing: false`` adds its
    model here)."""

    @model_validator(mode="before")
    @classmethod
    def _on_with_triggers(cls, data: object) -> object:
        # A block that lists triggers means them to act; only ``enabled: false`` keeps
        # it off. Decided on the raw mapping, so an explicit value always wins.
        if isinstance(data, dict) and "enabled" not in data and data.get("triggers"):
            return {**data, "enabled": True}
        return data

    @field_validator("alert_channels", mode="before")
    @classmethod
    def _channels(cls, value: object) -> object:
        channels = (value,) if isinstance(value, str) else value
        if isinstance(channels, list | tuple):
            for channel in channels:
                kind = str(channel).partition(":")[0]
                if channel != "log" and (
                    kind not in ("slack", "webhook", "file") or not str(channel).partition(":")[2]
                ):
                    raise ValueError(
                        f"alert channel {channel!r}: use 'slack:#channel', 'webhook:URL', "
                        "'file:PATH' or 'log'"
                    )
                if kind == "webhook" and http_url_problem(str(channel).partition(":")[2]):
                    raise ValueError(
                        f"alert channel {channel!r}: the webhook URL must be http:// or "
                        "https:// with a host, e.g. 'webhook:https://alerts.example.com/hook'"
                    )
        return channels

    @model_validator(mode="after")
    def _bounds(self) -> SelfHealingConfig:
        if self.min_instances > self.max_instances:
            raise ValueError(
                f"min_instances {self.min_instances} exceeds max_instances {self.max_instances}"
            )
        return self
