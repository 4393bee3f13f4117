"""Who may talk to `specdec serve` (serve/guard.py): Host and Origin checks against DNS
rebinding and cross-origin pages, JSON bodies only, CORS refused unless allowed, and 405 with
Allow. On the app itself, in process: no model is loaded, and a refused request never reaches
a route (a route that would generate is replaced by one that counts its calls)."""

from __future__ import annotations

import io

import pytest
from fakes import decode_request
from starlette.testclient import TestClient

from specdec_cli.serve.guard import Guard
from specdec_cli.serve.launch import ServeOptions
from specdec_cli.serve.model_thread import Failure, ServeError
from specdec_cli.serve.render_serve import RequestLog
from specdec_cli.serve.server import ServerState, create_app

LOOPBACK = "http://127.0.0.1:8080"
PAGE = "https://attacker.example"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class CountingModelThread:
    """Stands in for the model thread: counts the jobs that reach it, refuses them all."""

    def __init__(self) -> None:
        self.submitted = 0

    def submit(self, job) -> None:
        self.submitted += 1
        raise ServeError(Failure.QUEUE_FULL, "The queue is full.")


def client(guard: Guard) -> tuple[TestClient, CountingModelThread, io.StringIO]:
    log = io.StringIO()
    model_thread = CountingModelThread()
    state = ServerState(model_thread, decode_request(), log=RequestLog(log, json_lines=False))  # type: ignore[arg-type]
    return TestClient(create_app(state, guard), base_url=LOOPBACK), model_thread, log


def loopback_guard(**allowed) -> Guard:
    return ServeOptions(**allowed).guard()


def test_a_rebound_host_is_refused_on_loopback():
    test, model, log = client(loopback_guard())
    for host in ("attacker.example", "attacker.example:8080", "10.0.0.5", "[fe80::1]:8080"):
        response = test.post("/v1/chat/completions", json=CHAT, headers={"Host": host})
        assert response.status_code == 403, host
        assert response.json()["error"]["code"] == "host_not_allowed"
    assert model.submitted == 0
    assert "403" in log.getvalue()


@pytest.mark.parametrize(
    "host", ["localhost:8080", "127.0.0.1", "127.0.0.2:9", "[::1]:8080", "app.localhost"]
)
def test_loopback_hosts_are_answered(host):
    test, _, _ = client(loopback_guard())
    assert test.get("/v1/models", headers={"Host": host}).status_code == 200


def test_allowed_hosts_and_other_binds():
    test, _, _ = client(loopback_guard(allowed_hosts=("proxy.internal",)))
    assert test.get("/v1/models", headers={"Host": "proxy.internal:443"}).status_code == 200
    exposed, _, _ = client(ServeOptions(host="0.0.0.0").guard())  # the user opened it on purpose
    assert exposed.get("/v1/models", headers={"Host": "box.lan:8080"}).status_code == 200


def test_a_page_cannot_make_it_generate():
    # what a browser sends for a "simple" cross-origin POST: no preflight, text/plain
    test, model, _ = client(loopback_guard())
    simple = {"Origin": PAGE, "Content-Type": "text/plain"}
    response = test.post("/v1/chat/completions", content=str(CHAT), headers=simple)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in response.headers
    preflight = test.options(
        "/v1/chat/completions",
        headers={"Origin": PAGE, "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 403
    assert model.submitted == 0


def test_a_body_must_be_json():
    test, model, _ = client(loopback_guard())
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        response = test.post(
            "/v1/completions", content=b'{"prompt": "x"}', headers={"Content-Type": content_type}
        )
        assert response.status_code == 415, content_type
    assert model.submitted == 0
    for content_type in ("application/json", "application/json; charset=utf-8"):
        response = test.post(
            "/v1/completions", content=b'{"prompt": "x"}', headers={"Content-Type": content_type}
        )
        assert response.status_code == 503  # reached the (counting) model thread
    assert model.submitted == 2


def test_an_allowed_origin_gets_cors():
    origin = "http://localhost:5173"
    test, _, _ = client(loopback_guard(allowed_origins=(origin,)))
    response = test.get("/v1/models", headers={"Origin": origin})
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == origin
    preflight = test.options(
        "/v1/chat/completions",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 204
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "Authorization" in preflight.headers["access-control-allow-headers"]
    other = test.get("/v1/models", headers={"Origin": "http://localhost:9999"})
    assert other.status_code == 403
    anyone, _, _ = client(loopback_guard(allowed_origins=("*",)))
    assert anyone.get("/v1/models", headers={"Origin": PAGE}).status_code == 200


def test_a_wrong_method_gets_405_with_allow():
    test, _, _ = client(loopback_guard())
    response = test.delete("/v1/models")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET"
    post_only = test.get("/v1/chat/completions")
    assert post_only.status_code == 405 and post_only.headers["allow"] == "POST"
    assert post_only.json()["error"]["message"].startswith("Invalid method")
