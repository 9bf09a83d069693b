import pytest

from sessions.playout import Playout


def test_anchor_follows_the_real_playout_and_fps_counts_fresh_frames() -> None:
    now = [10.0]
    playout = Playout(8, clock=lambda: now[0])
    assert playout.anchor_at(0) == 10.0
    assert playout.shown(0, 10.0) is None  # on time: no move
    assert playout.shown(11250, 10.125 + 0.03) is None  # within half a frame
    assert playout.shown(None, 10.25) is None  # a stall
    moved = playout.shown(22500, 10.6)  # 0.35 s late after the stall: re-anchor
    assert moved == pytest.approx(10.6 - 0.25)
    assert (playout.frames_sent, playout.stalls) == (4, 1)
    now[0] = 10.6
    assert playout.fps_measured() == pytest.approx(2 / 0.6)
    assert playout.anchor_at(45000) == pytest.approx(10.1)


def test_window_forgets_old_frames_and_fps_is_validated() -> None:
    now = [0.0]
    playout = Playout(10, clock=lambda: now[0], window_s=1.0)
    for i in range(30):
        now[0] = i / 10
        playout.shown(i * 9000, now[0])
    assert playout.fps_measured() == pytest.approx(10.0)
    now[0] = 10.0
    assert playout.fps_measured() < 1.0  # nothing fresh for seconds
    with pytest.raises(ValueError, match="fps"):
        Playout(0, clock=lambda: 0.0)
