"""Loading configuration files, overrides, and the one-ConfigError-for-everything report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sordino.config import (
    PriorityRule,
    load_config,
    load_model_config_file,
    validate_config,
)
from sordino.config.loader import looks_secret, secret_key, shown_value
from sordino.errors import ConfigError

BRIEF_EXAMPLE = """\
scheduler:
  mode: "adaptive"
  strategies:
    - name: "dynamic_batching"
      enabled: true
      min_batch: 1
      max_batch: 16
      timeout_ms: 50
    - name: "stream_priority"
      rules:
        - tag: "premium_user" → priority: "high"
        - tag: "batch_job" → priority: "low"
"""

STRATEGIES = "scheduler:\n  strategies:\n"

NORMAL_FORM = BRIEF_EXAMPLE.replace(
    '- tag: "premium_user" → priority: "high"', '- tag: "premium_user"\n          priority: "high"'
).replace('- tag: "batch_job" → priority: "low"', '- tag: "batch_job"\n          priority: "low"')


class ConfigFiles:
    """Writes YAML text into config files inside one temporary folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def write(self, text: str, name: str = "sordino.yaml") -> Path:
        path = self.folder / name
        path.write_text(text, encoding="utf-8")
        return path


@pytest.fixture
def files(tmp_path: Path) -> ConfigFiles:
    return ConfigFiles(tmp_path)


def problems(error: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    """The problem lines of a ConfigError message (everything after the header)."""
    return [line.strip() for line in error.value.message.splitlines()[1:]]


# --- reading files ------------------------------------------------------------------------


def test_brief_example_loads(files: ConfigFiles) -> None:
    """The brief's example, arrow form included, loads into the expected snapshot."""
    config = load_config(files.write(BRIEF_EXAMPLE))
    assert config.scheduler.mode == "adaptive"
    assert config.scheduler.dynamic_batching.max_batch == 16
    assert config.scheduler.dynamic_batching.timeout_ms == 50.0
    assert config.scheduler.priority_rules == (
        PriorityRule(tag="premium_user", priority="high"),
        PriorityRule(tag="batch_job", priority="low"),
    )


def test_arrow_form_equals_normal_form(files: ConfigFiles) -> None:
    """Arrow-form rules and ordinary YAML mappings give the same config."""
    arrows = load_config(files.write(BRIEF_EXAMPLE, "arrows.yaml"))
    assert arrows == load_config(files.write(NORMAL_FORM, "normal.yaml"))


def test_ascii_arrow_unquoted_with_comment(files: ConfigFiles) -> None:
    """`->`, bare values and a trailing comment are handled too."""
    text = BRIEF_EXAMPLE.replace(
        '- tag: "batch_job" → priority: "low"', "- tag: batch_job -> priority: low  # bulk"
    )
    assert load_config(files.write(text)).scheduler.priority_rules[1] == PriorityRule(
        tag="batch_job", priority="low"
    )


def test_no_file_means_defaults() -> None:
    """load_config() without a path returns the defaults."""
    assert load_config().server.http_port == 8000


def test_empty_file_means_defaults(files: ConfigFiles) -> None:
    """An empty file is a valid config with every default."""
    assert load_config(files.write("")) == load_config()


def test_missing_file_names_path(tmp_path: Path) -> None:
    """A missing file is a ConfigError naming the path."""
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=re.escape(f"{path} does not exist")):
        load_config(path)


def test_yaml_syntax_error_names_path_and_line(files: ConfigFiles) -> None:
    """A YAML syntax error reports the file and the line."""
    path = files.write("server:\n  host: [a\n  http_port: 1\n")
    with pytest.raises(ConfigError, match=re.escape(f"YAML error in {path}, line ")):
        load_config(path)


def test_duplicate_key_refused(files: ConfigFiles) -> None:
    """A key given twice would silently drop the first value, so it is an error."""
    with pytest.raises(ConfigError, match=r"line 3.*found the key 'host' twice"):
        load_config(files.write("server:\n  host: a\n  host: b\n"))


def test_top_level_must_be_mapping(files: ConfigFiles) -> None:
    """A file holding a list is refused."""
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(files.write("- a\n- b\n"))


