"""``dreamrt eval tiny-world``: seeded rollouts through the real loop, scored by pixel statistics.

Each scripted rollout (``chunks`` chunks of 4 frames, 18 = 6 s by default) of seed r::

    chunk:     0    | 1  2  3 | 4  5 | 6      | 7  8 | 9  10 11 | 12 13 14 | 15   | 16 17
    applies:   A    | keys d1 | rest | B      | rest | keys d2  | rest     | loud | rest
    scored as: A ......................  | -    | B ...........................................

(each input is pushed after the previous chunk returned and applies to the next chunk; the
loop's "applied" acks say exactly where)

- **action accuracy**: for each key trial the sprite's centroid must move >= ``MIN_MOVE_PX``
  along the commanded direction (and more along it than across it) between the frame before
  the action applies and the last frame it is held; d1/d2 are drawn among directions with room
  to move (from the measured centroid);
- **prompt adherence**: frames whose background class and sprite colour match the prompt in
  force (A before the switch chunk, B from 2 chunks after it);
- **switch latency**: chunks from the switch's applied chunk to the first chunk whose last frame
  matches B (1 = at once); within ``SWITCH_CHUNKS`` counts as a success;
- **audio pulse** (reported, no threshold): sprite area with loud audio / without.

A separate long rollout (``long_s`` seconds, random keys, a prompt switch every 15 s) checks that
nothing collapses: every frame's statistics must stay in the range calibrated on world frames of
its background class. ``EvalReport.passed`` ands the four thresholds.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from models.loops.inputs import AUDIO_SAMPLE_RATE
from models.tinyworld.evaluation.classify import FrameClassifier, FrameReading
from models.tinyworld.evaluation.stream import LoopStream
from models.tinyworld.vocab import COLOURS, SHAPES, TERRAINS, WorldSpec, prompt_text
from runtime.contract import AudioInput, PromptInput

__all__ = ["THRESHOLDS", "EvalReport", "evaluate"]

THRESHOLDS = {
    "action_accuracy": 0.9,
    "prompt_adherence": 0.9,
    "switch_success": 0.9,
    "long_in_range": 0.99,
}
MIN_MOVE_PX = 4.0
SWITCH_CHUNKS = 2
_DIRECTIONS = {"w": (0.0, -1.0), "a": (-1.0, 0.0), "s": (0.0, 1.0), "d": (1.0, 0.0)}
_ROOM_PX = 25.0


@dataclass
class EvalReport:
    """Scores (fractions in [0, 1]), counts, and per-threshold verdicts."""

    rollouts: int
    chunks_per_rollout: int
    action_trials: int = 0
    action_accuracy: float = 0.0
    mean_move_px: float = 0.0
    adherence_frames: int = 0
    prompt_adherence: float = 0.0
    shape_accuracy: float = 0.0
    switches: int = 0
    switch_success: float = 0.0
    mean_switch_chunks: float = 0.0
    audio_pulse_ratio: float = 0.0
    long_s: float = 0.0
    long_frames: int = 0
    long_in_range: float = 0.0
    long_adherence: float = 0.0
    chunk_ms_median: float = 0.0
    wall_s: float = 0.0
    verdicts: dict[str, bool] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and all(self.verdicts.values())

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"passed": self.passed, "thresholds": THRESHOLDS}


def _random_spec(rng: random.Random, unlike: WorldSpec | None = None) -> WorldSpec:
    while True:
        spec = WorldSpec(
            rng.randrange(len(TERRAINS)),
            rng.random() < 0.25,
            rng.randrange(len(COLOURS)),
            rng.randrange(len(SHAPES)),
        )
        if unlike is None or (
            spec.background != unlike.background and spec.colour != unlike.colour
        ):
            return spec


def _tone(seconds: float, amplitude: float = 0.5) -> list[float]:
    n = int(seconds * AUDIO_SAMPLE_RATE)
    return [amplitude * math.sin(2 * math.pi * 220.0 * i / AUDIO_SAMPLE_RATE) for i in range(n)]


class _Scorer:
    """Accumulates one evaluation's counts."""

    def __init__(self, classifier: FrameClassifier) -> None:
        self.cls = classifier
        self.moves: list[float] = []
        self.action_ok: list[bool] = []
        self.adherent: list[bool] = []
        self.shape_ok: list[bool] = []
        self.switch_chunks: list[int] = []
        self.pulse: list[float] = []

    def frames(self, frames: torch.Tensor, spec: WorldSpec | None) -> list[FrameReading]:
        readings = [self.cls.read(f) for f in frames]
        if spec is not None:
            self.adherent += [self.cls.matches(r, spec) for r in readings]
            self.shape_ok += [r.shape == SHAPES[spec.shape] for r in readings]
        return readings

    def action(self, before: FrameReading, after: FrameReading, key: str) -> None:
        ex, ey = _DIRECTIONS[key]
        if before.centroid is None or after.centroid is None:
            self.action_ok.append(False)
            return
        dx = after.centroid[0] - before.centroid[0]
        dy = after.centroid[1] - before.centroid[1]
        along, across = dx * ex + dy * ey, abs(dx * ey - dy * ex)
        self.moves.append(along)
        self.action_ok.append(along >= MIN_MOVE_PX and along > across)


