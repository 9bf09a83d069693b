from fastapi.testclient import TestClient

from server.app import DEFAULT_MODEL, create_app


def test_healthz_answers_ok_with_the_served_model_and_device(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "model": DEFAULT_MODEL, "device": "cpu"}


def test_healthz_says_starting_before_the_lifespan_ran(tmp_path) -> None:
    bare = TestClient(create_app(data_dir=tmp_path, device="cpu"))  # no `with`: no lifespan
    assert bare.get("/healthz").json()["status"] == "starting"
    assert bare.get("/v1/models").status_code == 503
