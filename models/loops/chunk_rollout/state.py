"""The state of ``chunk_rollout``: everything of one stream, serializable at any step boundary.

A msgspec struct (``runtime.contract.LoopState``): progress counters, prompt memory, the inputs
latched for the current chunk and those waiting for the next one, and the stream's tensors, its
two caches among them (the chunk-KV slab view and the VAE decoder cache), so a snapshot carries
them and a restored stream continues bit for bit.
"""

from __future__ import annotations

import enum

import torch

from models.wan.kv.cache import ChunkKVCache
from models.wan.vae.cache import DecoderCache
from runtime.contract import InputKind, LoopState

__all__ = ["ChunkRolloutState", "Phase"]


class Phase(str, enum.Enum):
    START = "start"  # chunk boundary: text encode / re-cache if needed, then denoise
    DENOISE = "denoise"
    KV_UPDATE = "kv_update"
    DECODE = "decode"


class ChunkRolloutState(LoopState, kw_only=True):
    """All of one stream's state (see module docstring). Shapes: C latent channels, c latent
    frames per chunk, (h, w) latent grid, S sink + W ring frames in the K/V cache."""

    loop_id: str
    seed: int
    fps: int
    width: int
    height: int
    chunk_frames: int
    latent_h: int
    latent_w: int
    max_chunks: int | None = None
    collect_frames: bool = False
    target_frames: int | None = None  # jobs: frames to return (the last chunk may overshoot)
    # progress
    phase: Phase = Phase.START
    chunk: int = 0
    segment: int = 0
    denoise_step: int = 0
    frame_start: int = 0  # absolute latent frame index (RoPE position) of the current chunk
    frames_emitted: int = 0
    decoded: int = 0  # latent frames of the current chunk decoded so far
    plans_done: int = 0
    # prompt memory
    prompt: str
    active_prompt: str | None = None  # the prompt whose cross K/V is held
    # the model's weights_version the cross K/V (and the chunk-KV) were made with: a weight
    # sync makes the next chunk re-encode the prompt and re-cache (chunk_rollout.next)
    weights_version: str = ""
    adapters: list[tuple[str, float]] = []  # LoRA adapters and strengths (models/lora.py)
    keep_latents: bool = False  # a rollout sample's opt-in: every step's latents, per chunk
    step_latents: list[torch.Tensor] = []  # [1, C, c, h, w] after each step of this chunk
    recache_needed: bool = False
    next_prompt: str | None = None  # a switch waiting for the next chunk boundary
    next_prompt_is_cut: bool = False
    # inputs latched for the current chunk, and those waiting for the next one:
    # (kind, seq, changes the picture) reflected by the current chunk / waiting
    acks: list[tuple[InputKind, int, bool]] = []
    next_acks: list[tuple[InputKind, int, bool]] = []
    restarts: int = 0  # times the current chunk position restarted for an input
    # the largest engine batch the current chunk's denoising steps ran in (1: alone); a
    # batched step agrees with a solo one within a tolerance, so the record says so
    step_batch: int = 1
    chunk_action: torch.Tensor | None = None  # [1, ACTION_DIM]
    next_action: torch.Tensor | None = None
    chunk_keys: list[str] = []  # the held keys of chunk_action / next_action, as plain data
    next_keys: list[str] = []
    chunk_audio: torch.Tensor | None = None  # [1, c, AUDIO_DIM]
    audio_pending: torch.Tensor  # [n] float32, 16 kHz mono
    # digests of the conditioning, for behaviour records (computed on the host copies)
    prompt_digest: str = ""  # of the active prompt's text-encoder embedding
    chunk_action_digest: str = ""
    next_action_digest: str = ""
    chunk_audio_digest: str = ""
    # tensors
    latents: torch.Tensor | None = None  # [1, C, c, h, w] current chunk
    cross_k: torch.Tensor | None = None  # [layers, 1, L, heads, head_dim]
    cross_v: torch.Tensor | None = None
    kv: ChunkKVCache  # the session's chunk-KV (a slab view), written in place by the ops
    window_latents: torch.Tensor  # [1, C, S + W, h, w] clean latents of the cached frames
    decoder: DecoderCache  # the session's VAE decoder cache, advanced in place by decodes
    # the decoder option that cache belongs to ("full" | "tiny"); "": the model's default
    # (a state snapshotted before sessions could pick one)
    codec: str = ""
    frames: list[torch.Tensor] = []  # collected uint8 [n, H, W, 3] chunks (jobs only)
    # False: chunks are not decoded; each chunk's final latents [1, C, c, h, w] are kept in
    # ``latent_chunks`` instead (a program's decode nodes take them from there)
    decode: bool = True
    latent_chunks: list[torch.Tensor] = []

    @property
    def next_chunk(self) -> int:
        """The first chunk whose frames are not decoded yet: at the chunk boundary right after
        a decode (its KV update still to run) that is the next one."""
        return self.chunk + (1 if self.decoded == self.chunk_frames else 0)
