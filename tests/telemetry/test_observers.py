"""The scheduler's one observer: each event reaches every store that uses it, in order."""

from __future__ import annotations

from sordino.inference import ModelKey
from sordino.records import BatchDone
from sordino.telemetry.model_stats import ModelStats
from sordino.telemetry.observers import SchedulerObservers, does_nothing

KEY = ModelKey("m", "1")


class _Depths:
    """A store that keeps the queue depths it is told of, and ignores the rest."""

    def __init__(self, seen: list[tuple[str, int]], name: str) -> None:
        self.seen, self.name = seen, name

    def request_done(self, done: object) -> None:
        """Requests say nothing here."""

    def batch_done(self, done: object) -> None:
        pass

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        self.seen.append((self.name, depth))


def test_methods_that_do_nothing_are_recognised() -> None:
    stats = ModelStats()
    assert does_nothing(stats.queue_changed)  # `return None`
    assert not does_nothing(stats.batch_done)
    assert does_nothing(_Depths([], "a").request_done)  # a docstring alone
    assert does_nothing(_Depths([], "a").batch_done)  # `pass`
    assert not does_nothing(_Depths([], "a").queue_changed)
    assert not does_nothing(print)  # a builtin may do anything


def test_each_event_reaches_the_stores_that_use_it_in_order() -> None:
    seen: list[tuple[str, int]] = []
    stats = ModelStats()
    observers = SchedulerObservers(_Depths(seen, "a"), stats, _Depths(seen, "b"))
    observers.queue_changed(KEY, 3)
    assert seen == [("a", 3), ("b", 3)]
    observers.batch_done(BatchDone(KEY, 4, 2, 0.001, 0.002, 0.001, True))
    document = stats.triton_json([KEY])["model_stats"][0]
    assert document["execution_count"] == 1 and document["inference_count"] == 4
    assert document["last_inference"] > 0  # set once a batch
