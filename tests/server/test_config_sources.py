"""``dreamrt serve``'s settings from flags, ``DREAMRT_*`` and a TOML file (server.config.sources):
the three build the same ``ServerConfig``, the precedence is flags > env > file > defaults, and
a bad value is refused naming the setting and its source."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.config.fields import ConfigError
from server.config.limits import Limits
from server.config.serve import ServerConfig
from server.config.sources import load_config, settings

# one value away from the default for a setting of every kind: str, int, float, bool, Path,
# an optional, a list, a negated switch, a group's key unlike its field (model, fleet) and a
# limit with a flag unlike its key
FLAGS = [
    "--host", "0.0.0.0", "--port", "9001", "--model", "wan-tiny-random", "--device", "cpu",
    "--data-dir", "/srv/dreamrt", "--ice-host", "10.0.0.1", "--ice-host", "10.0.0.2",
    "--bitrate", "800000", "--deterministic", "--no-warmup", "--max-batch", "3",
    "--steering", "baseline", "--snapshot-mbps", "12.5", "--fleet", "prod",
    "--fleet-dir", "/srv/fleet", "--control-rate", "7.5", "--max-prompt-chars", "100",
]  # fmt: skip
ENV = {
    "DREAMRT_HOST": "0.0.0.0",
    "DREAMRT_PORT": "9001",
    "DREAMRT_MODEL": "wan-tiny-random",
    "DREAMRT_DEVICE": "cpu",
    "DREAMRT_DATA_DIR": "/srv/dreamrt",
    "DREAMRT_ICE_HOSTS": '["10.0.0.1", "10.0.0.2"]',
    "DREAMRT_VIDEO_BITRATE_BPS": "800000",
    "DREAMRT_DETERMINISTIC": "true",
    "DREAMRT_WARMUP": "0",
    "DREAMRT_MAX_BATCH": "3",
    "DREAMRT_STEERING": "baseline",
    "DREAMRT_SNAPSHOT_MBPS": "12.5",
    "DREAMRT_FLEET": "prod",
    "DREAMRT_FLEET_DIR": "/srv/fleet",
    "DREAMRT_CONTROL_RATE_PER_S": "7.5",
    "DREAMRT_MAX_PROMPT_CHARS": "100",
}
TOML = """
host = "0.0.0.0"
port = 9001
data_dir = "/srv/dreamrt"
ice_hosts = ["10.0.0.1", "10.0.0.2"]
video_bitrate_bps = 800000

[model]
model = "wan-tiny-random"
device = "cpu"
warmup = false

[engine]
deterministic = true
max_batch = 3
steering = "baseline"

[recording]
snapshot_mbps = 12.5

[fleet]
fleet = "prod"
fleet_dir = "/srv/fleet"

