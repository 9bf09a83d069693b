"""The web page against the real server, in Debian's Chromium.

One server subprocess and one browser page per module: the page starts a session through its
own UI, then each test drives one feature and checks only the events that follow its own
action, so the tests do not depend on each other's order. A screenshot of the live page goes to
``test-artifacts/browser-live.png``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import sync_playwright

from infra.browser_harness import (
    ChromiumMissingError,
    ServerProcess,
    launch_chromium,
    require_chromium,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts"
PROMPT = "a quiet harbour town at dusk, lanterns on the water"
FRAMES_DECODED_JS = """async () => {
    const report = await window.dreamrt.pc.getStats();
    for (const s of report.values()) if (s.type === 'inbound-rtp' && s.kind === 'video') return s.framesDecoded;
    return 0;
}"""

# True once the page's events after index `since` contain an input.received of `kind` and the
# `applied` event with the same seq: the two-phase ack of an input this page sent.
ACKED_JS = """([since, kind, applied]) => {
    const events = window.dreamrt.events.slice(since);
    const seqs = new Set(events.filter((e) => e.type === 'input.received' && e.kind === kind).map((e) => e.seq));
    return events.some((e) => e.type === applied && seqs.has(e.seq));
}"""


@pytest.fixture(scope="module")
def chromium() -> str:
    """Checked before the server starts, so a missing browser fails fast with the fix."""
    try:
        return require_chromium()
    except ChromiumMissingError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("browser-e2e")
    with ServerProcess(root / "data", root / "server.log") as proc:
        yield proc


@pytest.fixture(scope="module")
def live_page(
    chromium: str, server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """The page, started through its prompt box, once it shows decoded frames."""

    errors: list[str] = []
    with sync_playwright() as playwright:
        try:
            context = launch_chromium(
                playwright, tmp_path_factory.mktemp("chromium-profile"), executable_path=chromium
            )
        except ChromiumMissingError as exc:
            pytest.fail(str(exc))
        page = context.pages[0] if context.pages else context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{server.url}/")
        page.wait_for_function("window.dreamrt !== undefined")
        page.fill("#prompt", PROMPT)
        page.click("#prompt-submit")
        try:
            page.wait_for_function("window.dreamrt.state === 'live'", timeout=60_000)
        except PlaywrightTimeoutError:
            state = page.evaluate(
                "[window.dreamrt.state, document.getElementById('state-detail').textContent]"
            )
            pytest.fail(f"the page did not go live: {state}\nserver log:\n{server.log_tail()}")
        yield page
        # End the session through the page, as a user would; the server must see the DELETE.
        session_id, token = page.evaluate(
            "[window.dreamrt.session.id, window.dreamrt.session.info.token]"
        )
        page.click("#end-session")
        page.wait_for_function("window.dreamrt.state === 'closed'")
        context.close()
    assert errors == [], f"uncaught errors in the page: {errors}"
    answer = httpx.get(
        f"{server.url}/v1/sessions/{session_id}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=5.0,
    )
    assert answer.status_code == 404 or answer.json()["state"] in ("closing", "closed"), answer.text


def _new_events_since(page: Any) -> int:
    return int(page.evaluate("window.dreamrt.events.length"))


def _wait_acked(
    page: Any, since: int, kind: str, applied: str, server: ServerProcess, timeout_ms: int = 20_000
) -> None:
    try:
        page.wait_for_function(ACKED_JS, arg=[since, kind, applied], timeout=timeout_ms)
    except PlaywrightTimeoutError:
        types = page.evaluate(
            f"window.dreamrt.events.slice({since}).map((e) => e.type + (e.kind ? ':' + e.kind : ''))"
        )
        pytest.fail(
            f"no {applied} for a {kind} input within {timeout_ms} ms; events: {types[-40:]}\n"
            f"server log:\n{server.log_tail()}"
        )


def _wait_decoded(page: Any, count: int, timeout_s: float = 60.0) -> int:
    """Waits until the page decoded ``count`` more video frames; returns how many it did. The
    stream going on is the claim: ``timeout_s`` only bounds a frozen one (rates are measured by
    infra/bench/browser_latency.py, not here)."""
    start = page.evaluate(FRAMES_DECODED_JS)
    deadline = time.monotonic() + timeout_s
    while (decoded := page.evaluate(FRAMES_DECODED_JS) - start) < count:
        assert time.monotonic() < deadline, f"{decoded} of {count} frames decoded in {timeout_s} s"
        page.wait_for_timeout(100)
    return decoded


def test_debian_chromium_is_installed() -> None:
    try:
        require_chromium()
    except ChromiumMissingError as exc:
        pytest.fail(str(exc))


def test_stream_decodes_frames(live_page: Any) -> None:
    fps = live_page.evaluate("window.dreamrt.session.info.profile.fps")
    assert fps > 0
    _wait_decoded(live_page, 3 * fps)  # three seconds of media
    live_page.wait_for_function("document.getElementById('stat-fps').textContent !== '–'")


def test_typed_prompt_is_applied(live_page: Any, server: ServerProcess) -> None:
    since = _new_events_since(live_page)
    live_page.fill("#prompt", "the same harbour under falling snow")
    live_page.press("#prompt", "Enter")
    _wait_acked(live_page, since, "prompt", "prompt.applied", server)
    live_page.wait_for_function(
        "document.getElementById('event-log').textContent.includes('prompt.applied')"
    )
    # The stats card shows the measured prompt -> applied latency at its next refresh (1 s).
    live_page.wait_for_function(
        "document.getElementById('stat-prompt-latency').textContent.endsWith('ms')"
    )
    # ... and, once its first frame went on the wire, where that prompt's time went
    live_page.wait_for_function(
        "document.getElementById('latency-caption').textContent.startsWith('last prompt:')"
    )
    bar = live_page.evaluate(
        """() => [...document.querySelectorAll('#latency-bar span')].map(
            (s) => [s.dataset.segment, Number(s.style.flexGrow)])"""
    )
    assert [name for name, _ in bar] == ["wait", "generate", "send"]
    # the page rounds each share to 6 decimals: three of them sum to 1 within 1.5e-6
    assert abs(sum(grow for _, grow in bar) - 1.0) <= 2e-6 and bar[1][1] > 0, bar


def test_held_key_is_applied(live_page: Any, server: ServerProcess) -> None:
    since = _new_events_since(live_page)
    sent_before = live_page.evaluate("window.dreamrt.app.actions.sentCount")
    live_page.focus("#stage")
    live_page.keyboard.down("d")
    try:
        _wait_acked(live_page, since, "action", "action.applied", server)
        # a held key is sent again and again (its period is the page's, unit-tested on a fake
        # clock in tests/clients/test_web_modules.py), not once
        live_page.wait_for_function(
            f"window.dreamrt.app.actions.sentCount >= {sent_before + 5}", timeout=30_000
        )
    finally:
        live_page.keyboard.up("d")
    live_page.wait_for_function(
        "document.getElementById('stat-action-latency').textContent.endsWith('ms')"
    )


def test_microphone_audio_reaches_the_session(live_page: Any, server: ServerProcess) -> None:
    """Chromium's fake microphone, held on push-to-talk, arrives as session audio input."""
    transport = live_page.evaluate(
        "window.dreamrt.app.talk ? window.dreamrt.app.talk.transport.name : null"
    )
    assert transport in ("track", "http"), (
        f"push-to-talk has no transport: {live_page.text_content('#talk-transport')}"
    )
    since = _new_events_since(live_page)
    live_page.focus("#stage")
    live_page.keyboard.down(" ")
    try:
        live_page.wait_for_function(
            "document.getElementById('talk').getAttribute('aria-pressed') === 'true'"
        )
        live_page.wait_for_function(
            """(since) => window.dreamrt.events.slice(since).some((e) => e.type === 'input.received' && e.kind === 'audio')""",
            arg=since,
            timeout=20_000,
        )
    except PlaywrightTimeoutError:
        types = live_page.evaluate(
            f"window.dreamrt.events.slice({since}).map((e) => e.type + (e.kind ? ':' + e.kind : ''))"
        )
        pytest.fail(
            f"no audio input reached the session over {transport}; events: {types[-40:]}\n"
            f"server log:\n{server.log_tail()}"
        )
    finally:
        live_page.keyboard.up(" ")
    live_page.wait_for_function(
        "document.getElementById('talk').getAttribute('aria-pressed') === 'false'"
    )
    # The server's own counter (GET /v1/sessions/{id}: audio_seconds_in) saw the microphone too.
    session_id, token = live_page.evaluate(
        "[window.dreamrt.session.id, window.dreamrt.session.info.token]"
    )
    snapshot = httpx.get(
        f"{server.url}/v1/sessions/{session_id}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=5.0,
    ).json()
    assert snapshot["audio_seconds_in"] > 0, snapshot


