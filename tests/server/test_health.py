from fastapi.testclient import TestClient

from server.app import create_app


def test_healthz_answers_ok() -> None:
    client = TestClient(create_app(device="cpu"))
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["device"] == "cpu"
