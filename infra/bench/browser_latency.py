"""Browser-side latency of the web page against a real server, measured in Debian's Chromium.

Two figures, each over several repeats, printed as one table (and written as JSON
with ``--json``):

- **page load -> first frame**: navigation start -> the first frame the <video> presents
  (``requestVideoFrameCallback``), for a fresh page that starts its own session
  (``/?prompt=...&autostart=1``); with the page's marks for the steps in between (session
  created, control channel open).
- **action-to-photon**: a real ``keydown`` (Playwright keyboard, event.timeStamp) -> the
  presentation of the first frame whose RTP time is at or after the PTS that ``action.applied``
  names. Also keydown -> ``input.received`` and keydown -> ``action.applied`` at the page.

RTP time -> PTS: the server sends wire PTS = generation PTS (90 kHz from 0, server/media/track.py)
and aiortc adds one random offset per stream, so PTS = RTP - RTP(first frame) when the first
presented frame is the stream's first (PTS 0). The script checks that assumption (the first
callback reports presentedFrames == 1 and no packet was lost) and says so if it does not hold.

    python infra/bench/browser_latency.py [--url http://127.0.0.1:8000] [--loads 3] [--trials 10]

Without ``--url`` it starts ``python -m server serve`` on a free loopback port.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from infra.browser_harness import ServerProcess, launch_chromium

PROMPT = "a quiet harbour town at dusk, lanterns on the water"

STARTUP_JS = """() => {
    const mark = (name) => performance.getEntriesByName(name)[0]?.startTime ?? null;
    const nav = performance.getEntriesByType('navigation')[0];
    const first = window.dreamrt.frames.frames[0];
    return {
        domContentLoadedMs: nav ? nav.domContentLoadedEventEnd : null,
        startMs: mark('dreamrt.start'),
        connectedMs: mark('dreamrt.connected'),
        firstFrameMs: mark('dreamrt.first_frame'),
        firstPresentedMs: window.dreamrt.frames.firstFrameMs,
        firstPresentedFrames: first ? first.presentedFrames : null,
    };
}"""

# Arms one action-to-photon measurement; the result promise is window.__a2p.
ARM_JS = """(code) => {
    const d = window.dreamrt;
    const since = d.events.length;
    let t0 = null;
    const onKey = (e) => { if (e.code === code && t0 === null) t0 = e.timeStamp; };
    window.addEventListener('keydown', onKey, { capture: true });
    window.__a2p = new Promise((resolve, reject) => {
        const deadline = performance.now() + 20000;
        const poll = () => {
            if (performance.now() > deadline) {
                window.removeEventListener('keydown', onKey, { capture: true });
                reject(new Error('no action.applied within 20 s'));
                return;
            }
            const events = d.events.slice(since);
            const received = t0 === null ? null : events.find((e) => e.type === 'input.received' && e.kind === 'action' && e._atMs >= t0);
            const applied = received && events.find((e) => e.type === 'action.applied' && e.seq >= received.seq);
            if (!applied) { setTimeout(poll, 2); return; }
            window.removeEventListener('keydown', onKey, { capture: true });
            d.frames.waitFor((f) => f.atMs >= t0 && f.rtp90k !== null && f.rtp90k >= applied.pts, { includePast: true, timeoutMs: 20000 })
                .then((frame) => resolve({
                    receivedMs: received._atMs - t0,
                    appliedMs: applied._atMs - t0,
                    photonMs: frame.expectedDisplayMs - t0,
                    callbackMs: frame.callbackMs - t0,
                    appliedPts: applied.pts,
                    framePts: frame.rtp90k,
                }), reject);
        };
        poll();
    });
    return true;
}"""

LOSS_JS = """async () => {
    const report = await window.dreamrt.pc.getStats();
    for (const s of report.values()) if (s.type === 'inbound-rtp' && s.kind === 'video') return s.packetsLost;
    return null;
}"""


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {
        "median": statistics.median(ordered),
        "p90": p90,
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


def measure_startup(context: Any, url: str, loads: int) -> list[dict[str, Any]]:
    results = []
    for _ in range(loads):
        page = context.new_page()
        page.goto(f"{url}/?prompt={PROMPT.replace(' ', '+')}&autostart=1")
        page.wait_for_function(
            "performance.getEntriesByName('dreamrt.first_frame').length > 0", timeout=90_000
        )
        results.append(page.evaluate(STARTUP_JS))
        page.evaluate("window.dreamrt.app.end()")  # DELETE, as the End button does
        page.close()
        time.sleep(1.0)  # let the server close the session before the next load
    return results


def measure_action_to_photon(
    context: Any, url: str, trials: int, hold_s: float, settle_s: float
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    page = context.new_page()
    page.goto(f"{url}/?prompt={PROMPT.replace(' ', '+')}&autostart=1")
    page.wait_for_function("window.dreamrt.state === 'live'", timeout=90_000)
    page.wait_for_timeout(2000)  # past start-up transients
    calibration = {
        "firstPresentedFrames": page.evaluate(
            "window.dreamrt.frames.frames[0]?.presentedFrames ?? null"
        ),
        "rtpTimestampSeen": page.evaluate("window.dreamrt.frames.firstRtpTimestamp !== null"),
    }
    page.focus("#stage")
    results = []
    for _ in range(trials):
        page.evaluate(ARM_JS, "KeyD")
        page.keyboard.down("d")
        try:
            results.append(page.evaluate("window.__a2p"))
        finally:
            page.wait_for_timeout(hold_s * 1000)
            page.keyboard.up("d")
        page.wait_for_timeout(settle_s * 1000)
    calibration["packetsLost"] = page.evaluate(LOSS_JS)
    page.evaluate("window.dreamrt.app.end()")  # DELETE, as the End button does
    page.close()
    return results, calibration


def _table(rows: list[tuple[str, dict[str, float]]]) -> str:
    head = f"{'metric':<48}{'median':>10}{'p90':>10}{'min':>10}{'max':>10}{'n':>5}"
    lines = [head, "-" * len(head)]
    for name, s in rows:
        lines.append(
            f"{name:<48}{s['median']:>10.1f}{s['p90']:>10.1f}{s['min']:>10.1f}{s['max']:>10.1f}{s['n']:>5}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", help="a running server (default: start one on a free loopback port)"
    )
    parser.add_argument("--loads", type=int, default=3, help="page loads to time")
    parser.add_argument("--trials", type=int, default=10, help="action-to-photon keypresses")
    parser.add_argument(
        "--hold-s", type=float, default=0.3, help="how long each key stays down after its photon"
    )
    parser.add_argument("--settle-s", type=float, default=1.0, help="pause between keypresses")
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra `serve` argument (repeatable)"
    )
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="browser-latency-")))
        url = args.url
        if url is None:
            server = stack.enter_context(
                ServerProcess(tmp / "data", tmp / "server.log", extra_args=tuple(args.server_arg))
            )
            url = server.url
        playwright = stack.enter_context(sync_playwright())
        context = launch_chromium(playwright, tmp / "profile")
        stack.callback(context.close)
        startup = measure_startup(context, url, args.loads)
        a2p, calibration = measure_action_to_photon(
            context, url, args.trials, args.hold_s, args.settle_s
        )

    rows = [
        (
            "page load -> first frame presented (ms)",
            _summary([r["firstPresentedMs"] for r in startup]),
        ),
        (
            "  page load -> DOMContentLoaded (ms)",
            _summary([r["domContentLoadedMs"] for r in startup]),
        ),
        ("  page load -> control channel open (ms)", _summary([r["connectedMs"] for r in startup])),
        ("keydown -> input.received at page (ms)", _summary([r["receivedMs"] for r in a2p])),
        ("keydown -> action.applied at page (ms)", _summary([r["appliedMs"] for r in a2p])),
        ("keydown -> photon (rVFC expectedDisplay) (ms)", _summary([r["photonMs"] for r in a2p])),
    ]
    print(
        f"browser latency: {url}, {args.loads} loads, {args.trials} keypresses, Chromium headless"
    )
    print(_table(rows))
    calibrated = calibration["firstPresentedFrames"] == 1 and calibration["packetsLost"] in (
        0,
        None,
    )
    print(
        f"RTP->PTS calibration: first presented frame #{calibration['firstPresentedFrames']}, "
        f"packets lost {calibration['packetsLost']}: {'valid' if calibrated else 'SUSPECT (photon figures may be off)'}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "url": url,
                    "startup": startup,
                    "action_to_photon": a2p,
                    "calibration": calibration,
                    "summary": dict(rows),
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
