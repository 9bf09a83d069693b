"""Programs run on one resident instance: preview and final from one rollout equal what each
decoder gives alone, the previews come out while the rollout still runs, a program on a
bidirectional card equals its plain job, and a half-run program resumes from its snapshot."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from models.instance import load_instance
from models.loops.ops import DecodeArgs
from models.loops.pieces import decode_pieces
from models.loops.requests import JobRequest, ProgramRequest
from models.programs.graph import Program, ProgramError
from models.programs.presets import preview_and_final
from models.programs.program_loop import ProgramLoop, ProgramState
from models.registry import get
from runtime.contract import PlanKind, Priority, Stream
from runtime.cost import CostModel, DeviceConstants
from runtime.driver import Driver, InlineContext
from runtime.engine import Engine
from runtime.scheduler import ends_chunk

# the tiny card's chunks are 3 latent frames: 9 pixel frames, then 12 each
TWO_CHUNKS = JobRequest(task="t2v", prompt="a red kite over a beach", num_frames=17, seed=5)


@pytest.fixture(scope="module")
def taehv() -> Any:
    return load_instance(get("wan-tiny-taehv-random"), device="cpu")


async def run_on_engine(instance: Any, runs: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """Each (loop, request) as a batch loop of one real engine -> id -> (outputs, emissions)."""
    engine = Engine(cost=CostModel(DeviceConstants.cpu()))
    await engine.start()
    try:
        out: dict[str, Any] = {}
        handles = {}
        for loop_id, (loop, request) in runs.items():
            emitted: list[Any] = []
            handles[loop_id] = (
                engine.spawn(
                    loop,
                    request,
                    instance,
                    loop_id=loop_id,
                    priority=Priority.BATCH,
                    on_emit=emitted.append,
                ),
                emitted,
            )
        for loop_id, (handle, emitted) in handles.items():
            out[loop_id] = ((await handle.result()).outputs, emitted)
        return out
    finally:
        await engine.close()


def decode_alone(instance: Any, decoder: str, latents: torch.Tensor, piece: int) -> torch.Tensor:
    """``latents`` [1, C, f, h, w] through ``decoder`` alone, in a stream's pieces of at most
    ``piece`` latent frames (``decode_pieces``: the first frame alone)."""
    cache = instance.new_decoder_cache(latents.shape[3], latents.shape[4], decoder)
    op = instance.decode_op_for(decoder)
    frames = [
        op([DecodeArgs(latents=latents[:, :, start:stop], cache=cache)])[0]
        for start, stop in decode_pieces(0, latents.shape[2], piece)
    ]
    return torch.cat(frames)


def program_request(program: Program, job: JobRequest) -> ProgramRequest:
    return ProgramRequest(program=program.to_dict(), job=job)


def test_preview_and_final_from_one_rollout_equal_each_decoder_alone(taehv) -> None:
    program = preview_and_final()
    runs = {
        "program": (ProgramLoop(taehv, program), program_request(program, TWO_CHUNKS)),
        "job": (taehv.loop("chunk_rollout"), TWO_CHUNKS),  # the plain job: the full VAE
    }
    out = asyncio.run(run_on_engine(taehv, runs))
    outputs, emitted = out["program"]
    latents = outputs["latents.denoise"]
    assert latents.shape[2] == 6  # two chunks of 3 latent frames
    # the final frames are the plain job's frames (the same rollout, the same decoder)
    assert torch.equal(outputs["frames"], out["job"][0]["frames"])
    assert outputs["frames"].shape == (17, 64, 64, 3)
    assert torch.equal(outputs["frames.final"][:17], decode_alone(taehv, "full", latents, 3)[:17])
    # the preview is the tiny decoder's, alone, of the same latents
    tiny = decode_alone(taehv, "tiny", latents, 3)
    assert torch.equal(outputs["frames.preview"], tiny[:17])
    assert not torch.equal(outputs["frames.preview"], outputs["frames"])
    previews = [e for e in emitted if e.spec.stream == "preview"]
    # the stream's first frame alone (``decode_pieces``), then the rest of each chunk
    assert [(p.spec.meta.frame_start, p.spec.meta.num_frames) for p in previews] == [
        (0, 1),
        (1, 8),
        (9, 12),
    ]
    assert torch.equal(torch.cat([p.output for p in previews]), tiny)
    # one progress count over all the nodes' plans, ending at its total
    progress = [e.spec.meta for e in emitted if e.spec.stream == Stream.PROGRESS]
    assert [p.done for p in progress] == list(range(1, len(progress) + 1))
    assert progress[-1].done == progress[-1].total


def test_a_half_run_program_resumes_from_its_snapshot(taehv) -> None:
    program = preview_and_final()
    request = program_request(program, TWO_CHUNKS)
    ctx = InlineContext("p")
    whole = asyncio.run(Driver(ProgramLoop(taehv, program), ctx).run(request, taehv))
    # the previews stream while the rollout runs: chunk 0's decodes (the tiny one first)
    # run before chunk 1 is denoised
    kinds = [(plan.kind, plan.op) for plan in ctx.executed]
    tiny, full = taehv.decode_op_for("tiny"), taehv.decode_op_for("full")
    steps = [i for i, (kind, _) in enumerate(kinds) if kind is PlanKind.CHUNK_STEP]
    chunk_1 = steps[4]  # the card samples 4 steps a chunk
    assert kinds.index((PlanKind.VAE_DECODE, tiny)) < kinds.index((PlanKind.VAE_DECODE, full))
    assert kinds.index((PlanKind.VAE_DECODE, full)) < chunk_1
    # each decoder: chunk 0 in two parts (its first frame alone), then chunk 1
    assert sum(1 for k in kinds if k[0] is PlanKind.VAE_DECODE) == 6
    # the rollout's chunk ends are the runtime's chunk boundaries, as in its plain job (a
    # weight sync holds a program there): chunk 0's KV update, chunk 1's last step
    ends = [plan.kind for plan in ctx.executed if ends_chunk(plan.emits)]
    assert ends == [PlanKind.KV_UPDATE, PlanKind.CHUNK_STEP]

    async def half() -> bytes:
        driver = Driver(ProgramLoop(taehv, program), InlineContext("p"))
        driver.init(request, taehv)
        for _ in range(8):  # chunk 0 denoised and decoded by both, chunk 1 begun
            await driver.step()
        assert driver.state.delivered == {
            "denoise.latents->preview.latents": 1,
            "denoise.latents->final.latents": 1,
        }
        return driver.snapshot()

    blob = asyncio.run(half())
    resumed = Driver.from_snapshot(
        ProgramLoop(taehv, program), InlineContext("p"), blob, ProgramState
    )
    assert resumed.state.step == 8 and resumed.state.decodes["preview"].frames_out == 9
    result = asyncio.run(resumed.run())
    for name in ("frames", "frames.preview", "latents.denoise"):
        assert torch.equal(result.outputs[name], whole.outputs[name]), name


def test_a_program_on_a_bidirectional_card_equals_its_plain_job() -> None:
    instance = load_instance(get("wan2.1-t2v-tiny-random"), device="cpu")
    with pytest.raises(ProgramError, match="decoder 'tiny' is not served"):
        ProgramLoop(instance, preview_and_final())
    program = Program.from_dict(
        {
            "nodes": {
                "denoise": {"kind": "loop", "loop": "diffusion_denoise", "num_frames": 1},
                "final": {"kind": "decode", "decoder": "full"},
                "image": {"kind": "artifact", "format": "png"},
            },
            "edges": [
                {"from": "denoise.latents", "to": "final.latents", "kind": "tensor"},
                {"from": "final.frames", "to": "image.frames", "kind": "artifact"},
            ],
        }
    )
    job = JobRequest(task="t2i", prompt="a lighthouse", seed=2, guidance_scale=1.0)
    loop = ProgramLoop(instance, program)
    state = loop.init(program_request(program, job), instance, None)
    assert sum(row[2] for row in loop.plan_table(state)) == state.plans_total
    runs = {
        "program": (ProgramLoop(instance, program), program_request(program, job)),
        "job": (instance.loop("diffusion_denoise"), job),
    }
    out = asyncio.run(run_on_engine(instance, runs))
    assert torch.equal(out["program"][0]["frames"], out["job"][0]["frames"])
    assert out["program"][0]["frames"].shape[0] == 1


def test_render_a_moment_continues_the_session_exactly(taehv) -> None:
    """The session's state at a chunk boundary, continued by the render_moment program, makes
    the latents the session itself goes on to make; the full VAE decodes them from there."""
    from models.loops.requests import SessionRequest
    from models.programs.presets import render_moment
    from runtime.snapshot import clone_state

    session = SessionRequest(prompt="a lighthouse at dusk", seed=3, max_chunks=2, decoder="tiny")
    ctx = InlineContext("ses")
    driver = Driver(taehv.loop("chunk_rollout"), ctx)

    async def run_session() -> Any:
        driver.init(session, taehv)
        while driver.state.next_chunk < 1:  # chunk 0 decoded: a chunk boundary
            await driver.step()
        moment = clone_state(driver.state)
        await driver.run()  # the session goes on by itself: chunk 1
        return moment

    moment = asyncio.run(run_session())
    decoded = [
        plan.args.latents
        for plan in ctx.executed
        if plan.kind is PlanKind.VAE_DECODE and plan.emits[0].meta.chunk >= 1
    ]
    program = render_moment(session="ses", chunks=1)
    request = ProgramRequest(
        program=program.to_dict(), job=JobRequest(task="t2v", prompt=""), loop_id="job"
    )
    loop = ProgramLoop(taehv, program)
    state = loop.fork(moment, request, taehv)
    assert state.rollouts["rollout"].max_chunks == 2 and state.loop_id == "job"
    result = asyncio.run(Driver.from_state(loop, InlineContext("job"), state).run())
    latents = result.outputs["latents.rollout"]
    assert torch.equal(latents, torch.cat(decoded, dim=2))  # chunk 1 of the session
    assert torch.equal(result.outputs["frames"], decode_alone(taehv, "full", latents, 3))
    assert result.outputs["frames"].shape[0] == 9
    with pytest.raises(ValueError, match="needs its state"):
        loop.init(request, taehv, None)


def test_a_programs_price_is_its_nodes_plans(taehv) -> None:
    """The plan table a program is priced by: the rollout's plans without decodes, plus each
    decoder's decodes, under the shape signatures the plain job's own decodes have (so a
    decoder's measured cost prices the program), counting every plan the program runs."""
    program = preview_and_final()
    loop = ProgramLoop(taehv, program)
    state = loop.init(program_request(program, TWO_CHUNKS), taehv, None)
    table = loop.plan_table(state)
    assert sum(row[2] for row in table) == state.plans_total
    rollout = taehv.loop("chunk_rollout")
    alone = rollout.plan_table(rollout.init(TWO_CHUNKS, taehv, None))
    decodes = [row for row in alone if row[0] == "vae_decode"]
    assert [row for row in table if row[0] != "vae_decode"] == [
        row for row in alone if row[0] != "vae_decode"
    ]
    full = [row for row in table if row[0] == "vae_decode" and row[1].endswith(":full")]
    tiny = [row for row in table if row[0] == "vae_decode" and not row[1].endswith(":full")]
    # each decoder: the first frame alone, the rest of chunk 0, chunk 1 (``decode_pieces``)
    assert full == decodes and len(tiny) == 3 and sum(r[2] for r in tiny) == 3
    cost = CostModel(DeviceConstants.cpu())
    price = sum(n * cost.gpu_seconds(kind, sig, flops) for kind, sig, n, flops in table)
    plain = sum(n * cost.gpu_seconds(kind, sig, flops) for kind, sig, n, flops in alone)
    tiny_s = sum(n * cost.gpu_seconds(kind, sig, flops) for kind, sig, n, flops in tiny)
    assert price == pytest.approx(plain + tiny_s)  # the preview's decodes on top of the job
