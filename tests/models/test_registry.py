"""models/registry.py and the Wan cards it registers (models/wan/card.py); the tinyworld card
has its own tests (tests/models/tinyworld/test_card.py)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from models import registry
from models.card import CardError, RecipeMismatchError, ScheduleSpec, WeightsKind
from models.registry import CardRegistry, UnknownModelError, builtin_registry

REPO = Path(__file__).resolve().parents[2]
WAN_IDS = [
    "wan-tiny-random",
    "wan-tiny-taehv-random",
    "wan2.1-1.3b-causal",
    "wan2.1-1.3b-causal-taehv",
    "wan2.1-t2v-1.3b",
    "wan2.1-t2v-tiny-random",
]
BUILTIN_IDS = ["tiny-world", *WAN_IDS]


def test_builtin_cards_are_listed_sorted_and_found_by_id():
    cards = registry.list_cards()
    assert [c.model_id for c in cards] == BUILTIN_IDS
    assert registry.get("wan2.1-1.3b-causal") is cards[3]
    assert len(builtin_registry()) == 7 and "wan-tiny-random" in builtin_registry()


def test_unknown_model_lists_the_known_ids():
    with pytest.raises(UnknownModelError) as info:
        registry.get("wan2.2-5b")
    assert info.value.known == tuple(BUILTIN_IDS)
    assert str(info.value) == (f"unknown model 'wan2.2-5b'; known models: {BUILTIN_IDS}")


def test_register_validates_and_refuses_duplicates():
    reg = CardRegistry()
    tiny = registry.get("wan-tiny-random")
    broken = dataclasses.replace(tiny, model_id="broken", capabilities=frozenset({"telepathy"}))
    with pytest.raises(CardError, match="capability 'telepathy' is unknown"):
        reg.register(broken)
    assert reg.register(tiny) is tiny
    with pytest.raises(CardError, match="a card with id 'wan-tiny-random' is already registered"):
        reg.register(tiny)
    assert [c.model_id for c in reg.list_cards()] == ["wan-tiny-random"]


def test_builtin_registry_is_fresh_each_time():
    mine = builtin_registry()
    extra = dataclasses.replace(registry.get("wan-tiny-random"), model_id="wan-tiny-copy")
    mine.register(extra)
    assert "wan-tiny-copy" in mine
    assert [c.model_id for c in registry.list_cards()] == BUILTIN_IDS


def test_registry_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from models import registry\n"
        "print(len(registry.list_cards()), 'transformers' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, "7 False"), done.stderr


# --------------------------------------------------------------------------------------------
# the Wan cards


def test_causal_card_is_the_self_forcing_recipe():
    card = registry.get("wan2.1-1.3b-causal")
    r = card.recipe
    assert (r.method, r.parents, r.assumes_loop, r.assumes_precision) == (
        "self_forcing",
        ("wan2.1-t2v-1.3b",),
        "chunk_rollout",
        "bf16",
    )
    rollout = card.loops["chunk_rollout"]
    assert rollout.schedule == ScheduleSpec((1000, 750, 500, 250), 5.0)
    p = card.default_profile
    assert (p.width, p.height, p.fps, p.chunk_latent_frames, p.steps) == (832, 480, 16, 3, 4)
    kv = card.caches["chunk_kv"]
    assert (kv.component, kv.window_latent_frames, kv.sink_latent_frames) == ("dit", 9, 3)
    assert card.weights is WeightsKind.EXTERNAL
    assert card.capabilities == {"session.realtime", "prompt.switch", "prompt.cut", "text_to_video"}
    assert set(card.checkpoint.components) >= {"dit", "vae", "text_encoder"}
    assert card.checkpoint.required_for("session.realtime") == (
        "dit",
        "text_encoder",
        "tokenizer",
        "vae",
    )
    assert card.latent.tokens_per_latent_frame(p.width, p.height) == 1560
    assert card.components["dit"].preset == "wan2.1-1.3b"


def test_causal_card_refuses_other_samplers_and_fp16():
    card = registry.get("wan2.1-1.3b-causal")
    assert card.check_serving("chunk_rollout", "bf16").loop_id == "chunk_rollout"
    assert card.loop_for("text_to_video").loop_id == "chunk_rollout"  # jobs too, by the card
    with pytest.raises(
        RecipeMismatchError,
        match=r"at 'fp16': its recipe assumes loop "
        r"'chunk_rollout' at 'bf16'",
    ):
        card.check_serving("chunk_rollout", "fp16")
    fifty = ScheduleSpec(tuple(range(1000, 0, -20)), 5.0, guidance_scale=5.0)
    with pytest.raises(RecipeMismatchError, match=r"recipe 'self_forcing' assumes chunk_rollout"):
        card.check_serving("chunk_rollout", "bf16", fifty)
    with pytest.raises(RecipeMismatchError, match=r"no loop 'diffusion_denoise'"):
        card.check_serving("diffusion_denoise", "bf16")  # no hidden job loop


def test_tiny_card_is_labelled_random_and_has_the_hooks():
    card = registry.get("wan-tiny-random")
    assert card.weights is WeightsKind.RANDOM
    assert "random weights: for tests and development, shows noise" in card.description
    assert set(card.loops) == set(registry.get("wan2.1-1.3b-causal").loops)
    p = card.default_profile
    assert (p.width, p.height, p.fps) == (64, 64, 8)
    assert {"input.action", "input.audio", "text_to_video", "text_to_image"} <= card.capabilities
    assert card.components["dit"].conditioning == {"action", "audio"}
    assert card.loops["chunk_rollout"].inputs == {"prompt", "cut", "action", "audio"}
    assert card.check_serving("chunk_rollout", "fp32").loop_id == "chunk_rollout"
    assert card.loop_for("text_to_image").loop_id == "chunk_rollout"


def test_public_forms_of_the_builtin_cards():
    for card in registry.list_cards():
        public = card.to_public()
        assert json.loads(json.dumps(public)) == public
        assert {"id", "capabilities", "recipe", "default_profile", "weights"} <= set(public)
        assert card.summary_line().startswith(f"{card.model_id}  weights={public['weights']}  ")


def test_component_presets_exist_in_the_family_tables():
    from models.wan.dit.config import WanDiTConfig
    from models.wan.text_encoder import UMT5_PRESETS
    from models.wan.vae.config import WanVAEConfig

    for card in registry.list_cards():
        if card.family != "wan":  # other families build from their own tables
            continue
        c = card.components
        dit = WanDiTConfig.preset(c["dit"].preset)
        vae = WanVAEConfig.preset(c["vae"].preset)
        assert c["text_encoder"].preset in UMT5_PRESETS
        assert c["tokenizer"].preset in {"umt5-xxl", "byte-fallback"}
        assert (vae.z_dim, vae.temporal_factor, vae.spatial_factor) == (
            card.latent.channels,
            card.latent.temporal_stride,
            card.latent.spatial_stride,
        )
        assert dit.patch_size == card.latent.patch
        if "tiny_decoder" in c:  # a tiny decoder reads the same latents, writes the same frames
            from models.wan.taehv.config import TAEHVConfig

            tiny = TAEHVConfig.preset(c["tiny_decoder"].preset)
            assert (tiny.latent_channels, tiny.temporal_factor, tiny.spatial_factor) == (
                card.latent.channels,
                card.latent.temporal_stride,
                card.latent.spatial_stride,
            )
