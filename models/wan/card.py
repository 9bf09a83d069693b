"""The Wan cards: the Wan2.1-1.3B chunk-causal DiT (Self-Forcing recipe) and its tiny CPU twin,
and the bidirectional base model Wan2.1-T2V-1.3B (offline jobs) and its tiny CPU twin.

Pure data (no torch at import). Component presets name entries of the family's preset tables:
the DiT's ``models.wan.dit.config.PRESETS`` (``"wan2.1-1.3b"``, ``"tiny"``), the VAE's
``models.wan.vae.config`` presets (``"wan2.1"``, ``"tiny"``) and the text encoder's
``models.wan.text_encoder.UMT5_PRESETS`` (``"umt5-xxl"``, ``"umt5-tiny"``).

The causal cards share one loop set: ``chunk_rollout`` serves sessions and jobs alike (the
card's ``loop_for("text_to_video")``) with the chunk-causal 4-step schedule, because that is what
the Self-Forcing weights were trained under; ``kv_recache``, ``vae_decode`` and ``text_encode``
are helper loops.

The base cards serve jobs only: ``diffusion_denoise`` with bidirectional attention over the whole
clip, 50 Euler steps of the flow-matching ODE with classifier-free guidance, as the base weights
were trained (no chunk-KV cache, so no realtime sessions).
"""

from __future__ import annotations

from dataclasses import replace

from models.card import (
    AttentionMode,
    CacheContract,
    CacheKind,
    CardUI,
    CheckpointFormat,
    CheckpointManifest,
    ComponentEntry,
    ComponentKind,
    ComponentSpec,
    Control,
    ControlKind,
    LatentSpec,
    LoopKind,
    LoopSpec,
    ModelCard,
    ParityLevel,
    ParitySpec,
    PrecisionContract,
    Profile,
    RecipeSpec,
    ScheduleSpec,
    WeightsKind,
)

__all__ = [
    "CARDS",
    "WAN21_13B_CAUSAL",
    "WAN21_13B_CAUSAL_TAEHV",
    "WAN21_T2V_13B",
    "WAN21_T2V_SCHEDULE",
    "WAN21_T2V_TINY_RANDOM",
    "WAN_TINY_RANDOM",
    "WAN_TINY_TAEHV_RANDOM",
    "cards",
]

# Self-Forcing's denoising_step_list on the 1000-step grid, warped with shift 5 by the sampler.
SELF_FORCING_SCHEDULE = ScheduleSpec(timesteps=(1000, 750, 500, 250), flow_shift=5.0)
# Wan2.1's own T2V sampling defaults (generate.py: 50 steps, sample_shift 5, guide_scale 5):
# 50 evenly spaced timesteps from pure noise, warped with shift 5, CFG against an empty prompt.
# Step skipping allowed: neighbouring steps of a 50-step ODE differ little (the premise of
# TeaCache/FBCache, measured in infra/bench/extensions.py); the 4-step schedule above does not.
WAN21_T2V_SCHEDULE = ScheduleSpec(
    timesteps=tuple(range(1000, 0, -20)), flow_shift=5.0, guidance_scale=5.0, step_skipping=True
)

# Wan2.1 VAE: z 16, 4x temporal, 8x spatial; DiT patch (1, 2, 2) -> 1560 tokens at 832x480.
WAN_LATENT = LatentSpec(channels=16, temporal_stride=4, spatial_stride=8, patch=(1, 2, 2))

_GENERATION_COMPONENTS = ("dit", "vae", "text_encoder", "tokenizer")
_PARITY_TOLERANCES = {
    "dit_vs_diffusers": 1e-5,  # max relative error, fp32, random weights
    "vae_vs_diffusers": 1e-4,
    "chunked_rollout_vs_block_causal": 1e-5,
    "chunked_vae_decode_vs_full": 1e-4,
}


