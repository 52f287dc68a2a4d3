"""The availability tally: accepted requests by model, priority and outcome, every 10 s."""

from __future__ import annotations

from typing import Any

from sordino.inference import ModelKey
from sordino.records import RequestDone
from sordino.telemetry.availability import AvailabilityTally, outcome_class, rejection_class
from sordino.telemetry.series import SeriesRecorder


def _done(priority: int, outcome: str = "success", reason: str = "") -> RequestDone:
    return RequestDone(ModelKey("m", "1"), outcome, reason, priority, 0.0, 0.0, 0.01)  # type: ignore[arg-type]


def test_outcomes_are_classed_as_the_client_saw_them() -> None:
    assert outcome_class("success", "") == "ok"
    assert outcome_class("failure", "queue_full") == "unavailable"
    assert outcome_class("failure", "shed") == "unavailable"  # a QueueFull subclass: 503
    assert outcome_class("failure", "out_of_memory") == "unavailable"
    assert outcome_class("failure", "queue_timeout") == "timeout"
    assert outcome_class("failure", "inference_failed") == "failed"
    assert outcome_class("cancelled", "cancelled") == "cancelled"


def test_closed_buckets_become_one_event_each() -> None:
    now = [1000.0]
    emitted: list[tuple[str, str, str, dict[str, Any]]] = []
    tally = AvailabilityTally(
        lambda kind, subject, cause="", **payload: emitted.append((kind, subject, cause, payload)),
        wall=lambda: now[0],
    )
    tally.request_done(_done(1))
    tally.request_done(_done(1, "failure", "shed"))
    tally.request_done(_done(2, "failure", "queue_timeout"))
    now[0] = 1005.0
    assert tally.flush(now[0]) == 0  # the bucket [1000, 1010) is still open
    now[0] = 1012.0
    tally.request_done(_done(2))
    assert tally.flush(now[0]) == 1
    ((kind, _, _, payload),) = emitted
    assert kind == "availability" and payload["start"] == 1000 and payload["seconds"] == 10
    first, second = payload["counts"]
    assert first == {"model": "m", "priority": 1, "accepted": 2, "ok": 1, "unavailable": 1,
                     "timeout": 0, "failed": 0, "cancelled": 0, "client_error": 0,
                     "refused": 0}  # fmt: skip
    assert second["priority"] == 2 and second["timeout"] == 1 and second["accepted"] == 1
    assert tally.flush() == 1  # on close, the open bucket too
    assert emitted[-1][3]["start"] == 1010


def test_refusals_before_acceptance_are_client_errors_or_refusals() -> None:
    """A 400 is the client's mistake, a 503 shed or a 429 the server's refusal (issue 27)."""
    assert rejection_class("invalid_request") == "client_error"
    assert rejection_class("bad_tensor") == "client_error"
    assert rejection_class("not_found") == "client_error"
    assert rejection_class("shed") == "refused"
    assert rejection_class("rate_limited") == "refused"
    assert rejection_class("internal") == "failed"
    emitted: list[dict[str, Any]] = []
    tally = AvailabilityTally(lambda *a, **payload: emitted.append(payload), wall=lambda: 1000.0)
    tally.rejected("m", "invalid_request", 402)
    tally.rejected("m", "shed", 3)
    tally.flush()
    (row,) = emitted[0]["counts"]
    assert (row["client_error"], row["refused"], row["accepted"], row["priority"]) == (
        402, 3, 0, 0,
    )  # fmt: skip


def test_a_models_error_answer_of_the_clients_kind_is_a_client_error() -> None:
    """A model's response with INVALID_ARG (say) is the caller's error: not accepted work
    that failed, not in the error rate; INTERNAL and the like are the model's failure."""
    assert outcome_class("failure", "model_rejected") == "client_error"
    assert outcome_class("failure", "model_response_error") == "failed"
    emitted: list[dict[str, Any]] = []
    tally = AvailabilityTally(lambda *a, **payload: emitted.append(payload), wall=lambda: 1000.0)
    tally.request_done(_done(1))
    tally.request_done(_done(1, "failure", "model_rejected"))
    tally.request_done(_done(1, "failure", "model_response_error"))
    tally.flush()
    (row,) = emitted[0]["counts"]
    assert (row["accepted"], row["ok"], row["failed"], row["client_error"]) == (2, 1, 1, 1)
    series = SeriesRecorder(
        models=list, instances=lambda _: 1, slo_s=lambda _: 1.0, wall=lambda: 1000.5
    )
    for reason in ("ok", "model_rejected", "model_response_error"):
        series.request_done(_done(1, "success" if reason == "ok" else "failure", reason))
    (second,) = series.close_until(1001)
    assert (second.requests, second.errors, second.client_errors) == (2, 1, 1)