def _served_card(server: ServerProcess) -> dict[str, Any]:
    cards = httpx.get(f"{server.url}/v1/models", timeout=5.0).json()["data"]
    return next(card for card in cards if card["served"])


def test_page_speaks_the_served_cards_language(live_page: Any, server: ServerProcess) -> None:
    card = _served_card(server)
    assert card["examples"] and card["controls"], card
    live_page.wait_for_selector("#examples button.chip")
    chips = live_page.eval_on_selector_all(
        "#examples button.chip", "buttons => buttons.map(b => b.textContent)"
    )
    assert chips == card["examples"]
    placeholder = live_page.get_attribute("#prompt", "placeholder")
    assert placeholder is not None and placeholder.endswith(card["examples"][0])
    legend = live_page.eval_on_selector_all(
        "#controls-legend li", "items => items.map(li => [li.dataset.kind, li.textContent])"
    )
    assert [kind for kind, _ in legend] == [c["kind"] for c in card["controls"]]
    assert all(text.endswith(c["does"]) for (_, text), c in zip(legend, card["controls"]))
    # Only the keycaps of inputs the card obeys are shown (tiny-world ignores Q, E and the mouse).
    shown = set(
        live_page.eval_on_selector_all(
            ".keycap", "caps => caps.filter(c => !c.hidden).map(c => c.dataset.key)"
        )
    )
    keys = {k for c in card["controls"] if c["kind"] == "key" for k in c["inputs"]}
    assert keys <= shown
    assert ("talk" in shown) == any(c["kind"] == "audio" for c in card["controls"])
    assert ("drag" in shown) == any(c["kind"] == "mouse" for c in card["controls"])