def test_relative_paths_are_relative_to_the_file(files: ConfigFiles, tmp_path: Path) -> None:
    """Relative paths in a file resolve against the file's folder."""
    text = "model_repository: models\nmodels: [{name: m, path: m.onnx}]\n"
    config = load_config(files.write(text))
    assert config.model_repository == tmp_path / "models"
    assert config.models[0].path == tmp_path / "m.onnx"


# --- overrides ----------------------------------------------------------------------------


def test_overrides_replace_file_values(files: ConfigFiles) -> None:
    """A dotted override wins over the file."""
    config = load_config(files.write("server:\n  http_port: 9000\n"), {"server.http_port": 0})
    assert config.server.http_port == 0


def test_overrides_create_missing_sections() -> None:
    """An override may set a key whose section the file never mentioned."""
    assert load_config(None, {"scheduler.slo_p99_ms": 50}).scheduler.slo_p99_ms == 50.0


def test_override_indexes_lists(files: ConfigFiles) -> None:
    """A digit part of an override key indexes a list."""
    path = files.write("models: [{name: m, path: /m.onnx}]\n")
    assert load_config(path, {"models.0.max_batch_size": 4}).models[0].max_batch_size == 4


def test_override_paths_are_not_rewritten(files: ConfigFiles) -> None:
    """Override paths keep their meaning (relative to the working directory)."""
    config = load_config(files.write(""), {"model_repository": "repo"})
    assert config.model_repository == Path("repo")


def test_override_into_a_value_refused(files: ConfigFiles) -> None:
    """An override cannot descend into a key that holds a plain value."""
    with pytest.raises(ConfigError, match=r"server\.http_port has no place"):
        load_config(files.write("server:\n  http_port: 1\n"), {"server.http_port.x": 2})


def test_invalid_override_reported_without_file_line(files: ConfigFiles) -> None:
    """A bad value from an override is reported, with no misleading file line."""
    with pytest.raises(ConfigError) as caught:
        load_config(files.write("server:\n  http_port: 1\n"), {"server.http_port": "abc"})
    assert problems(caught)[0].startswith("server.http_port:")
    assert "[line" not in problems(caught)[0]


# --- error report -------------------------------------------------------------------------


def test_unknown_key_suggests_close_name(files: ConfigFiles) -> None:
    """An unknown key names the closest valid key and lists the valid keys."""
    with pytest.raises(ConfigError) as caught:
        load_config(files.write("scheduler:\n  strategy: []\n"))
    assert problems(caught) == [
        "scheduler.strategy: unknown key 'scheduler.strategy' — did you mean 'strategies'? "
        "(valid keys: mode, slo_p99_ms, strategies, priority, frame_rate, max_batch) [line 2]"
    ]


def test_unknown_key_without_close_match_has_no_hint(files: ConfigFiles) -> None:
    """Nothing is suggested when no valid key is close."""
    with pytest.raises(ConfigError) as caught:
        load_config(files.write("server:\n  zzz: 1\n"))
    assert "did you mean" not in caught.value.message
    assert "valid keys: host, http_port" in caught.value.message


def test_unknown_key_inside_strategy_drops_union_tag(files: ConfigFiles) -> None:
    """Locations inside a strategy read strategies.N.key, with the strategy's own keys."""
    with pytest.raises(ConfigError) as caught:
        load_config(files.write(STRATEGIES + "    - name: dynamic_batching\n      max_bach: 4\n"))
    assert problems(caught)[0].startswith(
        "scheduler.strategies.0.max_bach: unknown key 'scheduler.strategies.0.max_bach'"
        " — did you mean 'max_batch'?"
    )


def test_wrong_type_reports_location_and_value(files: ConfigFiles) -> None:
    """A wrong type names the dotted location and the value given."""
    with pytest.raises(ConfigError) as caught:
        load_config(files.write("server:\n  http_port: abc\n"))
    (line,) = problems(caught)
    assert line.startswith("server.http_port: Input should be a valid integer")
    assert line.endswith("(got 'abc') [line 2]")


