"""``dreamrt train|eval tiny-world`` parse as documented and run end to end."""

from __future__ import annotations

import argparse

import pytest

from models.tinyworld.cli import add_parsers, main


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default="info")
    parser = argparse.ArgumentParser(prog="dreamrt")
    add_parsers(parser.add_subparsers(dest="command", required=True), parents=[common])
    return parser


def test_parsers_take_the_model_id_and_the_hosts_common_options(tmp_path) -> None:
    args = _parser().parse_args(
        [
            "train",
            "tiny-world",
            "--out",
            str(tmp_path),
            "--device",
            "cpu",
            "--budget-s",
            "30",
            "--log-level",
            "debug",
        ]
    )
    assert (args.command, args.model, args.device, args.budget_s) == (
        "train",
        "tiny-world",
        "cpu",
        30.0,
    )
    assert args.log_level == "debug" and callable(args.handler)
    args = _parser().parse_args(["eval", "tiny-world", "--rollouts", "3", "--long-s", "0"])
    assert (args.rollouts, args.long_s, args.chunks, args.device) == (3, 0.0, 18, "cpu")
    with pytest.raises(SystemExit):
        _parser().parse_args(["train", "wan2.1-1.3b-causal", "--out", str(tmp_path)])


def test_train_writes_a_checkpoint(tmp_path, capsys) -> None:
    code = main(
        [
            "train",
            "tiny-world",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
            "--max-steps",
            "2",
            "--batch",
            "2",
            "--preset",
            "tinyworld-test",
            "--size",
            "32",
        ]
    )
    assert code == 0
    assert (tmp_path / "tiny-world.safetensors").is_file()
    assert '"steps": 2' in capsys.readouterr().out


def test_eval_takes_the_lossy_levers_and_refuses_an_unknown_kernel(capsys) -> None:
    args = _parser().parse_args(
        ["eval", "tiny-world", "--device", "cuda", "--attention", "fp8-triton", "--fp8", "row"]
    )
    assert (args.device, args.attention, args.fp8, args.fold) == (
        "cuda",
        "fp8-triton",
        "row",
        False,
    )
    assert _parser().parse_args(["eval", "tiny-world", "--fold"]).fold
    with pytest.raises(SystemExit):
        _parser().parse_args(["eval", "tiny-world", "--fp8", "int4"])
    # an unknown kernel is refused before any rollout runs
    assert main(["eval", "tiny-world", "--attention", "int4", "--rollouts", "1"]) == 2
    assert "attention 'int4' is not one of" in capsys.readouterr().err
