"""The `hf` source against a local server that answers like the Hugging Face Hub.

huggingface_hub's hf_hub_download makes a HEAD on {endpoint}/{repo}/resolve/{revision}/{file}
(reading X-Repo-Commit, ETag, Content-Length) and then a GET, resuming with a Range header when
the connection drops. The server below implements exactly that, on 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from model_files import VOCAB_A, write_gguf

from specdec_cli.errors import ChecksumError, FetchError
from specdec_cli.models.resolve import resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "acme/tiny-GGUF"
FILE = "tiny-q4.gguf"


class FakeHub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.files = files  # "repo/filename" -> content
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Range
        self.authorizations: list[str | None] = []  # each request's Authorization header
        self.drop_next_get_after: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class HubHandler(BaseHTTPRequestHandler):
    server: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def _answer(self, send_body: bool) -> None:
        self.server.requests.append((self.command, self.path, self.headers.get("Range")))
        self.server.authorizations.append(self.headers.get("Authorization"))
        content = self._lookup()
        if content is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = self._range_start()
        body = content[start:]
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(content).hexdigest()}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(body)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
        self.end_headers()
        if send_body:
            self._send_body(body)

    def _send_body(self, body: bytes) -> None:
        cut = self.server.drop_next_get_after
        if cut is None:
            self.wfile.write(body)
            return
        self.server.drop_next_get_after = None
        self.wfile.write(body[:cut])
        self.wfile.flush()
        self.close_connection = True  # the server "drops" the connection mid-file

    def _lookup(self) -> bytes | None:
        prefix = f"/{REPO}/resolve/"
        if not self.path.startswith(prefix):
            return None
        _revision, _, filename = self.path[len(prefix) :].partition("/")
        return self.server.files.get(f"{REPO}/{filename}")

    def _range_start(self) -> int:
        value = self.headers.get("Range")
        if not value or not value.startswith("bytes="):
            return 0
        return int(value[len("bytes=") :].split("-")[0])


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Yields a function starting a FakeHub serving given bytes, with the hub env set up."""
    servers: list[FakeHub] = []
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "specdec-home"))
    # huggingface_hub reads its environment once, at import (HF_HOME, the token file's path,
    # HF_HUB_OFFLINE): import it only now, under this test's caches, and pin what it read,
    # whoever imported it first: these tests start online (specdec reads HF_HUB_OFFLINE at
    # call time) and never see the user's token.
    import huggingface_hub.constants as hub_constants

    for name in ("HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(
        hub_constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens")
    )
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")

    def start(content: bytes) -> FakeHub:
        server = FakeHub({f"{REPO}/{FILE}": content})
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def registry_file(tmp_path: Path, content: bytes, *, sha256: str | None = None) -> Path:
    digest = sha256 or hashlib.sha256(content).hexdigest()
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n"
        "  hub-tiny:\n"
        "    family: tiny\n"
        f"    size: {len(content)}\n"
        f"    sha256: {digest}\n"
        "    sources:\n"
        f"      - hf: {{repo: {REPO}, file: {FILE}}}\n"
    )
    return path


class CountingProgress:
    def __init__(self) -> None:
        self.bytes = 0
        self.labels: list[str] = []
        self.notes: list[str] = []

    def start(self, label: str, total: int | None) -> None:
        self.labels.append(label)

    def advance(self, nbytes: int) -> None:
        self.bytes += nbytes

    def finish(self) -> None:
        pass

    def note(self, message: str) -> None:
        self.notes.append(message)


@pytest.fixture
def tiny_bytes(tmp_path: Path) -> bytes:
    return write_gguf(tmp_path / "src.gguf", VOCAB_A).read_bytes()


def blobs(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "hub-cache").rglob("blobs/*") if p.is_file()]