def _pick_direction(reading: FrameReading, rng: random.Random, size: tuple[int, int]) -> str:
    x, y = reading.centroid or (size[1] / 2, size[0] / 2)
    room = {"w": y, "a": x, "s": size[0] - y, "d": size[1] - x}
    roomy = [k for k, r in room.items() if r - 11.0 >= _ROOM_PX]
    return rng.choice(roomy) if roomy else max(room, key=room.__getitem__)


def _scripted_rollout(instance: Any, seed: int, chunks: int, scorer: _Scorer) -> None:
    rng = random.Random(seed)
    a = _random_spec(rng)
    b = _random_spec(rng, unlike=a)
    stream = LoopStream(instance, prompt_text(a, rng.randrange(4)), seed=seed)
    size = (stream.state.height, stream.state.width)
    spec: WorldSpec | None = a  # what the frames must show (None: not scored, a switch settling)
    switch_seq, switch_chunk, switched = None, None, False
    readings: dict[int, list[FrameReading]] = {}
    trials: list[tuple[str, int]] = []  # (key, seq of its first push)
    key, loud_seq = "d", None
    for c in range(chunks):
        # inputs pushed now apply to chunk c (from c = 1 on; the acks say where)
        if c in (1, 9):
            key = _pick_direction(readings[c - 1][-1], rng, size)
            trials.append((key, stream.push_keys([key])))
        elif c in (2, 3, 10, 11):
            stream.push_keys([key])
        elif c in (4, 12):
            stream.push_keys([])
        elif c == 6:
            switch_seq = stream.push(PromptInput(text=prompt_text(b, rng.randrange(4))))
        elif c == 15:
            loud_seq = stream.push(AudioInput(samples=_tone(4 / stream.state.fps)))
        if switch_seq is not None and switch_chunk is None and switch_seq in stream.applied:
            switch_chunk = stream.applied[switch_seq]
        frames = stream.next_chunk()
        if switch_seq is not None and switch_chunk is None and switch_seq in stream.applied:
            switch_chunk = stream.applied[switch_seq]
        if switch_chunk is not None and c >= switch_chunk:
            if not switched:
                last = scorer.cls.read(frames[-1])
                if scorer.cls.matches(last, b):
                    scorer.switch_chunks.append(c - switch_chunk + 1)
                    switched = True
            spec = b if c >= switch_chunk + SWITCH_CHUNKS - 1 else None
        readings[c] = scorer.frames(frames, spec)
    if not switched:
        scorer.switch_chunks.append(chunks)  # never took effect
    for key, seq in trials:
        first = stream.applied.get(seq)
        if first is None or first + 2 >= chunks:
            scorer.action_ok.append(False)
            continue
        scorer.action(readings[first - 1][-1], readings[first + 2][-1], key)
    loud = stream.applied.get(loud_seq) if loud_seq is not None else None
    if loud is not None and loud in readings and loud - 1 in readings:
        quiet_px = max(1, readings[loud - 1][-1].sprite_px)
        scorer.pulse.append(max(r.sprite_px for r in readings[loud]) / quiet_px)