def test_example_chip_while_live_is_sent_as_a_prompt(live_page: Any, server: ServerProcess) -> None:
    example = _served_card(server)["examples"][1]
    since = _new_events_since(live_page)
    live_page.click("#examples button.chip:nth-child(2)")
    assert live_page.input_value("#prompt") == example
    _wait_acked(live_page, since, "prompt", "prompt.applied", server)
    applied = live_page.evaluate(
        f"window.dreamrt.events.slice({since}).filter((e) => e.type === 'prompt.applied')"
    )
    assert [e["text"] for e in applied][-1] == example


def test_empty_start_on_a_fresh_page_uses_the_first_example(
    live_page: Any, server: ServerProcess
) -> None:
    first = _served_card(server)["examples"][0]
    fresh = live_page.context.new_page()
    try:
        fresh.goto(f"{server.url}/")
        fresh.wait_for_selector("#examples button.chip")
        assert fresh.input_value("#prompt") == ""
        fresh.click("#prompt-submit")
        fresh.wait_for_function(
            "window.dreamrt.session && window.dreamrt.session.id", timeout=30_000
        )
        session_id, token = fresh.evaluate(
            "[window.dreamrt.session.id, window.dreamrt.session.info.token]"
        )
        snapshot = httpx.get(
            f"{server.url}/v1/sessions/{session_id}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=5.0,
        ).json()
        assert snapshot["prompt"] == first and fresh.input_value("#prompt") == first
        fresh.click("#end-session")
        fresh.wait_for_function("window.dreamrt.state === 'closed'")
    finally:
        fresh.close()


def test_fork_picker_plays_the_candidates_live_and_chooses(
    live_page: Any, server: ServerProcess
) -> None:
    """Fork into 2: both candidates play in the picker (their own peers), the parent waits
    paused; choosing one makes the page's own stream go on from it."""
    since = _new_events_since(live_page)
    session_id, token = live_page.evaluate(
        "[window.dreamrt.session.id, window.dreamrt.session.info.token]"
    )
    auth = {"Authorization": f"Bearer {token}"}
    live_page.select_option("#fork select[name=fork-n]", "2")
    live_page.click("#fork button[type=submit]")
    try:
        live_page.wait_for_function(
            "[...document.querySelectorAll('#fork .fork-candidate video')].length === 2 && "
            "[...document.querySelectorAll('#fork .fork-candidate video')].every("
            "(v) => !v.hidden && v.videoWidth > 0 && v.currentTime > 0.3)",
            timeout=45_000,
        )
    except PlaywrightTimeoutError:
        status = live_page.text_content("#fork .fork-status")
        pytest.fail(f"the candidates did not play: {status!r}\n{server.log_tail()}")
    ids = live_page.eval_on_selector_all(
        "#fork .fork-candidate", "rows => rows.map((r) => r.dataset.candidate)"
    )
    parent = httpx.get(f"{server.url}/v1/sessions/{session_id}", headers=auth, timeout=5).json()
    assert parent["state"] == "paused" and len(ids) == 2
    live_page.click("#fork .fork-candidate:nth-child(2) button.primary")
    live_page.wait_for_function(
        "document.querySelector('#fork .fork-status').dataset.tone === 'good'", timeout=20_000
    )
    live_page.wait_for_function(
        "(since) => window.dreamrt.events.slice(since).some("
        "(e) => e.type === 'session.state' && e.state === 'live')",
        arg=since,
        timeout=20_000,
    )
    live_page.wait_for_function("window.dreamrt.state === 'live'", timeout=20_000)
    fps = live_page.evaluate("window.dreamrt.session.info.profile.fps")
    # the stream goes on: a loop left paused or a stale anchor would freeze it
    _wait_decoded(live_page, 2 * fps)
    chunks = live_page.evaluate(
        "(since) => window.dreamrt.events.slice(since).filter((e) => e.type === 'media.chunk')"
        ".map((e) => e.chunk)",
        since,
    )
    assert chunks and all(b > a for a, b in zip(chunks, chunks[1:])), chunks
    states = [httpx.get(f"{server.url}/v1/sessions/{c}", timeout=5).json()["state"] for c in ids]
    assert set(states) <= {"closing", "closed"}, states
    assert live_page.get_attribute("#fork .fork-candidate:nth-child(2)", "class").endswith("chosen")


