"""The Program graph is checked before anything is scheduled: every problem of a graph (its
structure, its types, what the card serves) is listed at once, each naming its node or edge."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from models.programs.graph import EdgeKind, NodeKind, Program, ProgramError
from models.programs.presets import PRESETS, preview_and_final, render_moment, resolve
from models.programs.validation import check, problems
from models.registry import get

TAEHV = get("wan-tiny-taehv-random")  # chunk_rollout, decoders full + tiny
BIDIRECTIONAL = get("wan2.1-t2v-tiny-random")  # diffusion_denoise, the full VAE only


def graph(nodes: dict[str, Any], edges: list[tuple[str, str, str]]) -> dict[str, Any]:
    return {"nodes": nodes, "edges": [{"from": a, "to": b, "kind": k} for a, b, k in edges]}


def linear(**loop: Any) -> dict[str, Any]:
    return graph(
        {
            "denoise": {"kind": "loop", **loop},
            "final": {"kind": "decode", "decoder": "full"},
            "video": {"kind": "artifact"},
        },
        [
            ("denoise.latents", "final.latents", "tensor"),
            ("final.frames", "video.frames", "artifact"),
        ],
    )


def test_the_presets_are_valid_programs_on_a_card_with_both_decoders() -> None:
    program = preview_and_final()
    check(program, TAEHV)
    assert program.order() == ["denoise", "preview", "final", "preview_frames", "video"]
    assert program.depth()["video"] == 2
    assert {e.kind for e in program.edges} == set(EdgeKind)
    assert Program.from_dict(program.to_dict()) == program  # the wire form round-trips
    check(render_moment(session="sess_1", chunks=2), TAEHV)
    assert resolve("preview_and_final") == program and set(PRESETS) == {
        "preview_and_final",
        "render_moment",
    }


def test_a_linear_program_is_the_degenerate_case_on_either_kind_of_card() -> None:
    for card in (TAEHV, BIDIRECTIONAL):
        check(Program.from_dict(linear(loop="text_to_video")), card)
    check(Program.from_dict(linear(loop="diffusion_denoise", num_frames=1)), BIDIRECTIONAL)


def test_what_the_card_does_not_serve_is_named() -> None:
    found = problems(preview_and_final(), BIDIRECTIONAL)
    assert found == [
        "node 'preview': decoder 'tiny' is not served by model 'wan2.1-t2v-tiny-random' "
        "(its decoders: ['full'])"
    ]
    found = problems(Program.from_dict(linear(loop="ar_decode")), TAEHV)
    assert len(found) == 1 and "loop 'ar_decode' is not served by model 'wan-tiny-taehv-random'"
    assert "['chunk_rollout']" in found[0]
    t2i = problems(Program.from_dict(linear(loop="text_to_image")), get("wan2.1-1.3b-causal"))
    assert "cannot run 'text_to_image'" in t2i[0]
    moment = problems(Program.from_dict(linear(loop="text_to_video", session="s1")), BIDIRECTIONAL)
    assert any("needs chunk_rollout" in p for p in moment)
    assert any("'chunks' must be >= 1" in p for p in moment)


def test_type_mismatches_unconnected_inputs_and_cycles_are_all_listed() -> None:
    bad = graph(
        {
            "denoise": {"kind": "loop"},
            "a": {"kind": "decode", "decoder": "full"},
            "b": {"kind": "decode", "decoder": "full"},
            "lonely": {"kind": "decode", "decoder": "tiny"},
            "video": {"kind": "artifact", "format": "png"},
            "wrong": {"kind": "stream"},
        },
        [
            ("denoise.latents", "video.frames", "artifact"),  # latents where frames go
            ("a.frames", "b.latents", "tensor"),  # a cycle a -> b -> a, of frames
            ("b.frames", "a.latents", "tensor"),
            ("denoise.latents", "wrong.frames", "tensor"),
            ("denoise.nothing", "a.latents", "tensor"),
        ],
    )
    with pytest.raises(ProgramError) as err:
        check(Program.from_dict(bad), TAEHV)
    found = err.value.problems
    assert err.value.status == 422 and err.value.code == "invalid_program"
    expected = [
        "edge denoise.latents->video.frames: 'latents' carries latents, 'frames' takes frames",
        "edge denoise.latents->video.frames: a artifact edge cannot join denoise.latents",
        "edge a.frames->b.latents: 'frames' carries frames, 'latents' takes latents",
        "edge a.frames->b.latents: a tensor edge cannot join a.frames",
        "edge denoise.latents->wrong.frames: a tensor edge cannot join wrong.frames",
        "edge denoise.nothing->a.latents: loop node 'denoise' has no output 'nothing'",
        "node 'a': input 'latents' is fed by 2 edges",
        "node 'lonely': required input 'latents' is unconnected",
        "the edges between nodes ['a', 'b'] form a cycle",
        "node 'video': format 'png' cannot hold the t2v output of loop 'denoise'",
    ]
    for text in expected:
        assert any(text in p for p in found), (text, found)


def test_malformed_nodes_and_edges_are_refused_while_parsing() -> None:
    with pytest.raises(ProgramError) as err:
        Program.from_dict(
            {
                "nodes": {
                    "d": {"kind": "loop", "prompt": 3, "temperature": 1},
                    "x": {"kind": "teleport"},
                    "bad id": {"kind": "decode"},
                },
                "edges": [{"from": "d", "to": "x.y"}, {"from": "d.a", "to": "x.b", "kind": "wire"}],
                "extra": 1,
            }
        )
    found = err.value.problems
    assert found == [
        "unknown program fields ['extra'] (it has name, nodes, edges)",
        "node 'd': parameter 'prompt' must be str, got 3",
        "node 'd' (loop): unknown parameter 'temperature' (it takes ['adapters', 'chunks', "
        "'guidance_scale', 'height', 'loop', 'negative_prompt', 'num_frames', 'prompt', "
        "'seed', 'session', 'steps', 'width'])",
        "node 'x': kind 'teleport' is not one of ['loop', 'decode', 'artifact', 'stream']",
        "node id 'bad id' must be 1-64 letters, digits, '_' or '-'",
        "edge {'from': 'd', 'to': 'x.y'}: 'from' must be 'node.port'",
        "edge {'from': 'd.a', 'to': 'x.b', 'kind': 'wire'}: kind 'wire' is not one of "
        "['tensor', 'artifact', 'stream']",
    ]
    with pytest.raises(ProgramError, match="unknown program 'nope'"):
        resolve("nope")
    with pytest.raises(ProgramError, match="exactly one artifact"):
        check(
            Program.from_dict(graph({"d": {"kind": "loop"}}, [])),
            TAEHV,
        )
    assert [k.value for k in NodeKind] == ["loop", "decode", "artifact", "stream"]


def test_the_graph_and_its_checks_load_no_torch() -> None:
    assert "models.programs.graph" in sys.modules
    import subprocess

    probe = (
        "import sys; import models.programs.validation, models.programs.presets; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
