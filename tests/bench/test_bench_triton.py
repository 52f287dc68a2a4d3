"""The pure parts of bench/bench_triton.py: the peers' files, aggregation, targets, checks.

Nothing here installs or starts a peer; the servers themselves are exercised by running
the benchmark.
"""

from __future__ import annotations

import subprocess
import sys
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from bench import bench_triton, peer_load, peers


def test_triton_repository_configs_parse_with_the_batching_asked_for(tmp_path: Path) -> None:
    """Each model's config.pbtxt is a valid ModelConfig with its own queue delay."""
    onnx = tmp_path / "mlp.onnx"
    models = [peers.Batching("w1"), peers.Batching("w1_nodelay", delay_us=0)]
    peers.write_triton_repository(tmp_path / "repo", models, onnx)
    for model, delay in (("w1", 10_000), ("w1_nodelay", 0)):
        text = (tmp_path / "repo" / model / "config.pbtxt").read_text()
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        assert config.name == model and config.backend == "python"
        assert config.max_batch_size == 32
        assert list(config.dynamic_batching.preferred_batch_size) == [32]
        assert config.dynamic_batching.max_queue_delay_microseconds == delay
        assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
        assert list(config.input[0].dims) == [256] and config.input[0].name == "x"
        assert config.parameters["onnx_path"].string_value == str(onnx)
        compile((tmp_path / "repo" / model / "1" / "model.py").read_text(), "model.py", "exec")


@pytest.mark.parametrize("spinning", [True, False])
def test_the_python_model_opens_its_session_spinning_as_asked(
    tmp_path: Path, spinning: bool
) -> None:
    """The same model.py on both servers; only its config.pbtxt says whether ONNX
    Runtime's intra-op threads spin (``--session-spinning``), and its session does so."""
    from bench.models import mlp

    from sordino.backends.base import ModelRunOptions
    from sordino.backends.registry import create_backend

    onnx = mlp(tmp_path / "mlp.onnx")
    repo = peers.write_triton_repository(
        tmp_path / "repo", [peers.Batching("w1", spinning=spinning)], onnx
    )
    backend = create_backend(
        ModelRunOptions("python"),
        name="w1",
        version="1",
        providers=["CPUExecutionProvider"],
        intra_op_threads=None,
    )
    backend.load(repo / "w1" / "1" / "model.py")
    try:
        options = backend._model.session.get_session_options()  # type: ignore[attr-defined]
        entry = options.get_session_config_entry("session.intra_op.allow_spinning")
        assert entry == ("1" if spinning else "0")
        x = np.ones((2, 256), np.float32)
        assert backend.infer({"x": x})["y"].shape == (2, 256)
    finally:
        backend.unload()


def test_mosec_server_source_compiles() -> None:
    compile(peers.MOSEC_SERVER_PY, "server.py", "exec")


def _cell(server: str, transport: str, concurrency: int, **figures: Any) -> dict[str, Any]:
    cell: dict[str, Any] = {
        "server": server, "transport": transport, "concurrency": concurrency, "rate": 100.0,
        "p50_ms": 1.0, "p99_ms": 2.0, "mean_batch": None, "client_cpu_ms": 0.1,
        "cpu_ms": {"front": 0.1, "model": 0.2, "total": 0.3}, "failed": 0, "max_abs_diff": 0.0,
    }  # fmt: skip
    cell.update(figures)
    return cell


def test_aggregate_takes_medians_sums_failures_and_keeps_the_worst_difference() -> None:
    cells = [
        _cell("sordino", "http", 64, rate=100.0, failed=1, max_abs_diff=1e-7),
        _cell("sordino", "http", 64, rate=300.0, max_abs_diff=3e-7),
        _cell("sordino", "http", 64, rate=200.0, cpu_ms={"front": 0.5, "model": 0, "total": 0.5}),
    ]
    (row,) = bench_triton.aggregate(cells)
    assert row["rate"] == 200.0 and row["repeats"] == 3
    assert row["failed"] == 1 and row["max_abs_diff"] == 3e-7
    assert row["cpu_ms"]["front"] == 0.1 and row["mean_batch"] is None
    assert row["idle_share"] is None  # cells without it (perf_analyzer's) say n/a


def test_the_machine_idle_share_is_the_idle_part_of_all_cpu_time() -> None:
    times = namedtuple("times", "user system idle")
    assert bench_triton.idle_share(times(10, 5, 20), times(16, 7, 28)) == 0.5
    assert bench_triton.idle_share(times(1, 1, 1), times(1, 1, 1)) == 0.0
    cells = [_cell("sordino", "http", 64, idle_share=v) for v in (0.4, 0.1, 0.3)]
    (row,) = bench_triton.aggregate(cells)
    assert row["idle_share"] == 0.3