def _loops(session_inputs: frozenset[str]) -> dict[str, LoopSpec]:
    return {
        "chunk_rollout": LoopSpec(
            "chunk_rollout",
            LoopKind.CHUNK_ROLLOUT,
            SELF_FORCING_SCHEDULE,
            AttentionMode.CHUNK_CAUSAL,
            components=_GENERATION_COMPONENTS,
            inputs=session_inputs,
            uses=("text_encode", "kv_recache", "vae_decode"),
        ),
        "kv_recache": LoopSpec("kv_recache", LoopKind.KV_RECACHE, components=("dit",)),
        "vae_decode": LoopSpec("vae_decode", LoopKind.VAE_DECODE, components=("vae",)),
        "text_encode": LoopSpec(
            "text_encode", LoopKind.TEXT_ENCODE, components=("text_encoder", "tokenizer")
        ),
    }


def _caches(window_latent_frames: int, sink_latent_frames: int) -> dict[str, CacheContract]:
    return {
        "chunk_kv": CacheContract(
            CacheKind.CHUNK_KV, "dit", window_latent_frames, sink_latent_frames
        ),
        "text_embedding": CacheContract(CacheKind.FEATURE, "text_encoder"),
        "vae_decoder": CacheContract(CacheKind.DECODER_FEATURE, "vae"),
    }


_CAUSAL_CAPABILITIES = frozenset(
    {"session.realtime", "prompt.switch", "prompt.cut", "text_to_video"}
)


def _required(path_hint: str, fmt: CheckpointFormat) -> ComponentEntry:
    return ComponentEntry(path_hint, fmt, required_for=_CAUSAL_CAPABILITIES)


WAN21_13B_CAUSAL = ModelCard(
    model_id="wan2.1-1.3b-causal",
    family="wan",
    description=(
        "Wan2.1-T2V-1.3B distilled to 4-step chunk-causal generation (Self-Forcing, "
        "DMD); 832x480 at 16 fps. External weights: the operator supplies the "
        "checkpoint directory (with madebyollin's taew2_1.pth under tiny_decoder/, sessions "
        "may also pick the tiny streaming decoder)."
    ),
    components={
        "dit": ComponentSpec("dit", ComponentKind.DIT, "wan2.1-1.3b"),
        "vae": ComponentSpec("vae", ComponentKind.VAE, "wan2.1"),
        # a second decoder sessions may pick ("decoder": "tiny"), loaded when it is there
        "tiny_decoder": ComponentSpec("tiny_decoder", ComponentKind.DECODER, "taew2_1"),
        "text_encoder": ComponentSpec("text_encoder", ComponentKind.TEXT_ENCODER, "umt5-xxl"),
        "tokenizer": ComponentSpec("tokenizer", ComponentKind.TOKENIZER, "umt5-xxl"),
    },
    loops=_loops(frozenset({"prompt", "cut"})),
    capabilities=_CAUSAL_CAPABILITIES,
    recipe=RecipeSpec(
        method="self_forcing",
        parents=("wan2.1-t2v-1.3b",),
        data_contract="text prompts only (Self-Forcing trains data-free from prompts; no video)",
        assumes_loop="chunk_rollout",
        assumes_precision="bf16",
        consistency_required=ParityLevel.C1,
    ),
    parity=ParitySpec(ParityLevel.C1, _PARITY_TOLERANCES),
    caches=_caches(window_latent_frames=9, sink_latent_frames=3),
    # fp32 only widens the bf16 recipe (every bf16 weight is exact in fp32); fp16 is excluded.
    precision=PrecisionContract(("bf16", "fp32")),
    checkpoint=CheckpointManifest(
        {
            # Self-Forcing ships the generator in Wan's original layout (``generator.``/``model.``
            # prefixes accepted by the loader); the rest comes from Wan2.1-T2V-1.3B-Diffusers.
            "dit": _required("transformer", CheckpointFormat.ORIGINAL),
            "vae": _required("vae", CheckpointFormat.DIFFUSERS),
            # the published TAEHV layout (models/wan/taehv/checkpoint.py); optional
            "tiny_decoder": ComponentEntry(
                "tiny_decoder", CheckpointFormat.TAEHV, optional_for=_CAUSAL_CAPABILITIES
            ),
            "text_encoder": _required("text_encoder", CheckpointFormat.DIFFUSERS),
            "tokenizer": _required("tokenizer", CheckpointFormat.DIFFUSERS),
        }
    ),
    default_profile=Profile(fps=16, width=832, height=480, chunk_latent_frames=3, steps=4),
    # the small profile (a third of the tokens) is served compiled too, with its CUDA graphs
    compiled_sizes=((480, 272),),
    latent=WAN_LATENT,
    weights=WeightsKind.EXTERNAL,
    weights_version="self-forcing-dmd-v1",
    # Prompts only: the recipe takes no actions or audio, so the card offers no controls.
    ui=CardUI(
        examples=(
            "a lantern-lit canal town at dusk, gentle rain",
            "a red fox running through a snowy pine forest, morning light",
            "waves breaking on a rocky coast under storm clouds",
            "a busy night market with neon signs and steam rising from food stalls",
        )
    ),
)