def test_screenshot_shows_the_stream_and_controls(live_page: Any) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    live_page.focus("#stage")
    live_page.keyboard.down("w")
    live_page.wait_for_timeout(600)
    path = ARTIFACTS / "browser-live.png"
    try:
        live_page.screenshot(path=str(path), full_page=True)
    finally:
        live_page.keyboard.up("w")
    assert path.stat().st_size > 20_000
    assert live_page.evaluate("document.getElementById('video').videoWidth") > 0
    assert live_page.get_attribute("body", "data-state") == "live"
    for control in (
        "#prompt",
        "#prompt-submit",
        "#talk",
        "#rate-up",
        "#rate-down",
        "#fork",
        "#event-log",
    ):
        assert live_page.is_visible(control), control


WHEP_CLIENT_JS = """async (endpoint) => {
    const pc = new RTCPeerConnection({iceServers: []});
    pc.addTransceiver('video', {direction: 'recvonly'});
    const channel = pc.createDataChannel('control');
    const pongs = [];
    channel.onmessage = (m) => {
        const e = JSON.parse(m.data);
        if (e.type === 'pong') pongs.push(e.t);
    };
    channel.onopen = () => channel.send(JSON.stringify({type: 'ping', t: 7}));
    await pc.setLocalDescription(await pc.createOffer());
    // the server does not trickle: send the offer once every candidate is in it
    await new Promise((resolve) => {
        if (pc.iceGatheringState === 'complete') return resolve();
        pc.addEventListener('icegatheringstatechange', () => {
            if (pc.iceGatheringState === 'complete') resolve();
        });
    });
    const res = await fetch(endpoint, {
        method: 'POST',
        headers: {'Content-Type': 'application/sdp'},
        body: pc.localDescription.sdp,
    });
    if (res.status !== 201) {
        throw new Error('WHEP POST answered ' + res.status + ': ' + await res.text());
    }
    const location = new URL(res.headers.get('Location'), endpoint).href;
    await pc.setRemoteDescription({type: 'answer', sdp: await res.text()});
    window.whep = {
        pc, pongs, location,
        session: res.headers.get('Dreamrt-Session-Id'),
        etag: res.headers.get('ETag'),
        stop: async () => (await fetch(location, {method: 'DELETE'})).status,
    };
    return window.whep.session;
}"""

WHEP_FRAMES_DECODED_JS = """async () => {
    const report = await window.whep.pc.getStats();
    for (const s of report.values()) {
        if (s.type === 'inbound-rtp' && s.kind === 'video') return s.framesDecoded;
    }
    return 0;
}"""


def test_a_fetch_based_whep_client_plays_and_delete_ends_it(
    live_page: Any, server: ServerProcess
) -> None:
    """Chromium as a standard WHEP player (no page code of ours): a small client written here
    POSTs its offer from another origin (localhost, not 127.0.0.1: every request is CORS)."""
    page = live_page.context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"http://localhost:{server.port}/healthz")
        endpoint = f"{server.url}/whep/tiny-world?prompt=a%20red%20kite&seed=3"
        session_id = page.evaluate(WHEP_CLIENT_JS, endpoint)
        page.wait_for_function(f"({WHEP_FRAMES_DECODED_JS})().then((n) => n >= 5)", timeout=30_000)
        page.wait_for_function("window.whep.pongs.includes(7)", timeout=10_000)
        status = page.evaluate("window.whep.stop()")
        # DELETE has answered: the session the player made has ended already
        row = httpx.get(f"{server.url}/v1/sessions/{session_id}", timeout=10)
    finally:
        page.close()
    assert errors == [], errors
    assert status == 200
    assert row.json()["state"] == "closed", row.text
