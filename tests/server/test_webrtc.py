import asyncio

import aioice.ice
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from server.media.webrtc import (
    OfferError,
    ViewerPeer,
    configure_video_bitrate,
    ice_server,
    restrict_host_candidates,
    video_codec_preferences,
)
from sessions.session import Session, SessionConfig
from tests.sessions.fakes import FakeHandle


def make_session(capabilities=frozenset({"prompt.switch"})) -> Session:
    config = SessionConfig(
        session_id="s1",
        model_id="m",
        prompt="p",
        seed=0,
        fps=8,
        width=64,
        height=64,
        priority_class="realtime",
        capabilities=capabilities,
    )
    session = Session(config, media_capacity_frames=32)
    session.attach(FakeHandle())
    return session


def test_codec_preferences_put_vp8_first_then_h264_baseline() -> None:
    prefs = video_codec_preferences()
    names = [(c.mimeType, c.parameters.get("profile-level-id")) for c in prefs]
    assert names[:3] == [("video/VP8", None), ("video/H264", "42e01f"), ("video/H264", "42001f")]
    assert names[-1][0] == "video/rtx"


def test_bitrate_and_host_restriction_are_undoable() -> None:
    from aiortc.codecs import h264, vpx

    before = (vpx.DEFAULT_BITRATE, vpx.MAX_BITRATE, h264.DEFAULT_BITRATE)
    undo = configure_video_bitrate(300_000)
    assert (vpx.DEFAULT_BITRATE, vpx.MAX_BITRATE, h264.MAX_BITRATE) == (300_000, 300_000, 300_000)
    undo()
    assert (vpx.DEFAULT_BITRATE, vpx.MAX_BITRATE, h264.DEFAULT_BITRATE) == before
    with pytest.raises(ValueError):
        configure_video_bitrate(0)
    original = aioice.ice.get_host_addresses
    undo = restrict_host_candidates(["127.0.0.1", "::1"])
    assert aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=False) == ["127.0.0.1"]
    assert aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True) == ["127.0.0.1", "::1"]
    undo()
    assert aioice.ice.get_host_addresses is original


async def offer_sdp(
    *, audio: bool, video: str | None = "recvonly"
) -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no STUN: nothing outside
    if video is not None:
        pc.addTransceiver("video", direction=video)
    if audio:
        pc.addTransceiver("audio", direction="sendonly")
    pc.createDataChannel("control")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


def media_section(sdp: str, kind: str) -> str:
    return next(s for s in sdp.split("m=")[1:] if s.startswith(kind))


async def test_answer_sends_vp8_video_on_loopback_and_declines_audio_without_the_capability(
    monkeypatch,
) -> None:
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])
    session = make_session()
    client, sdp = await offer_sdp(audio=True)
    peer = ViewerPeer(session, store=None)
    session.begin_negotiation()
    answer = await peer.answer(sdp)
    video, audio = media_section(answer.sdp, "video"), media_section(answer.sdp, "audio")
    assert "a=sendonly" in video
    first_payload = video.split("\r\n")[0].split()[3]
    assert f"a=rtpmap:{first_payload} VP8/90000" in video
    assert "a=inactive" in audio
    candidates = [line for line in answer.sdp.splitlines() if line.startswith("a=candidate")]
    assert candidates and all(" 127.0.0.1 " in line for line in candidates)
    await peer.close()
    await peer.close()
    await client.close()
    assert session.state.value == "paused"  # the viewer left: generation waits for a new offer
    await session.close()


async def test_audio_capable_session_receives_the_audio_m_line(monkeypatch) -> None:
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])
    session = make_session(frozenset({"prompt.switch", "input.audio"}))
    client, sdp = await offer_sdp(audio=True)
    peer = ViewerPeer(session, store=None)
    answer = await peer.answer(sdp)
    assert "a=recvonly" in media_section(answer.sdp, "audio")
    await asyncio.gather(peer.close(), client.close())
    await session.close()


@pytest.mark.parametrize(
    ("sdp", "message"),
    [
        ("v=0\r\n", "no video m-line"),
        ("v=0\r\nm=video garbage\r\n", "cannot answer"),
    ],
)
async def test_unanswerable_offers_are_offer_errors(sdp: str, message: str) -> None:
    session = make_session()
    peer = ViewerPeer(session, store=None)
    with pytest.raises(OfferError, match=message):
        await peer.answer(sdp)
    await peer.close()
    await session.close()


async def test_a_sendonly_video_offer_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])
    session = make_session()
    client, sdp = await offer_sdp(audio=False, video="sendonly")
    peer = ViewerPeer(session, store=None)
    with pytest.raises(OfferError, match="recvonly"):
        await peer.answer(sdp)
    await asyncio.gather(peer.close(), client.close())
    await session.close()


def test_ice_server_urls_carry_turn_credentials() -> None:
    stun = ice_server("stun:stun.example.com:3478")
    assert stun.urls == "stun:stun.example.com:3478" and stun.username is None
    turn = ice_server("turn:alice:s3cr:et@turn.example.com:3478?transport=udp")
    assert turn.urls == "turn:turn.example.com:3478?transport=udp"
    assert (turn.username, turn.credential) == ("alice", "s3cr:et")
