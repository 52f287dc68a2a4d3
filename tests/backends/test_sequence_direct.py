"""Triton's ``direct`` sequence strategy: a batch waits only with both
``max_queue_delay_microseconds`` and ``minimum_slot_utilization`` above 0, until that
fraction of ``max_batch_size`` has a request ready. Triton 2.51 answers the fixtures
``slot_utilization`` and ``direct_delay`` as these tests expect
(``bench/triton_python_parity.py`` compares them side by side); here their delay is
3 s, so a wait and no wait cannot be mistaken for each other."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread

ANSWERS = Path(__file__).parent.parent / "fixtures" / "triton_python_answers"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("repository")
    for name in ("slot_utilization", "direct_delay"):
        shutil.copytree(ANSWERS / name, root / name)
        config = root / name / "config.pbtxt"
        config.write_text(config.read_text().replace("2000000", "3000000"))
    with serve_in_thread(None, scan_repository(root)) as running:
        yield running


def _ask(server: RunningServer, model: str, corrid: int) -> tuple[int, float]:
    """One sequence's only request: the size of the batch it ran in, and how long it took."""
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    tensor = httpclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[corrid]], np.int32))
    started = time.monotonic()
    answer = client.infer(model, [tensor], sequence_id=corrid, sequence_start=True,
                          sequence_end=True)  # fmt: skip
    took = time.monotonic() - started
    client.close()
    return int(answer.as_numpy("BATCH")[0, 0]), took


def test_a_lone_request_waits_for_half_the_slots_then_runs(server: RunningServer) -> None:
    batch, took = _ask(server, "slot_utilization", 1)
    assert batch == 1 and took >= 2.0  # the 3 s delay passed (no other request came)


def test_two_ready_requests_fill_half_the_slots_and_run_at_once(server: RunningServer) -> None:
    answers: list[tuple[int, float]] = []
    threads = [
        threading.Thread(target=lambda c=c: answers.append(_ask(server, "slot_utilization", c)))
        for c in (11, 12)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [batch for batch, _ in answers] == [2, 2]


def test_the_delay_alone_waits_for_nothing(server: RunningServer) -> None:
    """Three lone requests in turn each run at once (sordino's predictive batcher ran the
    first at once and waited the whole delay for a later one before)."""
    for corrid in (21, 22, 23):
        batch, took = _ask(server, "direct_delay", corrid)
        assert batch == 1 and took < 2.5
