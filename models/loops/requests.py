"""Requests that start loops, and the emission/input conventions loops share with sessions/.

Streams and inputs are typed in ``runtime.contract``: a loop emits ``MediaMeta`` frames,
``AppliedMeta`` acknowledgements and ``ProgressMeta`` counts, and absorbs ``InputEvent``s whose
payload is a ``PromptInput`` (mode switch: the stream goes on under it; mode cut: a new
segment; either from the next chunk, or from the chunk in flight restarted at the next step
boundary when the loop's ``RestartPolicy`` says so), an ``ActionInput`` (latched per chunk,
latest wins; a change of the held keys may restart the chunk in flight too) or an
``AudioInput`` (16 kHz mono float32 samples, appended).
"""

from __future__ import annotations

from typing import Any

import msgspec


class SessionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Starts ``chunk_rollout``: an unbounded (or ``max_chunks``-bounded) realtime stream."""

    prompt: str
    seed: int = 0
    width: int | None = None  # None: the card's default profile
    height: int | None = None
    fps: int | None = None
    max_chunks: int | None = None  # None: until cancelled
    # the session's slab of the model's preallocated chunk-KV buffer (admission hands it out);
    # None: the stream allocates its own cache (tests, benchmarks, offline rollouts)
    kv_slab: int | None = None
    # LoRA adapters registered at deploy scope (models/lora.py), with strengths
    adapters: tuple[tuple[str, float], ...] = ()
    # how latents become frames: "full" (the VAE) | "tiny" (a tiny streaming decoder), one the
    # model serves (``ModelCard.decoders``); None: the card's default decoder
    decoder: str | None = None


class JobRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Starts ``diffusion_denoise`` (+ ``vae_decode``): an offline T2V/T2I job."""

    task: str  # "t2v" | "t2i"
    prompt: str
    num_frames: int | None = None  # t2i: 1
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    seed: int = 0
    guidance_scale: float | None = None
    keep_latents: bool = False  # chunk_rollout: each step's latents on the chunk's capture
    # False: the loop stops at latents (a program's decode nodes turn them into frames); its
    # result has "latents" and no "frames"
    decode: bool = True
    negative_prompt: str = ""  # the unconditional branch of classifier-free guidance
    # LoRA adapters registered at deploy scope (models/lora.py), with strengths
    adapters: tuple[tuple[str, float], ...] = ()
    # extension name -> parameter overrides (only of extensions the server enabled; each
    # validated by the extension's schema before the loop starts, ``runtime.extensions``)
    extensions: dict[str, dict[str, Any]] = {}
    exact: bool = False  # refuse distribution-altering extension parameters


class ProgramRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Starts a program (``models.programs.program_loop``): ``program`` is its wire form
    (``models.programs.graph.Program.to_dict``), ``job`` the request fields every loop node
    starts from (a node's own parameters override them)."""

    program: dict[str, Any]
    job: JobRequest
    loop_id: str = ""  # the job's: names a state forked from another loop's (``fork``)