WAN_TINY_RANDOM = ModelCard(
    model_id="wan-tiny-random",
    family="wan",
    description=(
        "Tiny Wan-architecture preset on CPU. random weights: for tests and "
        "development, shows noise."
    ),
    components={
        "dit": ComponentSpec(
            "dit", ComponentKind.DIT, "tiny", conditioning=frozenset({"action", "audio"})
        ),
        "vae": ComponentSpec("vae", ComponentKind.VAE, "tiny"),
        "text_encoder": ComponentSpec("text_encoder", ComponentKind.TEXT_ENCODER, "umt5-tiny"),
        # Offline byte-level stand-in for the UMT5 vocabulary; see models/wan/text_encoder.py.
        "tokenizer": ComponentSpec("tokenizer", ComponentKind.TOKENIZER, "byte-fallback"),
    },
    loops=_loops(frozenset({"prompt", "cut", "action", "audio"})),
    capabilities=frozenset(
        {
            "session.realtime",
            "prompt.switch",
            "prompt.cut",
            "input.action",
            "input.audio",
            "text_to_video",
            "text_to_image",
        }
    ),
    recipe=RecipeSpec(
        method="random_init",
        parents=(),
        data_contract="none: seeded random initialisation, never trained",
        assumes_loop="chunk_rollout",
        assumes_precision="fp32",
        consistency_required=ParityLevel.C0,
    ),
    parity=ParitySpec(ParityLevel.C1, _PARITY_TOLERANCES),
    caches=_caches(window_latent_frames=6, sink_latent_frames=3),
    precision=PrecisionContract(("fp32", "bf16")),
    checkpoint=CheckpointManifest(),
    default_profile=Profile(fps=8, width=64, height=64, chunk_latent_frames=3, steps=4),
    latent=WAN_LATENT,
    weights=WeightsKind.RANDOM,
    weights_version="random-seed-0",
    # Random weights: every input is wired into the conditioning hooks, the picture is noise.
    ui=CardUI(
        examples=("a lantern-lit canal town at dusk", "a red kite over green hills"),
        controls=(
            Control(ControlKind.KEY, ("w", "a", "s", "d"), "action input (noise: random weights)"),
            Control(ControlKind.MOUSE, ("drag",), "mouse input (noise: random weights)"),
            Control(ControlKind.AUDIO, ("talk",), "audio input (noise: random weights)"),
        ),
    ),
)

_JOB_CAPABILITIES = frozenset({"text_to_video", "text_to_image"})


def _job_loops() -> dict[str, LoopSpec]:
    return {
        "diffusion_denoise": LoopSpec(
            "diffusion_denoise",
            LoopKind.DIFFUSION_DENOISE,
            WAN21_T2V_SCHEDULE,
            AttentionMode.BIDIRECTIONAL,
            components=_GENERATION_COMPONENTS,
            uses=("text_encode", "vae_decode"),
        ),
        "vae_decode": LoopSpec("vae_decode", LoopKind.VAE_DECODE, components=("vae",)),
        "text_encode": LoopSpec(
            "text_encode", LoopKind.TEXT_ENCODE, components=("text_encoder", "tokenizer")
        ),
    }


