import subprocess
import sys

import pytest

from server.cli import _build_parser, main


def test_models_prints_one_summary_line_per_card_and_labels_random_weights(capsys) -> None:
    from models import registry

    assert main(["models"]) == 0
    # One unindented summary line per card; its examples and controls follow indented.
    lines = [
        line for line in capsys.readouterr().out.strip().splitlines() if not line.startswith(" ")
    ]
    cards = registry.list_cards()
    assert len(lines) == len(cards)
    for card, line in zip(cards, lines):
        assert line.startswith(card.summary_line())
        assert line.endswith("(random weights)") == (card.weights.value == "random")
    assert any(
        line.startswith("wan-tiny-random") and "profile=64x64@8fps" in line for line in lines
    )


def test_models_prints_each_cards_examples_and_controls(capsys) -> None:
    from models import registry

    assert main(["models"]) == 0
    out = capsys.readouterr().out.splitlines()
    for card in registry.list_cards():
        at = next(i for i, line in enumerate(out) if line.startswith(card.model_id + " "))
        detail = []
        for line in out[at + 1 :]:
            if not line.startswith("    "):
                break
            detail.append(line.strip())
        assert detail[0] == "examples: " + " | ".join(card.ui.examples)
        assert detail[1:] == [c.describe() for c in card.ui.controls]
    assert "    examples: a red ball on grass | a blue square on snow at night" in "\n".join(out)
    assert "    audio talk: the sprite pulses with your voice" in out


def test_serve_refuses_no_auth_on_a_public_address() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", "serve", "--host", "0.0.0.0", "--auth", "none"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "--force-no-auth" in result.stderr


def test_parser_knows_every_api_command_and_option() -> None:
    parser = _build_parser()
    serve = parser.parse_args(
        [
            "serve",
            "--ice-host",
            "127.0.0.1",
            "--ice-host",
            "10.0.0.1",
            "--max-sessions",
            "2",
            "--bitrate",
            "800000",
            "--deterministic",
            "--compile",
            "--attention",
            "fp8-triton",
            "--cuda-graphs",
            "--no-warmup",
            "--log-level",
            "warning",
        ]
    )
    assert (
        serve.ice_host == ["127.0.0.1", "10.0.0.1"]
        and serve.max_sessions == 2
        and serve.deterministic
        and serve.compile
        and serve.attention == "fp8-triton"
        and serve.cuda_graphs
        and serve.no_warmup
    )
    watch = parser.parse_args(
        ["watch", "http://h:1", "--seconds", "2", "--out", "a.mp4", "--action", "w", "a"]
    )
    assert watch.action == ["w", "a"] and watch.seconds == 2.0 and str(watch.out) == "a.mp4"
    job = parser.parse_args(
        ["job", "http://h:1", "--task", "t2v", "--prompt", "p", "--num-frames", "9"]
    )
    assert (job.task, job.num_frames) == ("t2v", 9)


def test_bench_runs_a_benchmark_and_passes_its_arguments(tmp_path, capsys) -> None:
    from server.cli import main

    out = tmp_path / "overhead.json"
    code = main(
        ["bench", "scheduler-overhead", "--rounds", "1", "--plans", "50", "--json", str(out)]
    )
    assert code == 0
    table = capsys.readouterr().out
    assert "| loops |" in table and "| 64 |" in table
    assert out.is_file() and out.stat().st_size > 0


def test_bench_rejects_an_unknown_name(capsys) -> None:
    import pytest

    from server.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "warp-speed"])
    assert exc.value.code == 2
    assert "invalid choice: 'warp-speed'" in capsys.readouterr().err


def _capture_serve(monkeypatch) -> list:
    """``dreamrt serve`` builds its app and server, which are captured instead of run."""
    from server.ops.shutdown import GracefulServer

    served = []

    def run(self, *args, **kwargs) -> None:
        served.append(self._app)
        self.started = True

    monkeypatch.setattr(GracefulServer, "run", run)
    return served


def test_serve_takes_a_scheduling_policy(monkeypatch) -> None:
    from runtime.policies import SCHEDULER_POLICIES
    from server.cli import SCHEDULERS

    assert SCHEDULERS == SCHEDULER_POLICIES
    parser = _build_parser()
    assert parser.parse_args(["serve"]).scheduler == "step-edf"
    for name in SCHEDULERS:
        assert parser.parse_args(["serve", "--scheduler", name]).scheduler == name
    served = _capture_serve(monkeypatch)
    assert main(["serve", "--scheduler", "chunk-rr", "--port", "9"]) == 0
    assert served[0].state.config.engine.scheduler == "chunk-rr"


def test_serve_rejects_an_unknown_scheduler(capsys) -> None:
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        _build_parser().parse_args(["serve", "--scheduler", "round-robin"])
    assert exit_info.value.code == 2 and "step-edf" in capsys.readouterr().err