def _long_rollout(
    instance: Any, seconds: float, seed: int, classifier: FrameClassifier
) -> tuple[int, float, float]:
    rng = random.Random(10_000 + seed)
    spec = _random_spec(rng)
    stream = LoopStream(instance, prompt_text(spec), seed=10_000 + seed)
    fps = instance.card.default_profile.fps
    chunks = math.ceil(seconds * fps / stream.state.chunk_frames)
    per_switch = max(1, int(15 * fps / stream.state.chunk_frames))
    in_range, adherent, n, settle = 0, 0, 0, chunks
    keys: list[str] = []
    for c in range(chunks):
        if c % 3 == 0:
            keys = rng.choice([[], ["w"], ["a"], ["s"], ["d"], ["w", "d"], ["s", "shift"]])
        stream.push_keys(keys)
        if c and c % per_switch == 0:
            spec = _random_spec(rng, unlike=spec)
            stream.push(PromptInput(text=prompt_text(spec)))
            settle = c + 1 + SWITCH_CHUNKS
        if c % 20 == 7:
            stream.push(AudioInput(samples=_tone(0.3)))
        frames = stream.next_chunk()
        for f in frames:
            r = classifier.read(f)
            in_range += classifier.in_range(r)
            if c < per_switch or c >= settle:
                adherent += classifier.matches(r, spec)
            n += 1
    return n, in_range / n, adherent / n


def evaluate(
    instance: Any,
    *,
    rollouts: int = 50,
    chunks: int = 18,
    long_s: float = 60.0,
    seed: int = 0,
    classifier: FrameClassifier | None = None,
) -> EvalReport:
    """Score ``instance`` (a loaded tiny-world card) as the module docstring describes."""
    start = time.perf_counter()
    cls = classifier or FrameClassifier(
        instance.card.default_profile.height, instance.card.default_profile.width
    )
    if not cls.stats_ranges:
        cls.calibrate()
    scorer = _Scorer(cls)
    chunk_ms: list[float] = []
    for r in range(rollouts):
        t0 = time.perf_counter()
        _scripted_rollout(instance, seed + r, chunks, scorer)
        chunk_ms.append((time.perf_counter() - t0) * 1000 / chunks)
    report = EvalReport(rollouts=rollouts, chunks_per_rollout=chunks)
    report.action_trials = len(scorer.action_ok)
    report.action_accuracy = _mean(scorer.action_ok)
    report.mean_move_px = _mean(scorer.moves)
    report.adherence_frames = len(scorer.adherent)
    report.prompt_adherence = _mean(scorer.adherent)
    report.shape_accuracy = _mean(scorer.shape_ok)
    report.switches = len(scorer.switch_chunks)
    report.switch_success = _mean([c <= SWITCH_CHUNKS for c in scorer.switch_chunks])
    report.mean_switch_chunks = _mean(scorer.switch_chunks)
    report.audio_pulse_ratio = _mean(scorer.pulse)
    if long_s > 0:
        report.long_s = long_s
        report.long_frames, report.long_in_range, report.long_adherence = _long_rollout(
            instance, long_s, seed, cls
        )
    report.chunk_ms_median = sorted(chunk_ms)[len(chunk_ms) // 2] if chunk_ms else 0.0
    report.wall_s = round(time.perf_counter() - start, 1)
    report.verdicts = {
        name: getattr(report, name) >= bar
        for name, bar in THRESHOLDS.items()
        if name != "long_in_range" or long_s > 0
    }
    return report


def _mean(values: list[Any]) -> float:
    return float(sum(values)) / len(values) if values else 0.0