def test_verdicts_compare_against_the_right_peer() -> None:
    rows = bench_triton.aggregate([
        _cell("sordino", "http", 64, rate=300.0, p99_ms=10.0, mean_batch=30.0),
        _cell("sordino", "grpc", 64, rate=50.0, p99_ms=10.0, mean_batch=3.0),
        _cell("triton 10ms", "http", 64, rate=200.0, p99_ms=20.0),
        _cell("triton 10ms", "grpc", 64, rate=200.0, p99_ms=5.0),
        _cell("sordino", "http", 1, p50_ms=2.0),
        _cell("triton 0ms", "http", 1, p50_ms=1.0, cpu_ms={"front": 0, "model": 0, "total": 0.6}),
        _cell("sordino defaults", "http", 64, rate=300.0, p99_ms=10.0),
        _cell("mosec", "http", 64, rate=100.0, p99_ms=20.0),
    ])  # fmt: skip
    found = {v["target"]: v for v in bench_triton.verdicts(rows)}
    assert found["http c64 throughput / Triton's"]["value"] == 1.5
    assert found["http c64 throughput / Triton's"]["met"] is True
    assert found["grpc c64 p99 / Triton's"]["met"] is False
    assert found["gRPC c64 mean batch / HTTP's"]["value"] == 0.1
    assert found["HTTP c1 p50 / Triton 0ms p50"]["met"] is False
    assert found["HTTP c1 CPU per request / Triton 0ms's"]["value"] == 0.5
    assert found["HTTP c64 CPU ms per request (whole tree)"]["met"] is True
    assert found["defaults HTTP c64 throughput / Mosec's"]["value"] == 3.0


def test_two_front_ends_are_compared_with_triton_only_when_measured() -> None:
    cells = [
        _cell("sordino", "http", 64, rate=300.0, p99_ms=10.0),
        _cell("triton 10ms", "http", 64, rate=200.0, p99_ms=20.0),
    ]
    found = {v["target"] for v in bench_triton.verdicts(bench_triton.aggregate(cells))}
    assert not any(target.startswith("2 front ends") for target in found)
    cells.append(_cell("sordino 2fe", "http", 64, rate=100.0, p99_ms=30.0))
    verdicts = {v["target"]: v for v in bench_triton.verdicts(bench_triton.aggregate(cells))}
    assert verdicts["2 front ends: http c64 throughput / Triton's"]["value"] == 0.5
    assert verdicts["2 front ends: http c64 p99 / Triton's"]["met"] is False
    assert "2 front ends: grpc c64 throughput / Triton's" not in verdicts


def test_front_end_processes_count_as_the_serving_side() -> None:
    class Process:
        def __init__(self, pid: int, cmdline: list[str]) -> None:
            self.pid, self._cmdline = pid, cmdline

        def cmdline(self) -> list[str]:
            return self._cmdline

    front = Process(2, ["python", "-m", "sordino.server.frontend_main", "{}"])
    worker = Process(3, ["python", "-c", "from multiprocessing.spawn import spawn_main"])
    bucket = bench_triton._frontends_are_front
    assert [bucket(p, 1) for p in (Process(1, []), front, worker)] == ["front", "front", "model"]  # type: ignore[arg-type]


def test_a_missing_server_leaves_its_targets_unmeasured() -> None:
    rows = bench_triton.aggregate([_cell("sordino", "http", 64)])
    found = {v["target"]: v for v in bench_triton.verdicts(rows)}
    assert found["http c64 throughput / Triton's"]["met"] is None
    assert found["HTTP c64 CPU ms per request (whole tree)"]["met"] is True


def test_plan_interleaves_servers_rotates_them_and_sends_mosec_only_http() -> None:
    plan = bench_triton.cells_plan(["sordino", "triton 10ms", "mosec"], 2, (64,))
    first = [(t, s) for r, _, t, s in plan if r == 0]
    assert first == [("http", "sordino"), ("http", "triton 10ms"), ("http", "mosec"),
                     ("grpc", "sordino"), ("grpc", "triton 10ms")]  # fmt: skip
    assert [s for r, _, t, s in plan if r == 1 and t == "http"] == [
        "triton 10ms", "mosec", "sordino"
    ]  # fmt: skip


def test_cpu_delta_buckets_new_and_old_processes() -> None:
    before = {1: ("front", 1.0), 2: ("model", 2.0)}
    after = {1: ("front", 1.5), 2: ("model", 2.25), 3: ("model", 0.25)}
    assert bench_triton.cpu_delta(before, after) == {"front": 0.5, "model": 0.5, "total": 1.0}


def test_check_decodes_binary_kserve_answers_and_counts_failures() -> None:
    expected = np.arange(8, dtype=np.float32).reshape(2, 4)
    header = b'{"outputs":[]}'
    body = header + (expected[1] + 0.5).tobytes()
    ok = (
        b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: "
        + str(len(header)).encode()
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    answers = peer_load.Answers(rows=[1, 0], statuses=[200, 503], bodies=[ok, b"busy"])
    failed, worst, first = peer_load.check(answers, expected, peer_load.kserve_http_output)
    assert (failed, worst) == (1, 0.5)
    assert first is not None and "503" in first


def test_a_peer_that_exits_at_start_is_reported_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("starting\nerror: no such backend 'python'\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(peers.PeerError, match=r"exited with 3 at start: error: no such backend"):
        peers._wait_ready(proc, "http://127.0.0.1:9/", "tritonserver", log, timeout=5)


def test_a_failed_install_ends_the_run_with_one_line_and_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(name: str, packages: tuple[str, ...], probe: str) -> Path:
        raise peers.PeerError(f"installing {name} failed; see install.log")

    monkeypatch.setattr(peers, "ensure_venv", broken)
    monkeypatch.setattr(sys, "argv", ["bench_triton", "--servers", "triton 10ms", "--idle", "0"])
    with pytest.raises(SystemExit) as exited:
        bench_triton.main()
    assert exited.value.code == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["bench_triton: installing triton failed; see install.log"]
