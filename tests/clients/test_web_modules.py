"""The web page's ES modules, unit-tested in Debian's Chromium (no server: a static file server).

Each test imports the real modules from ``clients/web`` into a page and checks their outputs on
hand-built inputs: ack matching, configuration parsing, SDP inspection, PCM conversion, the
action sender's rate (on Playwright's fake clock) and release, the page state machine and the event log's filtering.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.browser_harness import ChromiumMissingError, launch_chromium

pytestmark = [pytest.mark.browser]

WEB_ROOT = Path(__file__).resolve().parents[2] / "clients" / "web"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def static_url() -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(WEB_ROOT))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def page(static_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as playwright:
        try:
            context = launch_chromium(playwright, tmp_path_factory.mktemp("chromium-profile"))
        except ChromiumMissingError as exc:
            pytest.fail(str(exc))
        page = context.pages[0] if context.pages else context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{static_url}/index.html")
        page.wait_for_function("window.dreamrt !== undefined")
        yield page
        context.close()
    assert errors == [], f"uncaught errors in the page: {errors}"


def test_idle_page_renders_start_state(page: Any) -> None:
    assert page.evaluate("window.dreamrt.state") == "idle"
    assert page.text_content("#prompt-submit") == "Start"
    assert page.get_attribute("body", "data-state") == "idle"
    assert (
        page.is_disabled("#talk")
        and page.is_disabled("#rate-up")
        and page.is_disabled("#prompt-cut")
    )


def test_ack_tracker_matches_received_and_applied_by_seq(page: Any) -> None:
    result = page.evaluate(
        """async () => {
        const { AckTracker } = await import('/ack_tracker.js');
        let t = 0;
        const acks = new AckTracker({ now: () => t });
        const out = [];
        // The session's initial prompt (seq 0) was not sent by this page: ignored.
        out.push(acks.observe({ type: 'input.received', seq: 0, kind: 'prompt' }));
        out.push(acks.observe({ type: 'prompt.applied', seq: 0, chunk: 0, pts: 0 }));
        acks.noteSent('action'); t = 10; acks.noteSent('prompt'); t = 20; acks.noteSent('action');
        t = 25; acks.observe({ type: 'input.received', seq: 1, kind: 'action' });
        t = 26; acks.observe({ type: 'input.received', seq: 2, kind: 'prompt' });
        t = 27; acks.observe({ type: 'input.received', seq: 3, kind: 'action' });
        t = 300; out.push(acks.observe({ type: 'action.applied', seq: 3, chunk: 4, pts: 18000 }));
        t = 410; out.push(acks.observe({ type: 'prompt.applied', seq: 2, chunk: 5, pts: 22500 }));
        const pendingAfter = acks.pendingCount;
        acks.noteSent('cut');
        t = 415; acks.observe({ type: 'input.received', seq: 4, kind: 'prompt' });  // a cut is a prompt
        t = 500; out.push(acks.observe({ type: 'prompt.applied', seq: 4, chunk: 6, pts: 27000, mode: 'cut' }));
        acks.noteSent('action');
        t = 505; acks.observe({ type: 'input.received', seq: 5, kind: 'action' });
        acks.observe({ type: 'input.superseded', seq: 5, kind: 'action', by_seq: 6 });
        return { out, pendingAfter, pendingEnd: acks.pendingCount, summary: acks.summary(), last: acks.lastApplied };
    }"""
    )
    assert result["out"] == [
        None,
        None,
        {"kind": "action", "latencyMs": 280},  # seq 3 sent at t=20; seq 1 (t=0) superseded with it
        {"kind": "prompt", "latencyMs": 400},
        {"kind": "cut", "latencyMs": 90},  # sent at t=410
    ]
    assert result["pendingAfter"] == 0
    assert result["pendingEnd"] == 0
    # action receipts: 25, 7 and 5 ms -> median 7
    assert result["summary"]["action"] == {"received": 7, "applied": 280, "count": 1}
    assert result["summary"]["prompt"] == {"received": 16, "applied": 400, "count": 1}
    assert result["last"]["pts"] == 27000 and result["last"]["chunk"] == 6


def test_ack_tracker_rejects_unknown_kind(page: Any) -> None:
    message = page.evaluate(
        """async () => {
        const { AckTracker } = await import('/ack_tracker.js');
        try { new AckTracker().noteSent('telepathy'); return 'no error'; } catch (err) { return err.message; }
    }"""
    )
    assert "telepathy" in message and "prompt" in message


def test_config_parses_ice_servers_and_rejects_bad_values(page: Any) -> None:
    result = page.evaluate(
        """async () => {
        const { parseIceServers, readConfig } = await import('/config.js');
        const errorOf = (fn) => { try { fn(); return null; } catch (err) { return [err.name, err.field, err.message]; } };
        const storage = { getItem: () => JSON.stringify({ ice: 'stun:stored', key: 'k1' }) };
        return {
            empty: parseIceServers(''),
            urls: parseIceServers('stun:a.example:3478, turn:b.example'),
            json: parseIceServers('[{"urls":"turn:t","username":"u","credential":"c"}]'),
            badJson: errorOf(() => parseIceServers('[oops')),
            badShape: errorOf(() => parseIceServers('[{"url":"x"}]')),
            badAudio: errorOf(() => readConfig('?audio=carrier-pigeon', storage)),
            stored: readConfig('?prompt=hi&autostart=1', storage),
            query: readConfig('?ice=&key=k2&audio=http&api=http://h:1/', storage),
        };
    }"""
    )
    assert result["empty"] == []
    assert result["urls"] == [{"urls": "stun:a.example:3478"}, {"urls": "turn:b.example"}]
    assert result["json"] == [{"urls": "turn:t", "username": "u", "credential": "c"}]
    assert result["badJson"][:2] == ["ConfigError", "ice"]
    assert result["badShape"][:2] == ["ConfigError", "ice"]
    assert (
        result["badAudio"][:2] == ["ConfigError", "audio"]
        and "carrier-pigeon" in result["badAudio"][2]
    )
    stored = result["stored"]
    assert (stored["prompt"], stored["autostart"], stored["iceServers"], stored["apiKey"]) == (
        "hi",
        True,
        [{"urls": "stun:stored"}],
        "k1",
    )
    query = result["query"]
    assert (query["iceServers"], query["apiKey"], query["audioTransport"], query["apiBase"]) == (
        [],
        "k2",
        "http",
        "http://h:1",
    )


def test_the_page_offers_the_cards_decoders_and_names_the_sessions(page: Any) -> None:
    result = page.evaluate(
        """async () => {
        const { decoderChoices, describeSession } = await import('/model_guide.js');
        const { readConfig } = await import('/config.js');
        const both = { id: 'm', decoders: ['full', 'tiny'], default_decoder: 'tiny' };
        const errorOf = (fn) => { try { fn(); return null; } catch (err) { return [err.name, err.field]; } };
        const storage = { getItem: () => null };
        return {
            both: decoderChoices(both),
            wanted: decoderChoices(both, 'full'),
            unknown: decoderChoices(both, 'huge'),
            one: decoderChoices({ id: 'm', decoders: ['full'], default_decoder: 'full' }, 'tiny'),
            old: decoderChoices({ id: 'm' }),
            line: describeSession({ profile: { width: 832, height: 480, fps: 16 }, decoder: 'tiny' }),
            plain: describeSession({ profile: { width: 64, height: 64, fps: 8 } }),
            none: describeSession({}),
            config: readConfig('?decoder=tiny', storage).decoder,
            unset: readConfig('', storage).decoder,
            bad: errorOf(() => readConfig('?decoder=huge', storage)),
        };
    }"""
    )
    assert result["both"] == {"options": ["full", "tiny"], "selected": "tiny"}
    assert result["wanted"]["selected"] == "full" and result["unknown"]["selected"] == "tiny"
    assert result["one"] == {"options": [], "selected": "full"}  # nothing to pick
    assert result["old"] == {"options": [], "selected": ""}
    assert result["line"] == "832×480 @ 16 fps · tiny decoder"
    assert result["plain"] == "64×64 @ 8 fps" and result["none"] == ""
    assert (result["config"], result["unset"], result["bad"]) == (
        "tiny",
        "",
        ["ConfigError", "decoder"],
    )


def test_answer_audio_acceptance_reads_the_audio_section(page: Any) -> None:
    result = page.evaluate(
        """async () => {
        const { answerAcceptsAudio } = await import('/peer.js');
        const head = 'v=0\\r\\no=- 1 1 IN IP4 0.0.0.0\\r\\ns=-\\r\\nt=0 0\\r\\n';
        const video = 'm=video 9 UDP/TLS/RTP/SAVPF 96\\r\\na=sendonly\\r\\n';
        return [
            answerAcceptsAudio(head + video + 'm=audio 9 UDP/TLS/RTP/SAVPF 111\\r\\na=recvonly\\r\\n'),
            answerAcceptsAudio(head + video + 'm=audio 0 UDP/TLS/RTP/SAVPF 0\\r\\na=inactive\\r\\n'),
            answerAcceptsAudio(head + video + 'm=audio 9 UDP/TLS/RTP/SAVPF 111\\r\\na=inactive\\r\\n'),
            answerAcceptsAudio(head + video),
        ];
    }"""
    )
    assert result == [True, False, False, False]


def test_float_to_s16le_clamps_and_is_little_endian(page: Any) -> None:
    result = page.evaluate(
        """async () => {
        const { floatToS16le } = await import('/microphone.js');
        return Array.from(floatToS16le(new Float32Array([0, 1, -1, 0.5, 2, -3])));
    }"""
    )
    # 0, 32767, -32768, 16383, clamp(2)=32767, clamp(-3)=-32768 as little-endian byte pairs
    assert result == [0, 0, 0xFF, 0x7F, 0x00, 0x80, 0xFF, 0x3F, 0xFF, 0x7F, 0x00, 0x80]


@pytest.fixture
def clocked_page(page: Any, static_url: str) -> Iterator[Any]:
    """A page of the same origin on Playwright's fake clock: its timers and ``performance.now``
    move only when the test runs the clock, so rates are exact whatever the machine's load.

    ``install`` alone leaves the fake clock following the wall clock (a loaded CI machine once
    saw 23 ticks in a "second"); ``pause_at`` stops it, and from then on only ``run_for`` moves it.
    """
    clocked = page.context.new_page()
    clocked.clock.install(time=0)
    clocked.goto(f"{static_url}/config.js")  # any same-origin document can import the modules
    clocked.clock.pause_at(3_600_000)  # an hour of page time: past whatever the load took
    yield clocked
    clocked.close()


def test_action_input_sends_at_20_hz_while_held_then_one_release(clocked_page: Any) -> None:
    page = clocked_page
    start = page.evaluate(
        """async () => {
        const { ActionInput } = await import('/action_input.js');
        const keys = document.createElement('div');
        const stage = document.createElement('div');
        const text = document.createElement('textarea');
        keys.append(text);
        document.body.append(keys, stage);
        const sent = [];
        const input = new ActionInput({ send: (m) => { sent.push([performance.now(), m]); return true; },
                                        stage, video: document.createElement('video'), keyTarget: keys });
        input.start();
        input.enabled = true;
        const key = (type, code, target = keys, extra = {}) =>
            target.dispatchEvent(new KeyboardEvent(type, { code, bubbles: true, ...extra }));
        window.__held = { input, key, keys, stage, sent };
        key('keydown', 'KeyW', text);              // typing in a text field: not an action
        key('keydown', 'KeyZ');                    // not an action key
        key('keydown', 'KeyW', keys, { ctrlKey: true });
        const ignored = sent.length;
        key('keydown', 'KeyW');
        const immediate = sent.length;
        key('keydown', 'KeyW', keys, { repeat: true });
        key('keydown', 'ArrowLeft');
        return { ignored, immediate, t0: performance.now() };
    }"""
    )
    page.clock.run_for(1000)  # held for one second of the page's clock
    result = page.evaluate(
        """(t0) => {
        const { input, key, keys, stage, sent } = window.__held;
        const ticks = sent.filter(([t]) => t > t0).length;
        const count = sent.length;
        key('keyup', 'KeyW'); key('keyup', 'ArrowLeft');
        return { ticks, count };
    }""",
        start["t0"],
    )
    page.clock.run_for(200)
    messages = page.evaluate(
        """() => {
        const { input, keys, stage, sent } = window.__held;
        input.stop();
        keys.remove(); stage.remove();
        return sent.map(([, m]) => m);
    }"""
    )
    assert start["ignored"] == 0
    assert start["immediate"] == 1
    assert messages[0] == {"type": "action", "keys": ["w"], "mouse": [0, 0]}
    assert messages[1] == {"type": "action", "keys": ["w", "left"], "mouse": [0, 0]}
    # one message per 50 ms period while held: 20 in the second, all of the held keys
    assert result["ticks"] == 20, result
    assert all(m["keys"] == ["w", "left"] for m in messages[1:-2])
    # Releasing W then Left sends ["left"] then the empty release, and nothing after it.
    assert messages[result["count"] :] == [
        {"type": "action", "keys": ["left"], "mouse": [0, 0]},
        {"type": "action", "keys": [], "mouse": [0, 0]},
    ]


def test_action_input_reports_drag_rate_over_the_chunk_window(clocked_page: Any) -> None:
    page = clocked_page
    page.evaluate(
        """async () => {
        const { ActionInput } = await import('/action_input.js');
        const stage = document.createElement('div');
        document.body.append(stage);
        const sent = [];
        const input = new ActionInput({ send: (m) => { sent.push(m); return true; }, stage,
                                        video: document.createElement('video'), keyTarget: stage, periodMs: 20 });
        input.setMouseWindowMs(150);
        input.start();
        input.enabled = true;
        const pointer = (type, extra = {}) => stage.dispatchEvent(new PointerEvent(type, { pointerId: 7, button: 0, bubbles: true, ...extra }));
        window.__drag = { input, stage, sent, pointer };
        pointer('pointerdown');
        for (let i = 0; i < 3; i += 1) pointer('pointermove', { movementX: 10, movementY: -4 });
    }"""
    )
    page.clock.run_for(50)
    moving = page.evaluate("() => window.__drag.sent.at(-1)")
    page.clock.run_for(250)  # still dragging, no movement for > 150 ms
    page.evaluate(
        """() => {
        const { sent, pointer } = window.__drag;
        window.__drag.resting = sent.at(-1);
        window.__drag.count = sent.length;
        pointer('pointerup');
    }"""
    )
    page.clock.run_for(100)
    result = page.evaluate(
        """() => {
        const { input, stage, sent, resting, count } = window.__drag;
        input.stop();
        stage.remove();
        let bad = null;
        try { input.setMouseWindowMs(0); } catch (err) { bad = err.message; }
        return { resting, release: sent.slice(count), after: sent.length - count, bad };
    }"""
    )
    assert moving == {"type": "action", "keys": [], "mouse": [30, -12]}
    assert result["resting"] == {"type": "action", "keys": [], "mouse": [0, 0]}
    assert result["release"] == [{"type": "action", "keys": [], "mouse": [0, 0]}]
    assert result["after"] == 1
    assert result["bad"] == "mouse window must be > 0 ms, got 0"


def test_page_state_machine_allows_the_table_and_names_illegal_moves(page: Any) -> None:
    result = page.evaluate(
        """async () => {
        const { PageStateMachine, PageState } = await import('/page_state.js');
        const machine = new PageStateMachine();
        const seen = [];
        machine.subscribe((next, previous) => seen.push(`${previous}->${next}`));
        for (const s of ['connecting', 'live', 'paused', 'live', 'error', 'connecting', 'closed']) machine.transition(s);
        let message = null;
        try { machine.transition(PageState.PAUSED); } catch (err) { message = `${err.name}: ${err.message}`; }
        return { seen, message, state: machine.state };
    }"""
    )
    assert result["seen"] == [
        "idle->connecting",
        "connecting->live",
        "live->paused",
        "paused->live",
        "live->error",
        "error->connecting",
        "connecting->closed",
    ]
    assert result["message"] == "StateError: illegal page transition: closed -> paused"
    assert result["state"] == "closed"


def test_event_log_hides_high_rate_events_unless_verbose(page: Any) -> None:
    result = page.evaluate(
        """async () => {
        const { EventLog } = await import('/event_log.js');
        const list = document.createElement('ol');
        const toggle = document.createElement('input');
        toggle.type = 'checkbox';
        document.body.append(list);
        const log = new EventLog(list, { verboseToggle: toggle });
        log.add({ type: 'media.chunk', chunk: 1, pts_start: 0, frames: 4 });
        log.add({ type: 'prompt.applied', seq: 2, chunk: 3, pts: 900, event_id: 7, time_s: 1.5 });
        toggle.checked = true; toggle.dispatchEvent(new Event('change'));
        log.add({ type: 'pong', t: 1 });
        const rows = Array.from(list.children, (li) => [li.className, li.querySelector('.log-type').textContent, li.querySelector('.log-body').textContent]);
        list.remove();
        return { rows, total: log.events.length, hasChunk: log.has('media.chunk') };
    }"""
    )
    assert result["rows"] == [
        ["log-row good in", "prompt.applied", "seq: 2, chunk: 3, pts: 900"],
        ["log-row  in", "pong", "t: 1"],
    ]
    assert result["total"] == 3 and result["hasChunk"] is True


TOY_CARDS = [
    {"id": "other", "served": False, "examples": ["elsewhere"], "controls": []},
    {
        "id": "toy",
        "served": True,
        "examples": ["a red ball on grass", "a blue square on snow"],
        "controls": [
            {"kind": "key", "inputs": ["w", "a", "s", "d"], "does": "move"},
            {"kind": "key", "inputs": ["shift"], "does": "sprint"},
            {"kind": "audio", "inputs": ["talk"], "does": "pulse"},
        ],
    },
]


def test_model_guide_picks_the_served_card_and_its_keycaps(page: Any) -> None:
    result = page.evaluate(
        """async (cards) => {
        const { describeControl, keycapsFor, pickServedCard } = await import('/model_guide.js');
        return {
            byId: pickServedCard(cards, 'other').id,
            byServed: pickServedCard(cards, 'unknown').id,
            none: pickServedCard([], 'toy'),
            notAList: pickServedCard({ detail: 'unauthorized' }, 'toy'),
            caps: [...keycapsFor(cards[1].controls)].sort(),
            mouse: [...keycapsFor([{ kind: 'mouse', inputs: ['drag'], does: 'look' }])],
            lines: cards[1].controls.map(describeControl),
        };
    }""",
        TOY_CARDS,
    )
    assert (result["byId"], result["byServed"]) == ("other", "toy")
    assert result["none"] is None and result["notAList"] is None
    # Arrows come with WASD (the server aliases them); Q, E and drag are not the card's.
    assert result["caps"] == sorted(
        ["w", "a", "s", "d", "up", "left", "down", "right", "shift", "talk"]
    )
    assert result["mouse"] == ["drag"]
    assert result["lines"] == ["W A S D — move", "Shift — sprint", "hold Space — pulse"]


def test_model_guide_renders_chips_that_pick_and_a_legend(page: Any) -> None:
    result = page.evaluate(
        """async (cards) => {
        const { ModelGuide } = await import('/model_guide.js');
        const chips = document.createElement('div');
        chips.hidden = true;
        const legend = document.createElement('ul');
        legend.innerHTML = '<li>generic</li>';
        const picked = [];
        const guide = new ModelGuide({ chips, legend, onPick: (text) => picked.push(text) });
        const before = guide.firstExample;
        guide.render(cards[1]);
        const buttons = [...chips.querySelectorAll('button.chip')];
        buttons[1].click();
        buttons[0].click();
        const shown = {
            before, first: guide.firstExample, hidden: chips.hidden, picked,
            chips: buttons.map((b) => b.textContent),
            legend: [...legend.children].map((li) => [li.dataset.kind, li.textContent]),
        };
        guide.render({ id: 'quiet', examples: ['a calm sea'], controls: [] });
        shown.promptsOnly = [...legend.children].map((li) => li.textContent);
        return shown;
    }""",
        TOY_CARDS,
    )
    assert result["before"] == "" and result["first"] == "a red ball on grass"
    assert result["hidden"] is False
    assert result["chips"] == ["a red ball on grass", "a blue square on snow"]
    assert result["picked"] == ["a blue square on snow", "a red ball on grass"]
    assert result["legend"] == [
        ["key", "WASD / arrows — move"],
        ["key", "Shift — sprint"],
        ["audio", "hold Space — pulse"],
    ]
    assert result["promptsOnly"] == ["quiet takes prompts only."]


def test_empty_start_uses_the_first_example(page: Any) -> None:
    """A fresh page (no API behind the static server, so the session cannot start): an empty
    Start fills the box with the card's first example and starts with it."""
    fresh = page.context.new_page()
    try:
        fresh.goto(page.url)
        fresh.wait_for_function("window.dreamrt !== undefined")
        fresh.evaluate("(cards) => window.dreamrt.guide.render(cards[1])", TOY_CARDS)
        assert fresh.input_value("#prompt") == ""
        fresh.click("#prompt-submit")
        fresh.wait_for_function("window.dreamrt.events.some((e) => e.type === 'page.connecting')")
        connecting = fresh.evaluate(
            "window.dreamrt.events.find((e) => e.type === 'page.connecting')"
        )
        assert connecting["prompt"] == "a red ball on grass"
        assert fresh.input_value("#prompt") == "a red ball on grass"
    finally:
        fresh.close()


