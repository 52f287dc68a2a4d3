"""``server.frontends: 2``: the front ends' HTTP connection figures reach the engine's
``sordino_http_connections*`` and ``sordino_http_timeouts_total`` (``server/connection_tally.py``).

The engine reads no client connection here, so without the front ends' reports these
families would count only connections handed over to it.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sordino.config import RuntimeConfig
from sordino.models.repository import builtin_sources
from sordino.records import ConnectionStatistics
from sordino.server import link_frames
from sordino.server.connection_tally import ConnectionTally
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated
from tests.server.frontend_helpers import any_connection, ask, digits_body, owner
from tests.waiting import wait_for

PER_PROCESS = 50  # server.max_connections: each front end applies it on its own


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = RuntimeConfig.model_validate(
        {
            "server": {
                "frontends": 2,
                "max_connections": PER_PROCESS,
                "max_connections_per_client": 40,
                "header_timeout": 1.0,
                "shutdown_timeout": 10,
            }
        }
    )
    with serve_in_thread(config, thread_isolated(builtin_sources())) as running:
        yield running


def sample(server: RunningServer, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of sample ``name`` (with ``labels``) in the engine's registry."""
    text = generate_latest(server.runtime.metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and (labels is None or s.labels == labels):
                return float(s.value)
    raise AssertionError(f"no sample {name} {labels}")


def test_the_limits_are_the_front_ends_limits_summed(server: RunningServer) -> None:
    wait_for(
        lambda: (
            sample(server, "sordino_http_connections_limit", {"scope": "total"}) == 2 * PER_PROCESS
        ),
        "both front ends' limits in the engine's gauge",
    )
    limit = sample(server, "sordino_http_connections_limit", {"scope": "per_client"})
    assert limit == 2 * 40


def test_connections_the_front_ends_hold_are_counted_by_the_engine(
    server: RunningServer,
) -> None:
    wait_for(lambda: sample(server, "sordino_http_connections") == 0, "no connection open")
    connections = [any_connection(server) for _ in range(6)]
    for connection in connections:  # served by a front end, kept alive there
        status, _, _ = ask(connection, "POST", "/v2/models/digits-classifier/infer", digits_body())
        assert status == 200
    assert server.frontends is not None
    fronts = set(server.frontends.pids())
    assert {owner(server, c.sock) for c in connections if c.sock is not None} <= fronts
    wait_for(lambda: sample(server, "sordino_http_connections") == 6, "6 open connections")
    for connection in connections:
        connection.close()
    wait_for(lambda: sample(server, "sordino_http_connections") == 0, "the 6 closed")


def test_a_dead_front_ends_counters_stay_and_its_connections_leave(
    server: RunningServer,
) -> None:
    assert server.frontends is not None
    timeouts = {"phase": "header"}
    before = sample(server, "sordino_http_timeouts_total", timeouts)
    silent = socket.create_connection(("127.0.0.1", server.port))  # sends nothing
    victim = owner(server, silent)
    wait_for(
        lambda: sample(server, "sordino_http_timeouts_total", timeouts) == before + 1,
        "the front end's header timeout in the engine's counter",
    )
    silent.close()
    # An open connection on the front end that is about to die (a request answered on
    # it: then kept alive, not timed out).
    while True:
        held = any_connection(server)
        assert held.sock is not None
        if owner(server, held.sock) == victim:
            break
        held.close()
    status, _, _ = ask(held, "POST", "/v2/models/digits-classifier/infer", digits_body())
    assert status == 200
    wait_for(lambda: sample(server, "sordino_http_connections") == 1, "the held connection")
    counted = sample(server, "sordino_http_timeouts_total", timeouts)
    os.kill(victim, signal.SIGKILL)
    link = server.frontends.link
    wait_for(
        lambda: sample(server, "sordino_http_connections") == 0,
        "the dead front end's connection to leave the sum",
    )
    assert victim not in link.pids()
    assert sample(server, "sordino_http_timeouts_total", timeouts) >= counted  # never down
    held.close()
    wait_for(lambda: len(link.pids()) == 2, "the front end restarted")
    assert sample(server, "sordino_http_timeouts_total", timeouts) >= counted


def figures(open_: int, refused: int, timeouts: int, limit: int = 10) -> ConnectionStatistics:
    return ConnectionStatistics(open_, open_, limit, limit, refused, 0, timeouts, 0)


def test_the_tally_sums_and_keeps_a_gone_front_ends_counters() -> None:
    tally = ConnectionTally()
    own = figures(1, 0, 0, limit=99)
    assert tally.total(own) == own  # no front end yet: the engine's own figures
    tally.report("a", figures(3, 2, 1))
    tally.report("b", figures(4, 5, 0))
    tally.report("a", figures(2, 3, 1))  # replaces a's last
    total = tally.total(own)
    assert (total.open, total.refused_total, total.header_timeouts) == (7, 8, 1)
    assert total.max_connections == 20  # the front ends' limits, not the engine's
    tally.gone("a")
    after = tally.total(own)
    assert (after.open, after.refused_total, after.header_timeouts) == (5, 8, 1)
    assert after.max_connections == 10
    tally.gone("a")  # twice, or one that never reported: nothing changes
    tally.gone("never")
    assert tally.total(own) == after
    tally.report("c", figures(0, 0, 0))  # its replacement starts from zero
    assert tally.total(own).refused_total == 8


def test_the_connections_frame_round_trips() -> None:
    stats = ConnectionStatistics(1, 2, 3, 4, 5, 6, 7, 1 << 40)
    frame = link_frames.encode_connections(stats)
    [(kind, body)] = link_frames.FrameReader().feed(frame)
    assert kind == link_frames.CONNECTIONS
    assert link_frames.decode_connections(body) == stats
    with pytest.raises(link_frames.FrameError):
        link_frames.decode_connections(body[:-1])
