"""``sordino strategy``: bundles as plain files, checked on import, applied through reconfigure."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.models.repository import builtin_sources
from sordino.operations.bundles import builtin_bundles, check
from sordino.testing import serve_in_thread
from tests.config.test_bounded import alias_bomb

TOKEN = "strategy-test-token"


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("bundle", builtin_bundles(), ids=lambda b: b.name)
def test_builtin_strategies_validate(bundle: object) -> None:
    assert check(bundle) == []  # type: ignore[arg-type]


def test_builtins_are_listed_and_found_by_tag(tmp_path: Path) -> None:
    code, out = _cli("strategy", "list", "--data-dir", str(tmp_path))
    assert code == 0
    for name in ("ecommerce_peak_guard", "edge_conservative", "realtime_game", "multi_tenant_fair"):
        assert name in out
    code, out = _cli("strategy", "search", "black_friday", "--data-dir", str(tmp_path))
    assert code == 0 and out.startswith("ecommerce_peak_guard 1.0.0 (built-in, Apache-2.0)")
    code, out = _cli("strategy", "show", "realtime_game", "--data-dir", str(tmp_path))
    assert code == 0 and "mode: ultra_low_latency" in out and "# license: Apache-2.0" in out


def test_share_export_import_apply_round_trip(tmp_path: Path) -> None:
    """A strategy shared on one machine is imported on another and applied live."""
    source = tmp_path / "peak.yaml"
    source.write_text(
        "scheduler:\n  mode: conservative\nmemory:\n  defrag_interval: 3m\n"
        "server:\n  http_port: 9000\n"  # not a strategy section: left out of the bundle
    )
    here, there = tmp_path / "here", tmp_path / "there"
    code, out = _cli(
        "strategy", "share", "--name", "peak_guard", "--tags", "black_friday,high_traffic",
        "--description", "peak traffic guard", "--license", "apache-2.0", "--from", str(source),
        "--data-dir", str(here),
    )  # fmt: skip
    assert code == 0, out
    assert "http_port" not in (here / "strategies/peak_guard/config.yaml").read_text()
    archive = tmp_path / "peak_guard.tar.gz"
    code, out = _cli(
        "strategy", "export", "peak_guard", "-o", str(archive), "--data-dir", str(here)
    )
    assert code == 0, out
    code, out = _cli("strategy", "import", str(archive), "--data-dir", str(there))
    assert code == 0, out
    code, out = _cli("strategy", "validate", "peak_guard", "--data-dir", str(there))
    assert code == 0 and "valid" in out
    config = load_config(None, {"server.admin_token": TOKEN})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, digits) as server:
        code, out = _cli(
            "strategy", "apply", "peak_guard", "--data-dir", str(there), "--url", server.url,
            "--token", TOKEN, "--verify-window", "0s",
        )  # fmt: skip
        assert code == 0, out
        assert "scheduler.mode: 'adaptive' -> 'conservative'  (live)" in out
        assert server.runtime.get("digits-classifier").scheduling.mode == "conservative"
        assert server.runtime.memory.config.defrag_interval == 180.0
        code, out = _cli("config", "history", "--url", server.url, "--token", TOKEN)
        assert "strategy:peak_guard@1.0.0: applied" in out
        # A strategy whose keys need a restart is refused by name, and nothing changes.
        code, out = _cli(
            "strategy", "apply", "realtime_game", "--data-dir", str(there), "--url", server.url,
            "--token", TOKEN,
        )  # fmt: skip
        assert code == 1 and "self_healing" in out and "memory.pool_size" not in out
        assert server.runtime.config.scheduler.mode == "conservative"


def _tamper(archive: Path, target: Path, edit: dict[str, str]) -> None:
    with tarfile.open(archive, "r:gz") as source, tarfile.open(target, "w:gz") as out:
        for member in source.getmembers():
            data = source.extractfile(member).read()  # type: ignore[union-attr]
            name = Path(member.name).name
            if name in edit:
                data = edit[name].encode()
                member.size = len(data)
            out.addfile(member, io.BytesIO(data))


def test_import_refuses_a_changed_file_a_bad_license_or_version(tmp_path: Path) -> None:
    archive = tmp_path / "edge.tar.gz"
    assert _cli("strategy", "export", "edge_conservative", "-o", str(archive),
                "--data-dir", str(tmp_path))[0] == 0  # fmt: skip
    with tarfile.open(archive, "r:gz") as source:
        meta = source.extractfile("edge_conservative/metadata.yaml").read().decode()  # type: ignore[union-attr]
    cases = {
        "config.yaml": (
            {"config.yaml": "scheduler:\n  mode: manual\n"},
            "does not match its checksum",
        ),
        "license": ({"metadata.yaml": meta.replace("Apache-2.0", "free-ish")}, "not an SPDX"),
        "version": ({"metadata.yaml": meta.replace(">=0.1", ">=9")}, "written for sordino >=9"),
    }
    for label, (edit, needle) in cases.items():
        bad = tmp_path / f"bad-{label}.tar.gz"
        _tamper(archive, bad, edit)
        code, out = _cli("strategy", "import", str(bad), "--data-dir", str(tmp_path / "reg"))
        assert code == 1 and needle in out and "Traceback" not in out, (label, out)
    assert not (tmp_path / "reg" / "strategies" / "edge_conservative").exists()


def test_import_refuses_a_yaml_alias_bomb_with_a_correct_checksum(tmp_path: Path) -> None:
    """A few hundred bytes that expand to 9**9 strings: refused at once, nothing saved."""
    archive = tmp_path / "edge.tar.gz"
    assert _cli("strategy", "export", "edge_conservative", "-o", str(archive),
                "--data-dir", str(tmp_path))[0] == 0  # fmt: skip
    with tarfile.open(archive, "r:gz") as source:
        meta = source.extractfile("edge_conservative/metadata.yaml").read().decode()  # type: ignore[union-attr]
        config = source.extractfile("edge_conservative/config.yaml").read()  # type: ignore[union-attr]
    bomb = alias_bomb()
    assert len(bomb) < 600
    meta = meta.replace(
        hashlib.sha256(config).hexdigest(), hashlib.sha256(bomb.encode()).hexdigest()
    )
    bad = tmp_path / "bomb.tar.gz"
    _tamper(archive, bad, {"config.yaml": bomb, "metadata.yaml": meta})
    code, out = _cli("strategy", "import", str(bad), "--data-dir", str(tmp_path / "reg"))
    assert code == 1 and "expands to more than" in out and "Traceback" not in out, out
    assert not (tmp_path / "reg" / "strategies" / "edge_conservative").exists()