[limits]
control_rate_per_s = 7.5
max_prompt_chars = 100
"""


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dreamrt.toml"
    path.write_text(text)
    return path


def test_flags_env_and_file_build_the_same_config(tmp_path: Path) -> None:
    from_flags = load_config(FLAGS, environ={})
    from_env = load_config([], environ=ENV)
    from_file = load_config(["--config", str(_file(tmp_path, TOML))], environ={})
    assert from_flags == from_env == from_file
    assert from_flags != ServerConfig()
    assert from_flags.model.card == "wan-tiny-random" and from_flags.model.warmup is False
    assert from_flags.fleet.discovery_dir == Path("/srv/fleet")
    assert from_flags.limits == Limits(control_rate_per_s=7.5, max_prompt_chars=100)
    assert from_flags.ice_hosts == ("10.0.0.1", "10.0.0.2")


def test_every_setting_has_one_flag_one_variable_and_one_key() -> None:
    every = [s for s in settings().values() if s.flag is not None]
    assert len({s.flag for s in every}) == len({s.env for s in every}) == len(every)
    # no flag and no default lost from the hand-written parser this replaced
    by_flag = {s.flag: s for s in every}
    for flag, default in {
        "--port": 8000,
        "--max-sessions": 4,
        "--unwatched-timeout": 300.0,
        "--shutdown-timeout": 10.0,
        "--resume-grace": 120.0,
        "--snapshot-every": 8,
        "--snapshot-keep-gb": 8.0,
        "--scheduler": "step-edf",
        "--admission-cost": "auto",
        "--max-queued-jobs": 16,
        "--idle-timeout": 3600.0,
    }.items():
        assert by_flag[flag].default == default, flag
    assert load_config([], environ={}) == ServerConfig()


def test_flags_override_env_which_overrides_the_file(tmp_path: Path) -> None:
    path = _file(tmp_path, "max_sessions = 2\nmax_batch = 5\n[engine]\nscheduler = 'fifo'\n")
    env = {"DREAMRT_CONFIG": str(path), "DREAMRT_MAX_BATCH": "6", "DREAMRT_SCHEDULER": "chunk-rr"}
    config = load_config(["--scheduler", "step-edf"], environ=env)
    assert (config.engine.max_sessions, config.engine.max_batch) == (2, 6)
    assert config.engine.scheduler == "step-edf"
    assert load_config([], environ=env).engine.scheduler == "chunk-rr"
    unrelated = {"DREAMRT_DEBUG_MEMORY": "1", "DREAMRT_ROUTER_KEY": "x"}  # not settings
    assert load_config([], environ=unrelated) == ServerConfig()


@pytest.mark.parametrize(
    ("flags", "env", "toml", "message"),
    [
        ([], {"DREAMRT_PORT": "eighty"}, None, r"\$DREAMRT_PORT: 'eighty' is not a valid int"),
        ([], {"DREAMRT_STEERING": "slow"}, None, "steering='slow'; expected one of fast"),
        ([], {"DREAMRT_COMPILE": "maybe"}, None, "DREAMRT_COMPILE"),
        ([], {}, "[engine]\nmax_sesions = 2\n", r"\[engine\] has no setting 'max_sesions'"),
        ([], {}, "colour = 'red'\n", "unknown setting 'colour'"),
        ([], {}, "port = '80'\n", "'port': '80' is not a int"),
        ([], {}, "port = [", "config file"),
        (["--max-sessions", "0"], {}, None, "max_sessions must be >= 1"),
        (["--max-prompt-chars", "0"], {}, None, "max_prompt_chars must be >= 1"),
    ],
)
def test_a_bad_value_names_the_setting_and_its_source(
    tmp_path: Path, flags: list, env: dict, toml: str | None, message: str
) -> None:
    if toml is not None:
        flags = [*flags, "--config", str(_file(tmp_path, toml))]
    with pytest.raises(ConfigError, match=message):
        load_config(flags, environ=env)


def test_a_missing_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nowhere.toml"):
        load_config(["--config", str(tmp_path / "nowhere.toml")], environ={})


def test_serve_reads_the_environment_and_refuses_a_bad_value(monkeypatch, capsys) -> None:
    from server.cli import main
    from server.ops.shutdown import GracefulServer

    served = []

    def run(self, *args, **kwargs) -> None:
        served.append(self._app)
        self.started = True

    monkeypatch.setattr(GracefulServer, "run", run)
    monkeypatch.setenv("DREAMRT_MAX_SESSIONS", "3")
    assert main(["serve", "--port", "9"]) == 0
    assert served[0].state.config.engine.max_sessions == 3
    monkeypatch.setenv("DREAMRT_MAX_SESSIONS", "three")
    assert main(["serve", "--port", "9"]) == 2
    assert "$DREAMRT_MAX_SESSIONS" in capsys.readouterr().err


def test_the_configuration_doc_lists_every_setting() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for s in settings().values():
        if s.flag is not None:
            assert f"| `{s.key}` |" in doc and f"`{s.env}`" in doc, s.key
