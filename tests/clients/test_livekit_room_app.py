from clients.livekit.room_app import RoomReport, viewer_token


def test_report_fps_counts_the_last_window_and_acks_follow_a_seq() -> None:
    report = RoomReport(frame_times_s=[i / 10 for i in range(31)])  # 10 fps for 3 s
    assert abs(report.fps(2.0) - 10.0) < 1e-9
    assert RoomReport(frame_times_s=[1.0]).fps(2.0) == 0.0
    report.events = [
        {"type": "input.received", "seq": 1},
        {"type": "media.chunk", "chunk": 0},
        {"type": "prompt.applied", "seq": 1},
        {"type": "input.received", "seq": 2},
    ]
    assert report.acks(1) == ["input.received", "prompt.applied"]


def test_viewer_token_joins_the_room_and_may_publish() -> None:
    from livekit import api

    key, secret = "devkey", "a-secret-long-enough-for-hs256-signing"
    claims = api.TokenVerifier(key, secret).verify(viewer_token(key, secret, "demo", "v1"))
    assert claims.identity == "v1" and claims.video.room == "demo"
    assert claims.video.room_join and claims.video.can_publish_data
