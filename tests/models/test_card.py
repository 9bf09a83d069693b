"""models/card/model.py: validation findings, serving checks, public forms, profiles, geometry."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from models.card import (
    CacheContract,
    CardError,
    CardUI,
    CheckpointManifest,
    ComponentEntry,
    ComponentSpec,
    Control,
    LatentSpec,
    LoopSpec,
    ModelCard,
    ParitySpec,
    PrecisionContract,
    Profile,
    ProfileError,
    RecipeMismatchError,
    RecipeSpec,
    ScheduleSpec,
)

SCHEDULE = ScheduleSpec(timesteps=(1000, 750, 500, 250), flow_shift=5.0)
CAPS = frozenset({"session.realtime", "prompt.switch", "input.action", "text_to_video"})


def make_loops(**overrides: LoopSpec) -> dict[str, LoopSpec]:
    loops = {
        "chunk_rollout": LoopSpec(
            "chunk_rollout",
            "chunk_rollout",
            SCHEDULE,
            "chunk_causal",
            components=("dit", "vae", "text_encoder"),
            inputs=frozenset({"prompt", "action"}),
            uses=("vae_decode",),
        ),
        "diffusion_denoise": LoopSpec(
            "diffusion_denoise",
            "diffusion_denoise",
            ScheduleSpec(tuple(range(1000, 0, -20)), 3.0, guidance_scale=5.0),
            "bidirectional",
            components=("dit", "vae"),
        ),
        "vae_decode": LoopSpec("vae_decode", "vae_decode", components=("vae",)),
    }
    loops.update(overrides)
    return loops


def make_card(**overrides: Any) -> ModelCard:
    """A small valid card of a made-up family; keyword overrides replace fields."""
    entry = ComponentEntry("transformer", "diffusers", required_for=CAPS)
    fields: dict[str, Any] = dict(
        model_id="toy-causal",
        family="toy",
        description="a toy causal video model",
        components={
            "dit": ComponentSpec("dit", "dit", "toy", conditioning=frozenset({"action"})),
            "vae": ComponentSpec("vae", "vae", "toy"),
            "text_encoder": ComponentSpec("text_encoder", "text_encoder", "toy", "fp32"),
        },
        loops=make_loops(),
        capabilities=CAPS,
        recipe=RecipeSpec("dmd", ("toy-base",), "prompts only", "chunk_rollout", "bf16", "C1"),
        parity=ParitySpec("C1", {"dit_vs_reference": 1e-5}),
        caches={
            "chunk_kv": CacheContract("chunk_kv", "dit", 6, 3),
            "text": CacheContract("feature", "text_encoder"),
        },
        precision=PrecisionContract(("bf16", "fp32")),
        checkpoint=CheckpointManifest(
            {
                "dit": entry,
                "vae": dataclasses.replace(entry, path_hint="vae"),
                "text_encoder": dataclasses.replace(
                    entry,
                    path_hint="text_encoder",
                    required_for=frozenset(),
                    optional_for=frozenset({"text_to_video"}),
                ),
            }
        ),
        default_profile=Profile(fps=16, width=320, height=192, chunk_latent_frames=3, steps=4),
        latent=LatentSpec(channels=16, temporal_stride=4, spatial_stride=8, patch=(1, 2, 2)),
        weights="external",
        weights_version="toy-v1",
        ui=CardUI(
            examples=("a toy town", "a toy sea"),
            controls=(Control("key", ("w", "s"), "walk"), Control("mouse", ("drag",), "look")),
        ),
    )
    fields.update(overrides)
    return ModelCard(**fields)


def problems_of(card: ModelCard) -> tuple[str, ...]:
    with pytest.raises(CardError) as info:
        card.validate()
    assert info.value.model_id == card.model_id
    assert str(info.value).startswith(f"model card {card.model_id!r} is invalid: ")
    return info.value.problems


def test_factory_card_is_valid():
    card = make_card()
    assert card.validate() is card


# --------------------------------------------------------------------------------------------
# validate(): each inconsistency is one named finding

base = make_card()
CASES = [
    (
        "recipe assumes unknown loop",
        dict(recipe=dataclasses.replace(base.recipe, assumes_loop="ddim_50")),
        "recipe.assumes_loop 'ddim_50' is not one of the card's loops "
        "['chunk_rollout', 'diffusion_denoise', 'vae_decode']",
    ),
    (
        "recipe assumes a helper loop",
        dict(recipe=dataclasses.replace(base.recipe, assumes_loop="vae_decode")),
        "recipe.assumes_loop 'vae_decode' is a vae_decode loop; a recipe assumes a denoising loop",
    ),
    (
        "capability nobody serves",
        dict(capabilities=CAPS | {"input.audio"}),
        "capability 'input.audio' has no loop that serves it (needs one of ['chunk_rollout'] "
        "absorbing 'audio', with the recipe's sampler)",
    ),
    (
        "capability only a loop with another sampler serves",
        dict(
            recipe=dataclasses.replace(base.recipe, assumes_loop="diffusion_denoise"),
            default_profile=dataclasses.replace(base.default_profile, steps=50),
        ),
        "capability 'input.action' has no loop that serves it (needs one of ['chunk_rollout'] "
        "absorbing 'action', with the recipe's sampler)",
    ),
    (
        "unknown capability",
        dict(capabilities=CAPS | {"text_to_speech"}),
        "capability 'text_to_speech' is unknown; known: ['input.action', 'input.audio', "
        "'prompt.cut', 'prompt.switch', 'session.realtime', 'text_to_image', 'text_to_video']",
    ),
    (
        "manifest component not in components",
        dict(
            checkpoint=CheckpointManifest(
                {**base.checkpoint.components, "audio_vae": base.checkpoint.components["vae"]}
            )
        ),
        "checkpoint component 'audio_vae' is not among the card's components "
        "['dit', 'text_encoder', 'vae']",
    ),
    (
        "external weights without a manifest entry",
        dict(
            checkpoint=CheckpointManifest(
                {k: v for k, v in base.checkpoint.components.items() if k != "vae"}
            )
        ),
        "component 'vae' has external weights but no checkpoint manifest entry",
    ),
    (
        "manifest task that is not a capability",
        dict(
            checkpoint=CheckpointManifest(
                {
                    **base.checkpoint.components,
                    "vae": ComponentEntry(
                        "vae", "original", required_for=frozenset({"image_to_video"})
                    ),
                }
            )
        ),
        "checkpoint component 'vae' names task 'image_to_video', which is not a capability",
    ),
    (
        "manifest entry both required and optional",
        dict(
            checkpoint=CheckpointManifest(
                {
                    **base.checkpoint.components,
                    "vae": ComponentEntry(
                        "vae",
                        "diffusers",
                        required_for=CAPS,
                        optional_for=frozenset({"text_to_video"}),
                    ),
                }
            )
        ),
        "checkpoint component 'vae' is both required and optional for ['text_to_video']",
    ),
    (
        "recipe precision not allowed",
        dict(precision=PrecisionContract(("fp32",))),
        "recipe.assumes_precision 'bf16' is not in precision.allowed ['fp32']",
    ),
    (
        "unknown precision",
        dict(precision=PrecisionContract(("bf16", "int3"))),
        "precision 'int3' is unknown; known: ['bf16', 'fp16', 'fp32', 'fp8_e4m3', 'nvfp4']",
    ),
    (
        "parity below what the recipe needs",
        dict(parity=ParitySpec("C0")),
        "parity level C0 is below the recipe's consistency_required C1",
    ),
    (
        "bad tolerance",
        dict(parity=ParitySpec("C1", {"dit": float("nan")})),
        "parity tolerance 'dit'=nan must be finite and > 0",
    ),
    (
        "profile steps differ from the assumed schedule",
        dict(default_profile=dataclasses.replace(base.default_profile, steps=8)),
        "default_profile.steps=8 but loop 'chunk_rollout' has 4 timesteps",
    ),
    (
        "width not a latent multiple",
        dict(default_profile=dataclasses.replace(base.default_profile, width=328)),
        "default_profile.width=328 is not a multiple of 16 (VAE stride x patch)",
    ),
    (
        "KV window smaller than a chunk",
        dict(caches={"chunk_kv": CacheContract("chunk_kv", "dit", 2, 3)}),
        "cache 'chunk_kv': window_latent_frames=2 cannot hold one chunk of 3 latent frames",
    ),
    (
        "feature cache with KV frames",
        dict(caches={"text": CacheContract("feature", "text_encoder", 4, 0)}),
        "cache 'text' (feature) has KV window/sink frames",
    ),
    (
        "cache of an unknown component",
        dict(caches={"vae_state": CacheContract("decoder_feature", "audio_vae")}),
        "cache 'vae_state' belongs to component 'audio_vae', which the card lacks",
    ),
    (
        "loop uses a missing loop and component",
        dict(
            loops=make_loops(
                vae_decode=LoopSpec(
                    "vae_decode", "vae_decode", components=("vae", "upsampler"), uses=("vae_tile",)
                )
            )
        ),
        "loop 'vae_decode' needs component 'upsampler', which the card lacks",
    ),
    (
        "loop uses a missing loop",
        dict(
            loops=make_loops(
                vae_decode=LoopSpec(
                    "vae_decode", "vae_decode", components=("vae",), uses=("vae_tile",)
                )
            )
        ),
        "loop 'vae_decode' uses loop 'vae_tile', which the card lacks",
    ),
    (
        "component pins an unknown precision",
        dict(components={**base.components, "vae": ComponentSpec("vae", "vae", "toy", "fp64")}),
        "component 'vae' pins unknown precision 'fp64'",
    ),
    (
        "component without preset",
        dict(components={**base.components, "vae": ComponentSpec("vae", "vae", "")}),
        "component 'vae' names no preset",
    ),
    (
        "manifest entry for no task and no path",
        dict(
            checkpoint=CheckpointManifest(
                {**base.checkpoint.components, "vae": ComponentEntry("", "diffusers")}
            )
        ),
        "checkpoint component 'vae' is neither required nor optional for any task",
    ),
    (
        "manifest entry without path",
        dict(
            checkpoint=CheckpointManifest(
                {
                    **base.checkpoint.components,
                    "vae": ComponentEntry("", "diffusers", required_for=CAPS),
                }
            )
        ),
        "checkpoint component 'vae' has no path_hint",
    ),
    (
        "negative sink",
        dict(caches={"chunk_kv": CacheContract("chunk_kv", "dit", 6, -1)}),
        "cache 'chunk_kv': sink_latent_frames=-1 < 0",
    ),
    ("no precision allowed", dict(precision=PrecisionContract(())), "precision.allowed is empty"),
    (
        "no recipe method",
        dict(recipe=dataclasses.replace(base.recipe, method="")),
        "recipe.method is empty",
    ),
    ("empty weights version", dict(weights_version=" "), "weights_version is empty"),
    (
        "zero fps",
        dict(default_profile=dataclasses.replace(base.default_profile, fps=0)),
        "default_profile.fps=0 must be >= 1",
    ),
    (
        "loop absorbs action without a hook",
        dict(components={**base.components, "dit": ComponentSpec("dit", "dit", "toy")}),
        "loop 'chunk_rollout' absorbs 'action' but none of its components "
        "['dit', 'vae', 'text_encoder'] has a 'action' hook",
    ),
    (
        "denoising loop without schedule",
        dict(
            loops=make_loops(diffusion_denoise=LoopSpec("diffusion_denoise", "diffusion_denoise"))
        ),
        "loop 'diffusion_denoise' denoises but declares no schedule and attention",
    ),
    (
        "chunk rollout without attention",
        dict(
            loops=make_loops(
                chunk_rollout=dataclasses.replace(base.loops["chunk_rollout"], attention=None)
            )
        ),
        "loop 'chunk_rollout' denoises but declares no schedule and attention",
    ),
    (
        "helper loop with schedule",
        dict(loops=make_loops(vae_decode=LoopSpec("vae_decode", "vae_decode", SCHEDULE))),
        "loop 'vae_decode' (vae_decode) does not denoise but has a schedule",
    ),
    (
        "bidirectional chunk rollout",
        dict(
            loops=make_loops(
                chunk_rollout=dataclasses.replace(
                    base.loops["chunk_rollout"], attention="bidirectional"
                )
            )
        ),
        "loop 'chunk_rollout' is a chunk_rollout but its attention is "
        "bidirectional, not chunk_causal",
    ),
    (
        "schedule out of order",
        dict(
            loops=make_loops(
                diffusion_denoise=dataclasses.replace(
                    base.loops["diffusion_denoise"], schedule=ScheduleSpec((500, 750, 0), 0.0)
                )
            )
        ),
        "loop 'diffusion_denoise': timesteps [500, 750, 0] must strictly decrease",
    ),
    (
        "unknown live input",
        dict(
            loops=make_loops(
                chunk_rollout=dataclasses.replace(
                    base.loops["chunk_rollout"], inputs=frozenset({"prompt", "action", "gaze"})
                )
            )
        ),
        "loop 'chunk_rollout' absorbs unknown input 'gaze'; known: "
        "['action', 'audio', 'cut', 'prompt']",
    ),
    (
        "random weights not labelled",
        dict(weights="random", description="a toy"),
        "a random-weights card must say 'random' in its description",
    ),
    (
        "mismatched component key",
        dict(components={**base.components, "vae": ComponentSpec("decoder", "vae", "toy")}),
        "components['vae'] has component_id 'decoder'",
    ),
    (
        "bad model id",
        dict(model_id="Toy Model"),
        "model_id 'Toy Model' must match ^[a-z0-9][a-z0-9._-]*$",
    ),
    (
        "audio control without input.audio",
        dict(ui=CardUI(("a toy town",), (Control("audio", ("talk",), "sing"),))),
        "ui control 'audio talk: sing' needs 'input.audio', which the card lacks",
    ),
    (
        "key control without input.action",
        dict(
            capabilities=CAPS - {"input.action"},
            checkpoint=CheckpointManifest(
                {
                    k: dataclasses.replace(e, required_for=e.required_for - {"input.action"})
                    for k, e in base.checkpoint.components.items()
                }
            ),
        ),
        "ui control 'key w/s: walk' needs 'input.action', which the card lacks",
    ),
    (
        "blank example",
        dict(ui=CardUI(("a toy town", " "))),
        "ui example ' ' must be non-blank and at most 200 characters",
    ),
    (
        "repeated example",
        dict(ui=CardUI(("a toy town", "a toy town"))),
        "ui.examples repeats a prompt",
    ),
    (
        "control that does nothing",
        dict(ui=CardUI(("a toy town",), (Control("key", ("w",), ""),))),
        "ui control 'key w: ' does not say what it does",
    ),
]


@pytest.mark.parametrize(
    "overrides,expected", [(o, e) for _, o, e in CASES], ids=[name for name, _, _ in CASES]
)
def test_validate_names_the_problem(overrides, expected):
    assert expected in problems_of(make_card(**overrides))


def test_validate_lists_every_problem_at_once():
    card = make_card(
        parity=ParitySpec("C0"),
        precision=PrecisionContract(("fp32",)),
        capabilities=CAPS | {"input.audio"},
    )
    assert problems_of(card) == (
        "recipe.assumes_precision 'bf16' is not in precision.allowed ['fp32']",
        "parity level C0 is below the recipe's consistency_required C1",
        "capability 'input.audio' has no loop that serves it (needs one of ['chunk_rollout'] "
        "absorbing 'audio', with the recipe's sampler)",
    )


def test_schedule_findings_are_complete():
    assert ScheduleSpec((1001, 1001, 0), -1.0, guidance_scale=0.5).problems() == [
        "timesteps [1001, 1001, 0] must lie in (0, 1000]",
        "timesteps [1001, 1001, 0] must strictly decrease",
        "flow_shift=-1.0 must be finite and > 0",
        "guidance_scale=0.5 must be finite and >= 1",
    ]
    assert ScheduleSpec((), 1.0).problems() == ["schedule has no timesteps"]


def test_bad_enum_value_fails_at_construction_naming_the_choices():
    with pytest.raises(
        CardError,
        match=r"component kind='unet' is not one of "
        r"\['dit', 'vae', 'decoder', 'text_encoder', 'tokenizer'\]",
    ):
        ComponentSpec("dit", "unet", "toy")
    with pytest.raises(CardError, match=r"weights='borrowed' is not one of"):
        make_card(weights="borrowed")
    with pytest.raises(CardError, match=r"consistency_required='C9'"):
        RecipeSpec("dmd", (), "", "chunk_rollout", "bf16", "C9")


def test_card_is_immutable():
    card = make_card()
    with pytest.raises(dataclasses.FrozenInstanceError):
        card.model_id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        card.loops["x"] = card.loops["vae_decode"]  # type: ignore[index]
    with pytest.raises(TypeError):
        card.parity.tolerances["dit"] = 1.0  # type: ignore[index]


# --------------------------------------------------------------------------------------------
# check_serving()


def test_serving_under_the_assumed_loop_and_allowed_precisions():
    card = make_card()
    assert card.check_serving("chunk_rollout", "bf16") is card.loops["chunk_rollout"]
    assert card.check_serving("chunk_rollout", "fp32", SCHEDULE).loop_id == "chunk_rollout"
    assert card.check_serving("vae_decode", "bf16").loop_id == "vae_decode"


def test_other_sampler_raises_naming_both_loops():
    with pytest.raises(RecipeMismatchError) as info:
        make_card().check_serving("diffusion_denoise", "bf16")
    err = info.value
    assert (err.model_id, err.requested_loop, err.requested_precision) == (
        "toy-causal",
        "diffusion_denoise",
        "bf16",
    )
    assert (err.assumed_loop, err.assumed_precision) == ("chunk_rollout", "bf16")
    message = str(err)
    assert message.startswith(
        "model 'toy-causal' cannot be served under loop "
        "'diffusion_denoise' at 'bf16': its recipe assumes loop "
        "'chunk_rollout' at 'bf16'"
    )
    assert "requested diffusion_denoise (bidirectional, timesteps [1000, 980," in message
    assert (
        "recipe 'dmd' assumes chunk_rollout (chunk_causal, timesteps [1000, 750, 500, 250], "
        "shift 5, cfg 1)"
    ) in message


def test_schedule_override_raises_naming_both_schedules():
    fifty = ScheduleSpec(tuple(range(1000, 0, -20)), 5.0, guidance_scale=5.0)
    with pytest.raises(
        RecipeMismatchError,
        match=r"requested chunk_rollout \(chunk_causal, "
        r"timesteps \[1000, 980,.*cfg 5\), recipe",
    ):
        make_card().check_serving("chunk_rollout", "bf16", fifty)


def test_sampler_compatible_second_loop_is_servable():
    loops = make_loops(
        diffusion_denoise=dataclasses.replace(
            base.loops["diffusion_denoise"], schedule=SCHEDULE, attention="chunk_causal"
        )
    )
    card = make_card(loops=loops).validate()
    assert card.check_serving("diffusion_denoise", "bf16").loop_id == "diffusion_denoise"


@pytest.mark.parametrize("loop_id", ["chunk_rollout", "vae_decode"])
def test_disallowed_precision_raises_for_any_loop(loop_id):
    with pytest.raises(RecipeMismatchError) as info:
        make_card().check_serving(loop_id, "fp16")
    assert info.value.reason == "precision 'fp16' is not among the card's allowed ['bf16', 'fp32']"
    assert (
        f"under loop {loop_id!r} at 'fp16': its recipe assumes loop 'chunk_rollout' at "
        "'bf16'" in str(info.value)
    )


def test_unknown_loop_raises_listing_the_loops():
    with pytest.raises(
        RecipeMismatchError,
        match=r"the card has no loop 'ddim_50'; its loops: "
        r"\['chunk_rollout', 'diffusion_denoise', 'vae_decode'\]",
    ):
        make_card().check_serving("ddim_50", "bf16")


def test_loop_for_prefers_the_recipe_loop():
    card = make_card()
    assert card.loop_for("text_to_video").loop_id == "chunk_rollout"
    assert card.loop_for("input.action").loop_id == "chunk_rollout"
    assert card.loop_for("text_to_image") is None  # not a capability of this card
    assert card.loop_for("levitation") is None


# --------------------------------------------------------------------------------------------
# public forms, profiles, geometry


def test_to_public_is_json_and_carries_the_api_fields():
    public = make_card().to_public()
    assert json.loads(json.dumps(public)) == public
    assert public["id"] == "toy-causal"
    assert public["capabilities"] == sorted(CAPS)
    assert public["recipe"] == {
        "method": "dmd",
        "parents": ["toy-base"],
        "data_contract": "prompts only",
        "assumes_loop": "chunk_rollout",
        "assumes_precision": "bf16",
        "consistency_required": "C1",
    }
    assert public["default_profile"] == {
        "fps": 16,
        "width": 320,
        "height": 192,
        "chunk_latent_frames": 3,
        "steps": 4,
    }
    assert (public["weights"], public["weights_version"]) == ("external", "toy-v1")
    assert public["loops"] == ["chunk_rollout", "diffusion_denoise", "vae_decode"]
    assert public["components"]["dit"] == {"kind": "dit", "preset": "toy"}
    assert public["examples"] == ["a toy town", "a toy sea"]
    assert public["controls"] == [
        {"kind": "key", "inputs": ["w", "s"], "does": "walk"},
        {"kind": "mouse", "inputs": ["drag"], "does": "look"},
    ]


def test_a_card_without_ui_is_valid_and_serves_empty_lists():
    card = make_card(ui=CardUI())
    assert card.validate() is card
    assert (card.to_public()["examples"], card.to_public()["controls"]) == ([], [])


def test_bad_control_kind_fails_at_construction():
    with pytest.raises(CardError, match="control kind='gaze' is not one of"):
        Control("gaze", ("eyes",), "look")


def test_summary_line_is_one_line_with_the_essentials():
    line = make_card().summary_line()
    assert "\n" not in line
    assert line == (
        "toy-causal  weights=external  recipe=dmd:chunk_rollout@bf16  "
        "profile=320x192@16fps chunk=3 steps=4  "
        "capabilities=input.action,prompt.switch,session.realtime,text_to_video"
    )


def test_resolve_profile_applies_overrides_and_names_bad_fields():
    card = make_card()
    assert card.resolve_profile() == card.default_profile
    assert card.resolve_profile(fps=8, width=640) == Profile(8, 640, 192, 3, 4)
    with pytest.raises(ProfileError, match=r"height: 200 must be a positive multiple of 16") as e:
        card.resolve_profile(height=200)
    assert e.value.field == "height"
    with pytest.raises(ProfileError, match=r"fps: 0 must be >= 1"):
        card.resolve_profile(fps=0)
    with pytest.raises(ProfileError, match=r"width: 0 must be a positive multiple of 16"):
        card.resolve_profile(width=0)


def test_latent_geometry_of_wan_832x480():
    latent = LatentSpec(channels=16, temporal_stride=4, spatial_stride=8, patch=(1, 2, 2))
    assert latent.tokens_per_latent_frame(832, 480) == 1560
    assert latent.pixel_multiple == 16
    frames = [
        latent.pixel_frames(3, includes_first=True),
        latent.pixel_frames(3, includes_first=False),
        latent.pixel_frames(21, includes_first=True),
    ]
    assert frames == [9, 12, 81]


def test_manifest_required_components_per_task():
    manifest = make_card().checkpoint
    assert manifest.required_for("text_to_video") == ("dit", "vae")
    assert manifest.required_for("session.realtime") == ("dit", "vae")
    assert manifest.required_for("text_to_image") == ()


def test_serving_checks_on_an_unvalidated_broken_card_raise_card_error():
    card = make_card(recipe=dataclasses.replace(base.recipe, assumes_loop="ddim_50"))
    with pytest.raises(CardError, match="recipe.assumes_loop 'ddim_50' is not one of"):
        card.check_serving("chunk_rollout", "bf16")
    with pytest.raises(CardError, match="recipe.assumes_loop 'ddim_50' is not one of"):
        card.loop_for("text_to_video")


# --------------------------------------------------------------------------------------------
# the built-in cards' ui: prompts they can draw, controls their loops absorb


def _builtin_cards() -> list[ModelCard]:
    from models import registry

    return registry.list_cards()


@pytest.mark.parametrize("card", _builtin_cards(), ids=lambda c: c.model_id)
def test_every_builtin_card_offers_examples(card: ModelCard):
    assert card.ui.examples, f"{card.model_id} has no example prompts"


@pytest.mark.parametrize("card", _builtin_cards(), ids=lambda c: c.model_id)
def test_builtin_key_controls_name_keys_the_action_input_takes(card: ModelCard):
    from models.loops.inputs import normalize_keys

    session_loop = card.loops.get("chunk_rollout")
    for control in card.ui.controls:
        assert session_loop is not None and control.kind.capability in card.capabilities
        if control.kind.value == "key":
            assert normalize_keys(control.inputs) == list(control.inputs)


def test_builtin_cards_without_actions_offer_no_key_or_mouse_controls():
    for card in _builtin_cards():
        kinds = {c.kind.value for c in card.ui.controls}
        if "input.action" not in card.capabilities:
            assert kinds.isdisjoint({"key", "mouse"}), card.model_id


def test_tiny_world_examples_name_a_colour_a_shape_and_a_terrain_it_draws():
    from models.tinyworld.card import TINY_WORLD
    from models.tinyworld.vocab import COLOURS, SHAPES, TERRAINS, WORDS, parse_prompt, word_ids

    worlds = set()
    for text in TINY_WORLD.ui.examples:
        words = {WORDS[i - 1] for i in word_ids(text, 16) if i}
        assert words & set(COLOURS) and words & set(SHAPES) and words & set(TERRAINS), text
        world = parse_prompt(text)
        # Nothing is left to the defaults: the picture is the one the prompt names.
        assert world.describe() in text, (text, world.describe())
        worlds.add(world)
    assert len(worlds) == len(TINY_WORLD.ui.examples)
    assert TINY_WORLD.ui.examples[0] == "a red ball on grass"
    keys = [i for c in TINY_WORLD.ui.controls if c.kind.value == "key" for i in c.inputs]
    assert set(keys) == {"w", "a", "s", "d", "shift"}