# A bidirectional card has no chunk-KV: its decode still streams through the causal VAE cache.
_JOB_CACHES = {
    "text_embedding": CacheContract(CacheKind.FEATURE, "text_encoder"),
    "vae_decoder": CacheContract(CacheKind.DECODER_FEATURE, "vae"),
}


def _job_recipe(
    method: str, parents: tuple[str, ...], data_contract: str, precision: str
) -> RecipeSpec:
    return RecipeSpec(
        method=method,
        parents=parents,
        data_contract=data_contract,
        assumes_loop="diffusion_denoise",
        assumes_precision=precision,
        consistency_required=ParityLevel.C1,
    )


def _diffusers(path_hint: str) -> ComponentEntry:
    return ComponentEntry(path_hint, CheckpointFormat.DIFFUSERS, required_for=_JOB_CAPABILITIES)


WAN21_T2V_13B = ModelCard(
    model_id="wan2.1-t2v-1.3b",
    family="wan",
    description=(
        "Wan2.1-T2V-1.3B, the base model: bidirectional attention over the whole clip, "
        "50 flow-matching steps with classifier-free guidance; offline text-to-video "
        "and text-to-image jobs at 832x480, 16 fps. External weights: the operator "
        "points at a Wan2.1-T2V-1.3B-Diffusers directory."
    ),
    components={
        "dit": ComponentSpec("dit", ComponentKind.DIT, "wan2.1-1.3b"),
        "vae": ComponentSpec("vae", ComponentKind.VAE, "wan2.1"),
        "text_encoder": ComponentSpec("text_encoder", ComponentKind.TEXT_ENCODER, "umt5-xxl"),
        "tokenizer": ComponentSpec("tokenizer", ComponentKind.TOKENIZER, "umt5-xxl"),
    },
    loops=_job_loops(),
    capabilities=_JOB_CAPABILITIES,
    recipe=_job_recipe(
        "flow_matching_pretraining",
        (),
        "Wan2.1 pretraining on captioned images and videos (Wan technical report)",
        "bf16",
    ),
    parity=ParitySpec(ParityLevel.C1, _PARITY_TOLERANCES),
    caches=_JOB_CACHES,
    precision=PrecisionContract(("bf16", "fp32")),
    checkpoint=CheckpointManifest(
        {
            # the Wan-AI/Wan2.1-T2V-1.3B-Diffusers layout
            "dit": _diffusers("transformer"),
            "vae": _diffusers("vae"),
            "text_encoder": _diffusers("text_encoder"),
            "tokenizer": _diffusers("tokenizer"),
        }
    ),
    # chunk_latent_frames: for a job only the VAE decode chunk (the DiT sees the whole clip)
    default_profile=Profile(
        fps=16, width=832, height=480, chunk_latent_frames=3, steps=WAN21_T2V_SCHEDULE.steps
    ),
    latent=WAN_LATENT,
    weights=WeightsKind.EXTERNAL,
    weights_version="wan2.1-t2v-1.3b",
    # jobs only: prompts, no live controls
    ui=CardUI(
        examples=(
            "a red fox running through a snowy pine forest, morning light",
            "a lantern-lit canal town at dusk, gentle rain",
            "a hot air balloon drifting over green hills, aerial view",
        )
    ),
)

WAN21_T2V_TINY_RANDOM = ModelCard(
    model_id="wan2.1-t2v-tiny-random",
    family="wan",
    description=(
        "The wan2.1-t2v-1.3b loop and schedule (bidirectional, 50 steps, CFG 5) at "
        "tiny CPU dimensions. random weights: for tests and development, shows noise."
    ),
    components={
        "dit": ComponentSpec("dit", ComponentKind.DIT, "tiny"),
        "vae": ComponentSpec("vae", ComponentKind.VAE, "tiny"),
        "text_encoder": ComponentSpec("text_encoder", ComponentKind.TEXT_ENCODER, "umt5-tiny"),
        "tokenizer": ComponentSpec("tokenizer", ComponentKind.TOKENIZER, "byte-fallback"),
    },
    loops=_job_loops(),
    capabilities=_JOB_CAPABILITIES,
    recipe=_job_recipe(
        "random_init", (), "none: seeded random initialisation, never trained", "fp32"
    ),
    parity=ParitySpec(ParityLevel.C1, _PARITY_TOLERANCES),
    caches=_JOB_CACHES,
    precision=PrecisionContract(("fp32", "bf16")),
    checkpoint=CheckpointManifest(),
    default_profile=Profile(
        fps=8, width=64, height=64, chunk_latent_frames=3, steps=WAN21_T2V_SCHEDULE.steps
    ),
    latent=WAN_LATENT,
    weights=WeightsKind.RANDOM,
    weights_version="random-seed-0",
    ui=CardUI(examples=("a red kite over a beach (noise: random weights)",)),
)