def test_latency_bar_splits_the_last_input_into_wait_generate_send(page: Any) -> None:
    result = page.evaluate(
        """async () => {
        const { LatencyBar, breakdown } = await import('/latency_bar.js');
        const shown = (kind, latency) => ({ type: 'input.shown', seq: 3, kind, chunk: 4, pts: 0, latency });
        const full = shown('prompt', { latched_s: 0.04, started_s: 0.05, generated_s: 0.2, decoded_s: 0.21,
                                       enqueued_s: 0.211, sent_s: 0.25, dropped_frames: 3 });
        const repeat = shown('action', { enqueued_s: 0.3, sent_s: 0.32 });  // no runtime stages
        const root = document.createElement('div');
        for (const name of ['wait', 'generate', 'send']) {
            const span = document.createElement('span'); span.dataset.segment = name; root.append(span);
        }
        const caption = document.createElement('p');
        const bar = new LatencyBar(root, caption);
        const drawn = bar.show(full);
        const grows = [...root.children].map((s) => Number(s.style.flexGrow));
        return {
            drawn, grows, caption: caption.textContent, hidden: root.hidden,
            repeat: breakdown(repeat), notSent: breakdown(shown('prompt', { enqueued_s: 0.1 })),
            page: document.getElementById('latency-caption').textContent,
        };
    }"""
    )
    drawn = result["drawn"]
    assert drawn["kind"] == "prompt" and drawn["totalMs"] == 250
    assert [round(drawn[k], 6) for k in ("wait", "generate", "send")] == [50, 160, 40]
    assert [round(g, 3) for g in result["grows"]] == [0.2, 0.64, 0.16] and not result["hidden"]
    assert (
        result["caption"]
        == "last prompt: 250 ms to the wire — wait 50 ms, generate 160 ms, send 40 ms"
    )
    repeat = result["repeat"]
    assert (round(repeat["wait"]), round(repeat["generate"]), round(repeat["send"])) == (0, 300, 20)
    assert result["notSent"] is None
    assert result["page"] == "last input: –"  # the idle page's bar is empty


