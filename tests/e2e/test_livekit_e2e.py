"""A real LiveKit room: runs when LIVEKIT_URL, LIVEKIT_API_KEY and LIVEKIT_API_SECRET are set
(e.g. ``livekit-server --dev``: ws://127.0.0.1:7880, devkey/secret); skipped otherwise.

A real ``dreamrt serve`` subprocess joins the room for a session; a second participant (the
SDK, ``clients.livekit.room_app``) receives its video, sends a prompt and audio.
"""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients.livekit.room_app import run
from infra.browser_harness import ServerProcess

pytestmark = pytest.mark.slow

_ENV = ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET")
_MISSING = [name for name in _ENV if not os.environ.get(name)]
if _MISSING:
    print(f"LiveKit integration tests skipped: {', '.join(_MISSING)} not set")
    pytestmark = [
        pytest.mark.slow,
        pytest.mark.skip(reason=f"no LiveKit server: set {', '.join(_MISSING)}"),
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("livekit")
    srv = ServerProcess(tmp / "data", tmp / "server.log").start()  # keys from the environment
    yield srv
    srv.stop(timeout_s=20.0)
    log = Path(srv.log_path).read_text(errors="replace")
    assert "Traceback" not in log, log[-6000:]


async def test_a_room_participant_sees_the_session_and_steers_it(server: ServerProcess) -> None:
    report = await run(
        dreamrt_url=server.url,
        livekit_url=os.environ["LIVEKIT_URL"],
        room_name=f"dreamrt-test-{os.getpid()}",
        api_key=os.environ["LIVEKIT_API_KEY"],
        api_secret=os.environ["LIVEKIT_API_SECRET"],
        seconds=3.0,
        send_audio=True,
        verbose=False,
    )
    # frames arrive and their media timestamps go forward (the room's fps is a benchmark's)
    stamps = report.frame_timestamps_us
    assert len(stamps) > report.profile["fps"], f"{len(stamps)} frames"
    assert stamps == sorted(stamps) and stamps[-1] - stamps[0] >= 1_000_000
    assert report.acks(1)[:1] == ["input.received"] and "prompt.applied" in report.acks(1)
    assert report.audio_seconds_sent == 1.0