def test_serve_takes_the_latency_mode_and_the_steering_path(monkeypatch) -> None:
    served = _capture_serve(monkeypatch)
    assert main(["serve", "--port", "9"]) == 0
    default = served[0].state.config.flat()
    assert (default["shutdown_timeout_s"], default["resume_grace_s"]) == (10.0, 120.0)
    assert (default["chunk_frames"], default["random_weights"]) == (None, False)
    assert default["steering"] == "fast"
    argv = ["serve", "--chunk-frames", "1", "--random-weights", "--steering", "baseline"]
    argv += ["--shutdown-timeout", "4", "--resume-grace", "0"]
    assert main([*argv, "--port", "9"]) == 0
    config = served[1].state.config
    assert (config.model.chunk_frames, config.model.random_weights) == (1, True)
    assert config.engine.steering == "baseline"
    assert (config.shutdown_timeout_s, config.recording.resume_grace_s) == (4.0, 0.0)


def test_serve_takes_the_fleet_options_and_router_its_own(monkeypatch, tmp_path) -> None:
    import uvicorn

    from server.ops.shutdown import GracefulServer

    served: list[tuple[object, dict]] = []

    def run(self, *args, **kwargs) -> None:  # the engine's server, captured instead of run
        served.append((self._app, {"loop": self.config.loop}))
        self.started = True

    monkeypatch.setattr(GracefulServer, "run", run)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.append((app, kwargs)))
    shared = tmp_path / "shared"
    argv = ["serve", "--fleet", "prod", "--fleet-discovery", "etcd", "--snapshot-dir", str(shared)]
    assert main([*argv, "--engine-id", "n1-gpu0", "--public-url", "https://n1:8000"]) == 0
    fleet = served[0][0].state.config.fleet
    assert (fleet.namespace, fleet.discovery) == ("prod", "etcd")
    assert served[0][0].state.config.recording.snapshot_dir == shared
    assert (fleet.engine_id, fleet.public_url) == ("n1-gpu0", "https://n1:8000")
    assert served[0][1]["loop"] == "asyncio"  # uvloop (from the fleet extra) is not picked up
    assert main(["router", "--fleet", "prod", "--port", "8088", "--key", "k" * 32]) == 0
    router_app, kwargs = served[1]
    assert router_app.title == "dreamrt router" and kwargs["port"] == 8088


def test_serve_enables_extensions_and_refuses_bad_ones(monkeypatch, capsys) -> None:
    served = _capture_serve(monkeypatch)
    assert main(["serve", "--extension", "fbcache:threshold=0.05", "--port", "9"]) == 0
    assert served[0].state.config.model.extensions == ("fbcache:threshold=0.05",)
    assert main(["serve", "--extension", "taylorseer"]) == 2
    assert "unknown extension 'taylorseer'" in capsys.readouterr().err
    assert main(["serve", "--extension", "fbcache:threshold=-1"]) == 2
    assert "threshold" in capsys.readouterr().err
    assert len(served) == 1


def test_serve_takes_the_admission_cost(monkeypatch, capsys) -> None:
    served = _capture_serve(monkeypatch)
    assert main(["serve", "--port", "9"]) == 0
    assert main(["serve", "--port", "9", "--admission-cost", "measured"]) == 0
    assert [app.state.config.engine.admission_cost for app in served] == ["auto", "measured"]
    with pytest.raises(SystemExit):
        main(["serve", "--admission-cost", "fast"])
    assert "--admission-cost" in capsys.readouterr().err


def test_serve_takes_the_compute_capacity_and_cross_session_batching(monkeypatch) -> None:
    served = _capture_serve(monkeypatch)
    assert main(["serve", "--port", "9"]) == 0
    assert (
        main(["serve", "--port", "9", "--compute-capacity", "0.8", "--batch-sessions", "on"]) == 0
    )
    assert main(["serve", "--port", "9", "--batch-sessions", "off"]) == 0
    configs = [app.state.config for app in served]
    assert [c.engine.compute_capacity for c in configs] == [None, 0.8, None]
    assert [c.engine.batch_sessions for c in configs] == ["auto", "on", "off"]


def test_serve_takes_the_chunk_restart_policy_and_the_instance_serves_it(
    monkeypatch, tmp_path
) -> None:
    from server import spmd_serving
    from server.config.serve import ServerConfig

    served = _capture_serve(monkeypatch)
    assert main(["serve", "--port", "9", "--chunk-restart", "cuts-only"]) == 0
    assert served[0].state.config.engine.chunk_restart == "cuts-only"
    policies = {}
    for steering, restart in (
        ("fast", "auto"),
        ("baseline", "auto"),
        ("fast", "cuts-only"),
        ("baseline", "regenerate-when-sooner"),
    ):
        config = ServerConfig.of(
            data_dir=tmp_path, device="cpu", steering=steering, chunk_restart=restart
        )
        _, instance = spmd_serving.load(config, "wan-tiny-random")
        policies[steering, restart] = instance.chunk_restart.name
    assert policies == {
        ("fast", "auto"): "regenerate-when-sooner",
        ("baseline", "auto"): "cuts-only",
        ("fast", "cuts-only"): "cuts-only",  # the restart apart from the rest of fast steering
        ("baseline", "regenerate-when-sooner"): "regenerate-when-sooner",
    }