def test_every_problem_reported_at_once(files: ConfigFiles) -> None:
    """All problems come back in one ConfigError, one per line, counted in the header."""
    with pytest.raises(ConfigError) as caught:
        load_config(files.write("server:\n  http_port: abc\n  max_request_size: 12XB\n"))
    assert "(2 problems)" in caught.value.message.splitlines()[0]
    assert [line.split(":")[0] for line in problems(caught)] == [
        "server.http_port",
        "server.max_request_size",
    ]


def test_min_batch_above_max_batch_message(files: ConfigFiles) -> None:
    """The report names both min_batch and max_batch values."""
    text = STRATEGIES + "    - {name: dynamic_batching, min_batch: 8, max_batch: 4}\n"
    with pytest.raises(ConfigError, match=r"min_batch \(8\) is larger than max_batch \(4\)"):
        load_config(files.write(text))


def test_fallback_chain_may_name_undeclared_devices(files: ConfigFiles) -> None:
    """A fallback_chain naming devices not declared under devices loads (issue 31): the
    names resolve by rule when the chain is built (tests/execution/test_undeclared_devices.py)."""
    text = STRATEGIES + "    - {name: fallback_chain, primary: cuda, fallbacks: [cpu]}\n"
    config = load_config(files.write(text))
    assert config.device("cuda") is None and config.device("cpu") is None
    chain = config.scheduler.fallback_chain
    assert chain is not None and chain.chain == ("cuda", "cpu")