def test_clean_download_lands_in_the_hub_cache(tmp_path, hub_env, tiny_bytes):
    hub = hub_env(tiny_bytes)
    progress = CountingProgress()

    model = resolve_model(
        "hub-tiny", models_file=registry_file(tmp_path, tiny_bytes), progress=progress
    )

    assert model.path.read_bytes() == tiny_bytes
    assert (tmp_path / "hub-cache") in model.path.parents
    assert f"snapshots/{COMMIT}" in model.path.as_posix()
    assert progress.bytes == len(tiny_bytes)
    assert ("GET", f"/{REPO}/resolve/main/{FILE}", None) in hub.requests
    # whatever token the user has (HF_TOKEN, their token file) stays out of the tests
    assert hub.authorizations and not any(hub.authorizations)


def test_second_resolve_uses_the_cache_without_network(tmp_path, hub_env, tiny_bytes):
    hub = hub_env(tiny_bytes)
    models_file = registry_file(tmp_path, tiny_bytes)
    first = resolve_model("hub-tiny", models_file=models_file)
    seen = len(hub.requests)

    again = resolve_model("hub-tiny", models_file=models_file)

    assert again.path == first.path
    assert len(hub.requests) == seen


def test_dropped_connection_resumes_with_a_range_request(tmp_path, hub_env):
    # huggingface_hub hands data over in 10 MiB chunks: drop after more than one chunk so
    # that the resumed request starts past zero.
    content = write_gguf(tmp_path / "big.gguf", VOCAB_A, n_params=3_300_000).read_bytes()
    hub = hub_env(content)
    cut = 11 * 1024 * 1024
    hub.drop_next_get_after = cut

    model = resolve_model("hub-tiny", models_file=registry_file(tmp_path, content))

    assert model.path.read_bytes() == content
    ranges = [rng for method, _, rng in hub.requests if method == "GET"]
    assert ranges[0] is None
    assert ranges[1] == f"bytes={10 * 1024 * 1024}-"


def test_checksum_mismatch_deletes_the_download(tmp_path, hub_env, tiny_bytes):
    hub_env(tiny_bytes)
    models_file = registry_file(tmp_path, tiny_bytes, sha256="f" * 64)

    with pytest.raises(ChecksumError, match="deleted"):
        resolve_model("hub-tiny", models_file=models_file)

    assert blobs(tmp_path) == []
    assert not list((tmp_path / "hub-cache").rglob(FILE))


def test_offline_with_a_cached_file_needs_no_server(tmp_path, hub_env, tiny_bytes, monkeypatch):
    hub = hub_env(tiny_bytes)
    models_file = registry_file(tmp_path, tiny_bytes)
    cached = resolve_model("hub-tiny", models_file=models_file).path
    hub.shutdown()
    seen = len(hub.requests)

    assert resolve_model("hub-tiny", models_file=models_file, offline=True).path == cached
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("hub-tiny", models_file=models_file).path == cached
    assert len(hub.requests) == seen


@pytest.mark.parametrize("how", ["flag", "env"])
def test_offline_without_a_cached_file_says_so(tmp_path, hub_env, tiny_bytes, monkeypatch, how):
    hub = hub_env(tiny_bytes)
    if how == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    with pytest.raises(FetchError, match="not downloaded and offline"):
        resolve_model(
            "hub-tiny", models_file=registry_file(tmp_path, tiny_bytes), offline=how == "flag"
        )

    assert hub.requests == []
    assert blobs(tmp_path) == []


def test_missing_file_on_the_hub_is_a_fetch_error(tmp_path, hub_env, tiny_bytes):
    hub = hub_env(tiny_bytes)
    hub.files.clear()

    with pytest.raises(FetchError, match=REPO):
        resolve_model("hub-tiny", models_file=registry_file(tmp_path, tiny_bytes))


def test_a_present_later_source_wins_without_contacting_the_hub(tmp_path, hub_env, tiny_bytes):
    hub = hub_env(tiny_bytes)
    local = tmp_path / "local.gguf"
    local.write_bytes(tiny_bytes)
    models_file = registry_file(tmp_path, tiny_bytes)
    models_file.write_text(models_file.read_text() + f"      - path: {local}\n")

    assert resolve_model("hub-tiny", models_file=models_file).path == local
    assert hub.requests == []