# --------------------------------------------------------------------------------------------
# The same causal cards decoding with a tiny streaming decoder (TAEHV architecture,
# models/wan/taehv/decoder.py) instead of the full VAE: the DiT, its recipe and the loops are
# unchanged;
# ``vae_decode`` names the ``tiny_decoder`` component, so sessions stream with it and its cache
# unless they ask for ``"decoder": "full"``. The full VAE stays a component, optional in the
# manifest: loaded when it is there (sessions may pick it, jobs decode with it), and the
# teacher of ``dreamrt train tiny-decoder``.


def _with_tiny_decoder(
    card: ModelCard, model_id: str, description: str, preset: str, version: str
) -> ModelCard:
    components = {
        **card.components,
        "tiny_decoder": ComponentSpec("tiny_decoder", ComponentKind.DECODER, preset),
    }
    rollout = card.loops["chunk_rollout"]
    uses = tuple("tiny_decoder" if c == "vae" else c for c in rollout.components)
    loops = {
        **card.loops,
        "chunk_rollout": replace(rollout, components=uses),
        "vae_decode": LoopSpec("vae_decode", LoopKind.VAE_DECODE, components=("tiny_decoder",)),
    }
    caches = {
        **card.caches,
        "vae_decoder": CacheContract(CacheKind.DECODER_FEATURE, "tiny_decoder"),
    }
    entries = dict(card.checkpoint.components)
    if entries:  # external weights: the decoder's own file; the full VAE only teaches
        entries["tiny_decoder"] = ComponentEntry(
            "tiny_decoder", CheckpointFormat.TAEHV, required_for=_CAUSAL_CAPABILITIES
        )
        entries["vae"] = ComponentEntry(
            "vae", CheckpointFormat.DIFFUSERS, optional_for=_CAUSAL_CAPABILITIES
        )
    return replace(
        card,
        model_id=model_id,
        description=description,
        components=components,
        loops=loops,
        caches=caches,
        checkpoint=CheckpointManifest(entries),
        weights_version=version,
    )


WAN21_13B_CAUSAL_TAEHV = _with_tiny_decoder(
    WAN21_13B_CAUSAL,
    "wan2.1-1.3b-causal-taehv",
    "wan2.1-1.3b-causal decoding with a tiny streaming decoder (TAEHV architecture) instead "
    "of the full Wan VAE: madebyollin's published taew2_1 weights or one distilled by "
    "dreamrt train tiny-decoder, under tiny_decoder/ of the checkpoint directory; 832x480 at "
    "16 fps, 4 steps. External weights.",
    "taew2_1",
    "self-forcing-dmd-v1+taew2_1",
)

WAN_TINY_TAEHV_RANDOM = _with_tiny_decoder(
    WAN_TINY_RANDOM,
    "wan-tiny-taehv-random",
    "wan-tiny-random decoding with a tiny TAEHV-architecture streaming decoder on CPU. random "
    "weights: for tests and development, shows noise.",
    "tiny",
    "random-seed-0",
)

CARDS: tuple[ModelCard, ...] = (
    WAN21_13B_CAUSAL,
    WAN21_13B_CAUSAL_TAEHV,
    WAN_TINY_RANDOM,
    WAN_TINY_TAEHV_RANDOM,
    WAN21_T2V_13B,
    WAN21_T2V_TINY_RANDOM,
)


def cards() -> tuple[ModelCard, ...]:
    """The Wan family's cards, for the registry."""
    return CARDS
