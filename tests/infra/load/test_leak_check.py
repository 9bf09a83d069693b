"""The soak's leak check: growth after the first idle checkpoint, not the warm-up's."""

from __future__ import annotations

from infra.load.leak_check import THREAD_SLACK, Checkpoint, leak_verdict

BASE = Checkpoint(0, 0, 340.0, 12, 11)


def test_warm_up_growth_before_the_first_checkpoint_passes() -> None:
    # caches and pools filled in the first segment (+12 %), flat after it: no leak
    marks = [Checkpoint(1, 60, 381.0, 12, 15), Checkpoint(2, 120, 383.0, 12, 15)]
    verdict = leak_verdict(BASE, marks, Checkpoint(3, 180, 384.0, 11, 15))
    assert verdict["ok"], verdict
    assert verdict["rss_vs_baseline"] > 1.1  # reported, not judged
    assert verdict["rss_mib_per_100_sessions"] == round(100 * 3.0 / 120, 2)


def test_growth_with_the_load_after_the_first_checkpoint_fails() -> None:
    marks = [Checkpoint(1, 60, 381.0, 12, 15), Checkpoint(2, 120, 396.0, 12, 15)]
    verdict = leak_verdict(BASE, marks, Checkpoint(3, 180, 411.0, 12, 15))  # +15 MiB a segment
    assert not verdict["ok"]
    assert verdict["rss_mib_per_segment"] == 15.0


def test_left_peers_fail_and_no_checkpoints_judge_from_the_baseline() -> None:
    marks = [Checkpoint(1, 60, 381.0, 12, 15)]
    assert not leak_verdict(BASE, marks, Checkpoint(2, 120, 381.0, 12, 15, clean=False))["ok"]
    assert not leak_verdict(BASE, [], Checkpoint(1, 60, 381.0, 12, 11))["ok"]  # x1.12 of 340
    assert leak_verdict(BASE, [], Checkpoint(1, 60, 350.0, 12, 11))["ok"]


def test_threads_may_grow_by_the_slack_not_more() -> None:
    marks = [Checkpoint(1, 60, 381.0, 12, 12)]
    assert leak_verdict(BASE, marks, Checkpoint(2, 120, 381.0, 12, 12 + THREAD_SLACK))["ok"]
    assert not leak_verdict(BASE, marks, Checkpoint(2, 120, 381.0, 12, 13 + THREAD_SLACK))["ok"]