def test_malformed_switch_threshold_message(files: ConfigFiles) -> None:
    """A switch threshold that does not parse is refused with the valid form."""
    text = (
        "devices: [{name: a}, {name: b}]\n"
        + STRATEGIES
        + "    - {name: fallback_chain, primary: a, fallbacks: [b],\n"
        + "       switch_threshold: 'errors>5%'}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(files.write(text))
    assert problems(caught)[0].startswith(
        "scheduler.strategies.0.switch_threshold: switch threshold 'errors>5%': unknown metric "
        "'errors'"
    )


def test_unknown_strategy_message_lists_names(files: ConfigFiles) -> None:
    """An unknown strategy name lists the valid ones."""
    with pytest.raises(ConfigError) as caught:
        load_config(files.write(STRATEGIES + "    - name: round_robin\n"))
    assert problems(caught) == [
        "scheduler.strategies.0: unknown strategy name 'round_robin'; valid names: "
        "dynamic_batching, stream_priority, fallback_chain (got 'round_robin') [line 3]"
    ]


def test_missing_key_message(files: ConfigFiles) -> None:
    """A missing required key is named."""
    with pytest.raises(ConfigError, match="rules: missing required key 'rules'"):
        load_config(files.write(STRATEGIES + "    - name: stream_priority\n"))


# --- validate_config and per-model files --------------------------------------------------


def test_validate_config_from_mapping() -> None:
    """validate_config validates a parsed mapping and leaves it untouched."""
    data: dict[str, object] = {"server": {"http_port": 0}}
    assert validate_config(data).server.http_port == 0
    assert data == {"server": {"http_port": 0}}


def test_validate_config_raises_config_error() -> None:
    """validate_config reports problems the same way as load_config."""
    with pytest.raises(ConfigError, match=r"invalid configuration \(1 problem\):\n  server.port"):
        validate_config({"server": {"port": 1}})


def test_model_config_file_in_triton_vocabulary(files: ConfigFiles, tmp_path: Path) -> None:
    """A repository config.yaml with Triton keys loads; name and path may be omitted."""
    path = files.write(
        "platform: onnxruntime_onnx\n"
        "max_batch_size: 16\n"
        "instance_group: [{count: 2, kind: KIND_CPU}]\n"
        "dynamic_batching:\n"
        "  preferred_batch_size: [4, 8]\n"
        "  max_queue_delay_microseconds: 100\n"
        "version_policy: {specific: {versions: [1, 3]}}\n",
        "config.yaml",
    )
    model = load_model_config_file(path)
    assert (model.name, model.path, model.instance_count) == (None, None, 2)
    assert model.dynamic_batching.preferred_batch_size == (4, 8)
    assert model.version_policy.select([1, 2, 3]) == (1, 3)


def test_model_config_file_errors_name_the_file(files: ConfigFiles) -> None:
    """Problems in a per-model file are reported with that file and the key."""
    path = files.write("max_queue_delay_microseconds: -1\n", "config.yaml")
    with pytest.raises(ConfigError) as caught:
        load_model_config_file(path)
    assert str(path) in caught.value.message.splitlines()[0]
    assert problems(caught)[0].startswith("dynamic_batching.max_queue_delay_microseconds:")


# --- secrets are never echoed ------------------------------------------------------------

AWS_ID = "AKIA-EXAMPLE-KEY"


def test_a_credential_under_any_key_is_hidden(files: ConfigFiles) -> None:
    """The drill's case: a config.yaml holding a credential where a setting was expected."""
    path = files.write(f"backend: {AWS_ID}\nmax_batch_size: {AWS_ID}\n", "config.yaml")
    with pytest.raises(ConfigError) as caught:
        load_model_config_file(path)
    message = caught.value.message
    assert AWS_ID not in message and "AKIA" not in message
    assert "backend:" in message and "max_batch_size:" in message
    assert "(got <hidden: 16 characters>)" in message


def test_the_value_of_a_secret_key_is_hidden(files: ConfigFiles) -> None:
    """A too short admin token is reported by its length, never shown."""
    with pytest.raises(ConfigError) as caught:
        load_config(files.write("server:\n  admin_token: hunter2\n"))
    (line,) = problems(caught)
    assert "hunter2" not in line
    assert line.startswith("server.admin_token: String should have at least 8 characters")
    assert "(got <hidden: 7 characters>)" in line


def test_secrets_inside_a_whole_section_are_hidden(files: ConfigFiles) -> None:
    """When the value shown is a mapping, the secrets inside it are hidden one by one."""
    assert shown_value({"token": "abc", "n": 1}) == "{'token': <hidden: 3 characters>, 'n': 1}"
    assert shown_value(["ghp_" + "a1B2" * 6]) == "[<hidden: 28 characters>]"
    assert shown_value("abc", key="api_key") == "<hidden: 3 characters>"
    assert shown_value("resnet50-v2") == "'resnet50-v2'"


@pytest.mark.parametrize(
    "value",
    [
        AWS_ID, "AKIAIOSFODNN7EXAMPLE", "ghp_" + "x" * 36, "xoxb-1234-5678-abcdefgh",
        "sk-" + "a" * 40, "-----BEGIN RSA PRIVATE KEY-----", "https://user:pa55word@host/x",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY",
    ],
)  # fmt: skip
def test_credential_shapes_look_secret(value: str) -> None:
    assert looks_secret(value)


@pytest.mark.parametrize(
    "value",
    [
        "digits-classifier", "distilbert-base-uncased-finetuned-sst-2-english", "/models/a/b.onnx",
        "CUDAExecutionProvider", "round_robin", "64MB", "0.0.0.0", "~/.sordino",
    ],
)  # fmt: skip
def test_ordinary_values_do_not_look_secret(value: str) -> None:
    assert not looks_secret(value)


def test_secret_keys() -> None:
    names = ["admin_token", "password", "aws_secret_access_key", "api_key", "apiKey", "key"]
    assert all(secret_key(name) for name in names)
    assert not any(secret_key(name) for name in ["http_port", "keep_alive", "name", "monkeys"])


# --- the reference documentation ---------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def doc_yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.DOTALL)


def test_docs_complete_example_loads(files: ConfigFiles) -> None:
    """The complete example in docs/configuration.md is a valid configuration."""
    (example,) = [block for block in doc_yaml_blocks() if block.startswith("server:")]
    config = load_config(files.write(example))
    assert config.models[0].execution_providers[0] == "CUDAExecutionProvider"


def test_docs_triton_example_loads(files: ConfigFiles) -> None:
    """The Triton-style config.yaml in docs/configuration.md is a valid model config."""
    (example,) = [block for block in doc_yaml_blocks() if "platform: onnxruntime_onnx" in block]
    assert load_model_config_file(files.write(example, "config.yaml")).instance_count == 2
