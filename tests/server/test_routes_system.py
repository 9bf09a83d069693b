from fastapi.testclient import TestClient

from server.app import DEFAULT_MODEL
from tests.e2e.test_sessions_e2e import parse_metrics


def test_models_lists_every_card_and_labels_random_weights(client: TestClient) -> None:
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list"
    cards = {c["id"]: c for c in listed["data"]}
    # OpenAI's model fields first, the card's beside them
    assert all(c["object"] == "model" and c["owned_by"] == "dreamrt" for c in cards.values())
    assert all(isinstance(c["created"], int) for c in cards.values())
    tiny = cards["wan-tiny-random"]
    assert (
        tiny["weights"] == "random"
        and tiny["label"] == "random weights"
        and tiny["served"] is False
    )
    assert {"id", "capabilities", "recipe", "default_profile"} <= set(tiny)
    assert tiny["default_profile"]["fps"] == 8 and "input.audio" in tiny["capabilities"]
    served = cards[DEFAULT_MODEL]  # the default card, trained weights: no random label
    assert served["served"] is True and served["weights"] == "trained" and "label" not in served
    assert served["default_profile"]["fps"] == 12 and "input.action" in served["capabilities"]
    assert cards["wan2.1-1.3b-causal"]["served"] is False


def test_models_serve_each_cards_examples_and_controls(client: TestClient) -> None:
    from models import registry

    served = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    for card in registry.list_cards():
        got = served[card.model_id]
        assert got["examples"] == list(card.ui.examples) and got["examples"]
        assert got["controls"] == [
            {"kind": c.kind.value, "inputs": list(c.inputs), "does": c.does}
            for c in card.ui.controls
        ]
    tiny = served[DEFAULT_MODEL]
    assert tiny["examples"][0] == "a red ball on grass"
    assert {"kind": "audio", "inputs": ["talk"], "does": "the sprite pulses with your voice"} in (
        tiny["controls"]
    )
    keys = {k for c in tiny["controls"] if c["kind"] == "key" for k in c["inputs"]}
    assert keys == {"w", "a", "s", "d", "shift"}
    # A card whose recipe takes no actions offers no key or mouse controls.
    assert served["wan2.1-1.3b-causal"]["controls"] == []
    schema = client.get("/openapi.json").json()["components"]["schemas"]["ModelObject"]
    assert {"examples", "controls", "served", "created", "owned_by"} <= set(schema["required"])


def test_one_model_by_id_and_an_unknown_one(client: TestClient) -> None:
    one = client.get(f"/v1/models/{DEFAULT_MODEL}").json()
    listed = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert one == listed[DEFAULT_MODEL] and one["served"] is True
    missing = client.get("/v1/models/no-such-card")
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "no model 'no-such-card'",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


def test_metrics_from_loopback_without_auth_reflect_sessions(client: TestClient) -> None:
    client.post("/v1/sessions", json={"prompt": "a"})
    client.post("/v1/sessions", json={"prompt": "b"})
    client.post("/v1/sessions", json={"prompt": "c"})  # beyond --max-sessions 2
    # TestClient's peer is "testclient", not loopback: metrics then need a token; auth is off here.
    text = client.get("/metrics").text
    m = parse_metrics(text)
    assert m['dreamrt_sessions{state="created"}'] == 2
    assert m['dreamrt_admission_rejections_total{reason="kv_slabs"}'] == 1
    assert (m["dreamrt_kv_slabs_capacity"], m["dreamrt_kv_slabs_free"]) == (2, 0)
    assert m["dreamrt_engine_running_loops"] == 2 and m["dreamrt_frames_sent_total"] == 0