def test_fork_picker_lays_candidates_side_by_side_and_shows_each_as_it_plays(page: Any) -> None:
    result = page.evaluate(
        """async () => {
        const { ForkPicker } = await import('/fork_picker.js');
        const root = document.createElement('section');
        root.style.width = '320px';
        root.innerHTML = `<form><select name="fork-n"><option selected>2</option></select>
            <input name="fork-prompt" value=""><button type="submit">Fork</button></form>
            <p class="fork-status"></p><ol class="fork-candidates"></ol>`;
        document.body.append(root);
        const opened = [];
        const session = { fork: async (n) => ({
            candidates: ['ses_a', 'ses_b'],
            sessions: [{ id: 'ses_a', token: 'ta' }, { id: 'ses_b', token: 'tb' }] }) };
        const picker = new ForkPicker(root, {
            getSession: () => session,
            openPreview: async (id, video, token) => { opened.push([id, token]); return { close() {} }; },
        });
        await picker.fork();
        const tiles = [...root.querySelectorAll('.fork-candidate')];
        const status = () => root.querySelector('.fork-status').textContent;
        const before = { status: status(), playing: tiles.map((t) => t.dataset.playing) };
        tiles[1].querySelector('video').dispatchEvent(new Event('playing'));
        const one = { status: status(), playing: tiles.map((t) => t.dataset.playing) };
        tiles[0].querySelector('video').dispatchEvent(new Event('playing'));
        const boxes = tiles.map((t) => t.getBoundingClientRect());
        const out = {
            opened, before, one, both: status(),
            hidden: tiles.map((t) => t.querySelector('video').hidden),
            sameRow: boxes[0].top === boxes[1].top, leftToRight: boxes[0].right <= boxes[1].left,
        };
        picker.reset();
        root.remove();
        return out;
    }"""
    )
    assert result["opened"] == [["ses_a", "ta"], ["ses_b", "tb"]]  # both at once, own tokens
    assert result["before"] == {"status": "starting 2 candidates…", "playing": ["false", "false"]}
    # the second one played first: its tile says so without waiting for the other
    assert result["one"] == {
        "status": "1 of 2 candidates playing: choose one",
        "playing": ["false", "true"],
    }
    assert result["both"] == "2 of 2 candidates playing: choose one"
    assert result["hidden"] == [False, False]
    assert result["sameRow"] and result["leftToRight"]  # side by side
