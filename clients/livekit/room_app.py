"""A minimal LiveKit room app for dreamrt (docs/livekit.md, "Using dreamrt from LiveKit").

It joins a room as a viewer, asks a dreamrt server to create a session that joins the same
room, prints the video's fps and the session's acks, sends a prompt (and, with ``--audio``, a
second of microphone-like audio), then deletes the session::

    LIVEKIT_API_KEY=devkey LIVEKIT_API_SECRET=secret \\
    python -m clients.livekit.room_app --dreamrt http://127.0.0.1:8000 \\
        --livekit ws://127.0.0.1:7880 --room demo --prompt "a desert at noon"

Wire: the session's video is the track of participant ``dreamrt-<session id>``; control
messages (the JSON of the WebRTC ``control`` channel) go to it as data packets on topic
``dreamrt.control``, and its acks come back to the sender on the same topic.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import secrets
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from livekit import api, rtc

from clients.python.api import DreamrtClient

__all__ = ["RoomReport", "main", "run"]

CONTROL_TOPIC = "dreamrt.control"


@dataclass
class RoomReport:
    session_id: str = ""
    profile: dict[str, int] = field(default_factory=dict)  # fps, width, height
    frame_times_s: list[float] = field(default_factory=list)
    frame_timestamps_us: list[int] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    audio_seconds_sent: float = 0.0

    def fps(self, window_s: float) -> float:
        """Frames per second over the last ``window_s`` seconds of video received."""
        times = self.frame_times_s
        if len(times) < 2:
            return 0.0
        recent = [t for t in times if t >= times[-1] - window_s]
        span = recent[-1] - recent[0]
        return (len(recent) - 1) / span if span > 0 else 0.0

    def acks(self, seq: int) -> list[str]:
        return [e["type"] for e in self.events if e.get("seq") == seq]


def viewer_token(key: str, secret: str, room: str, identity: str) -> str:
    grants = api.VideoGrants(room_join=True, room=room, can_publish=True, can_publish_data=True)
    return api.AccessToken(key, secret).with_identity(identity).with_grants(grants).to_jwt()


async def run(
    *,
    dreamrt_url: str,
    livekit_url: str,
    room_name: str,
    api_key: str,
    api_secret: str,
    prompt: str = "a desert at noon",
    seconds: float = 4.0,
    send_audio: bool = False,
    dreamrt_token: str | None = None,
    verbose: bool = True,
) -> RoomReport:
    """Runs the demo and returns what it saw (the integration test asserts on it)."""
    report = RoomReport()
    room = rtc.Room()
    first_frame = asyncio.Event()
    said = print if verbose else (lambda *a, **k: None)
    tasks: list[asyncio.Task[None]] = []

    async def watch(track: rtc.Track) -> None:
        async for event in rtc.VideoStream(track):
            report.frame_times_s.append(time.monotonic())
            report.frame_timestamps_us.append(event.timestamp_us)
            first_frame.set()

    @room.on("track_subscribed")
    def on_track(track: rtc.Track, pub: Any, participant: rtc.RemoteParticipant) -> None:
        if track.kind == rtc.TrackKind.KIND_VIDEO and participant.identity.startswith("dreamrt-"):
            tasks.append(asyncio.create_task(watch(track)))

    @room.on("data_received")
    def on_data(packet: rtc.DataPacket) -> None:
        if packet.topic != CONTROL_TOPIC:
            return
        event = json.loads(packet.data)
        report.events.append(event)
        if event["type"] != "media.chunk":
            said(f"  <- {event['type']} {json.dumps(event)[:120]}")

    identity = f"viewer-{secrets.token_hex(3)}"
    await room.connect(livekit_url, viewer_token(api_key, api_secret, room_name, identity))
    said(f"joined room {room_name!r} as {identity}")
    async with DreamrtClient(dreamrt_url, token=dreamrt_token) as client:
        created = await client.create_session(
            prompt, livekit={"url": livekit_url, "room": room_name}
        )
        report.session_id = sid = created["id"]
        report.profile = created["profile"]
        engine = f"dreamrt-{sid}"
        said(f"session {sid} created; waiting for {engine}'s video")
        try:
            await asyncio.wait_for(first_frame.wait(), 60)
            said("first frame received")
            text = json.dumps({"type": "prompt", "text": "a sea at dusk"})
            await room.local_participant.publish_data(
                text, topic=CONTROL_TOPIC, destination_identities=[engine]
            )
            if send_audio:
                report.audio_seconds_sent = await _send_tone(room, 1.0)
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                await asyncio.sleep(1.0)
                said(f"  fps {report.fps(2.0):5.1f}  frames {len(report.frame_times_s)}")
        finally:
            with contextlib.suppress(Exception):  # the session may have ended already
                await client.delete_session(sid)
    for task in tasks:
        task.cancel()
    await room.disconnect()
    return report


async def _send_tone(room: rtc.Room, seconds: float) -> float:
    """Publishes a 440 Hz tone as a microphone track (what the session hears)."""
    rate = 16_000
    source = rtc.AudioSource(rate, 1)
    track = rtc.LocalAudioTrack.create_audio_track("mic", source)
    options = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)
    await room.local_participant.publish_track(track, options)
    block = rate // 100  # 10 ms
    for i in range(int(seconds * 100)):
        t = (np.arange(block) + i * block) / rate
        pcm = (0.3 * 32767 * np.sin(2 * math.pi * 440 * t)).astype(np.int16)
        await source.capture_frame(rtc.AudioFrame(pcm.tobytes(), rate, 1, block))
    await source.wait_for_playout()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dreamrt", default="http://127.0.0.1:8000")
    parser.add_argument("--livekit", default=os.environ.get("LIVEKIT_URL", "ws://127.0.0.1:7880"))
    parser.add_argument("--room", default="dreamrt-demo")
    parser.add_argument("--prompt", default="a desert at noon")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--audio", action="store_true", help="also publish 1 s of audio")
    parser.add_argument("--token", default=None, help="dreamrt API token (token auth)")
    args = parser.parse_args(argv)
    key, secret = os.environ.get("LIVEKIT_API_KEY"), os.environ.get("LIVEKIT_API_SECRET")
    if not key or not secret:
        sys.stderr.write("set LIVEKIT_API_KEY and LIVEKIT_API_SECRET\n")
        return 2
    report = asyncio.run(
        run(
            dreamrt_url=args.dreamrt,
            livekit_url=args.livekit,
            room_name=args.room,
            api_key=key,
            api_secret=secret,
            prompt=args.prompt,
            seconds=args.seconds,
            send_audio=args.audio,
            dreamrt_token=args.token,
        )
    )
    print(
        f"session {report.session_id}: {len(report.frame_times_s)} frames, "
        f"{report.fps(2.0):.1f} fps; prompt acks {report.acks(1)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
