"""``server.data.replay`` x time to steer: a replay latches inputs with the restart policy the
chunk's record names (``dreamrt serve --steering``), so a chunk made under one policy replays
bit-identically on an instance serving another.

A real loop on the tiny random card makes the record (real SQLite store, real snapshot file,
real input log rows): a prompt switch early in chunk 1, which the default policy would restart
the chunk for and the plain one (``cuts-only``) does not.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from models.instance import load_instance
from models.loops.chunk_rollout.restart import RestartCutsOnly
from models.loops.requests import SessionRequest
from models.registry import get
from runtime.contract import InputEvent, InputKind, PromptInput
from runtime.driver import Driver, InlineContext
from server.data.replay import replay_chunk
from sessions.input_log import encode_input
from sessions.recording import snapshot_path
from sessions.records import frames_digest
from sessions.store import Store

SWITCH_AT = 9  # driver step: chunk 1 has run 1 of its 4 steps


@pytest.fixture(scope="module")
def instance():
    return load_instance(get("wan-tiny-random"), device="cpu")


def _record_live_run(instance, data: Path) -> dict:
    """Chunk 1 of a cuts-only session, as the server would have recorded it."""
    served = copy.copy(instance)
    served.chunk_restart = RestartCutsOnly()
    ctx = InlineContext("loop-b")
    driver = Driver(served.loop("chunk_rollout"), ctx)
    switch = InputEvent(InputKind.PROMPT, 1, PromptInput(text="a blue square on sand"), 1.0)

    async def run() -> bytes:
        request = SessionRequest(prompt="a red ball", seed=5, max_chunks=2, width=32, height=32)
        driver.init(request, served)
        snapshot = driver.snapshot()  # the replay key's snapshot: step 0
        while True:
            if driver.state.step == SWITCH_AT:
                ctx.push_input(switch)
            if not await driver.step():
                return snapshot

    snapshot = asyncio.run(run())
    media = [e for e in ctx.emissions if e.spec.stream == "media" and e.spec.meta.chunk == 1]
    frames = torch.cat([e.output for e in media]).numpy()
    capture = media[-1].spec.meta.capture
    path = snapshot_path(data, "loop-b@0")
    path.parent.mkdir(parents=True)
    path.write_bytes(snapshot)
    store = Store(data / "dreamrt.sqlite3")
    store.add_inputs("loop-b", SWITCH_AT, [encode_input(switch)])
    return {
        "store": store,
        "row": {
            "segment": 0,
            "chunk": 1,
            "seed": 5,
            "model_id": "wan-tiny-random",
            "weights_version": instance.weights_digest,
            "loop_id": "chunk_rollout",
            "sampler": "",
            "steps": 4,
            "timesteps": capture["timesteps"],
            "precision": capture["precision"],
            "prompt": capture["prompt"],
            "prompt_seq": 1,
            "actions": {"action": None, "audio_seqs": []},
            "pts_start": media[0].spec.meta.pts_90k,
            "pts_end": 0,
            "num_frames": frames.shape[0],
            "digest": frames_digest(np.ascontiguousarray(frames)),
            "replay_key": "loop-b@0",
            "restart_policy": capture["restart_policy"],
        },
    }


def test_a_chunk_replays_with_the_restart_policy_its_record_names(instance, tmp_path) -> None:
    live = _record_live_run(instance, tmp_path)
    store, row = live["store"], live["row"]
    assert row["restart_policy"] == "cuts-only"
    store.add_record({**row, "session_id": "s-recorded"})
    # the same chunk without the policy in its record: the instance's own would apply
    store.add_record({**row, "session_id": "s-unnamed", "restart_policy": None})
    store.close()
    assert instance.chunk_restart.name == "regenerate-when-sooner"  # not the recorded one
    replayed = replay_chunk(tmp_path, "s-recorded", 1, instance=instance)
    assert replayed.matches, (replayed.recorded, replayed.replayed)
    assert instance.chunk_restart.name == "regenerate-when-sooner"  # the caller's is untouched
    # the default policy restarts chunk 1 for the switch: other frames (why the record names it)
    other = replay_chunk(tmp_path, "s-unnamed", 1, instance=instance)
    assert not other.matches and other.recorded == replayed.recorded
