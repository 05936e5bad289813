"""A Hugging Face Hub on 127.0.0.1 for tests: just the endpoints huggingface_hub and hone.core.hub call.

    GET  /api/models?search=&sort=downloads&limit=&expand=    the search (list_models)
    GET  /api/models/ORG/NAME[/revision/REV][?blobs=true]     one model's card and files (model_info)
    HEAD /ORG/NAME/resolve/REV/FILE                           a file's metadata: ETag, X-Repo-Commit, Content-Length
    GET  /ORG/NAME/resolve/REV/FILE                           its bytes, a `Range: bytes=N-` request answered with 206

Errors carry the headers `huggingface_hub.utils.hf_raise_for_status` reads, as the real Hub sends them: 404 with
`X-Error-Code: RepoNotFound`, `RevisionNotFound` or `EntryNotFound`; a gated model's files answer 401 without a token
and 403 with one that was not granted access, with `X-Error-Code: GatedRepo`.

    with FakeHub() as hub:
        hub.add_model("org/tiny", {"config.json": b"{}"}, downloads=10, license="mit")
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

_API_MODEL = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?/?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
BYTES_PER_DTYPE = {"F32": 4, "BF16": 2, "F16": 2, "I8": 1}


@dataclass
class FakeModel:
    """One model repository: its files (name -> bytes) and what the search shows of it."""

    repo_id: str
    files: dict[str, bytes]
    downloads: int = 0
    likes: int = 0
    license: str = ""
    gated: bool | str = False
    pipeline_tag: str = "text-generation"
    parameters: dict[str, int] = field(default_factory=dict)  # safetensors dtype -> parameter count
    last_modified: str = "2025-01-02T03:04:05.000Z"
    sha: str = ""

    def __post_init__(self):
        if not self.sha:
            self.sha = hashlib.sha1(self.repo_id.encode()).hexdigest()

    def etag(self, name: str) -> str:
        """The file's ETag: its sha256, as the Hub gives for LFS files."""
        return hashlib.sha256(self.files[name]).hexdigest()

    def summary(self) -> dict:
        data = {"id": self.repo_id, "_id": self.sha[:24], "modelId": self.repo_id, "downloads": self.downloads,
                "likes": self.likes, "gated": self.gated, "pipeline_tag": self.pipeline_tag,
                "lastModified": self.last_modified, "library_name": "transformers", "private": False,
                "tags": ["transformers", "safetensors"] + ([f"license:{self.license}"] if self.license else [])}
        if self.parameters:
            data["safetensors"] = {"parameters": dict(self.parameters), "total": sum(self.parameters.values())}
        return data

    def info(self, blobs: bool) -> dict:
        siblings = []
        for name, content in self.files.items():
            sibling = {"rfilename": name}
            if blobs:
                sibling.update(size=len(content), blobId=hashlib.sha1(content).hexdigest())
                if name.endswith(".safetensors"):
                    sibling["lfs"] = {"size": len(content), "sha256": self.etag(name), "pointerSize": 134}
            siblings.append(sibling)
        return {**self.summary(), "sha": self.sha, "siblings": siblings,
                "cardData": {"license": self.license} if self.license else {}}


class FakeHub:
    """The server: `add_model` repositories, read `url`, and see what was asked in `requests` (method, path,
    headers). `token` is the one token the gated models accept."""

    def __init__(self, token: str = "hf_granted_token"):
        self.models: dict[str, FakeModel] = {}
        self.token = token
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def add_model(self, repo_id: str, files: dict[str, bytes], **kwargs) -> FakeModel:
        model = FakeModel(repo_id, files, **kwargs)
        self.models[repo_id] = model
        return model

    @property
    def url(self) -> str:
        assert self._server is not None, "start the hub first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-hub",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def ranges(self, file: str) -> list[str]:
        """The Range headers of the GET requests for `file` (empty strings for whole-file requests)."""
        return [headers.get("range", "") for method, path, headers in self.requests
                if method == "GET" and "/resolve/" in path and unquote(path).endswith("/" + file)]


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: pytest shows failures, not every request
        pass

    def do_GET(self) -> None:
        self._route(body=True)

    def do_HEAD(self) -> None:
        self._route(body=False)

    def _route(self, body: bool) -> None:
        parts = urlsplit(self.path)
        path, query = unquote(parts.path), parse_qs(parts.query)
        self.hub.requests.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        if path == "/api/models":
            return self._search(query)
        if found := _API_MODEL.match(path):
            return self._model_info(found["repo"], found["rev"], query)
        if found := _RESOLVE.match(path):
            return self._resolve(found["repo"], found["rev"], found["file"], body)
        return self._error(404, "", "Not Found")

    def _search(self, query: dict[str, list[str]]) -> None:
        text = query.get("search", [""])[0].lower()
        found = [m for m in self.hub.models.values() if text in m.repo_id.lower()]
        if query.get("sort", [""])[0] == "downloads":
            found.sort(key=lambda m: -m.downloads)
        limit = int(query.get("limit", ["1000"])[0])
        self._json([m.summary() for m in found[:limit]])

    def _model_info(self, repo: str, revision: str | None, query: dict[str, list[str]]) -> None:
        model = self._repo(repo, revision)
        if model is not None:
            self._json(model.info(blobs=query.get("blobs", [""])[0].lower() == "true"))

    def _resolve(self, repo: str, revision: str, file: str, body: bool) -> None:
        model = self._repo(repo, revision)
        if model is None:
            return
        if model.gated:
            given = self.headers.get("Authorization", "")
            if given != f"Bearer {self.hub.token}":
                status = 403 if given else 401
                return self._error(status, "GatedRepo", f"Access to model {repo} is restricted. You must have access "
                                   "to it and be authenticated to access it. Please log in.", body, model.sha)
        if file not in model.files:
            return self._error(404, "EntryNotFound", f"{file} does not exist on \"{revision}\"", body, model.sha)
        content = model.files[file]
        start, status = 0, 200
        asked = self.headers.get("Range", "")
        if body and (ranged := re.fullmatch(r"bytes=(\d+)-", asked.strip())):
            start, status = int(ranged.group(1)), 206
            if start >= len(content):
                return self._error(416, "", "Range Not Satisfiable", body, model.sha)
        self.send_response(status)
        self.send_header("ETag", f'"{model.etag(file)}"')
        self.send_header("X-Repo-Commit", model.sha)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(content) - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
        self.end_headers()
        if body:
            self.wfile.write(content[start:])

    def _repo(self, repo: str, revision: str | None) -> FakeModel | None:
        model = self.hub.models.get(repo)
        if model is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if revision not in (None, "main", model.sha):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", sha=model.sha)
            return None
        return model

    def _json(self, data) -> None:
        payload = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _error(self, status: int, code: str, message: str, body: bool = True, sha: str = "") -> None:
        payload = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if sha:
            self.send_header("X-Repo-Commit", sha)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body:
            self.wfile.write(payload)


class MemoryKeyring:
    """An OS keyring stand-in (a dict), installed by `use_fake_hub` so tests never touch the real one."""

    priority = 1

    def __init__(self):
        self.entries: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.entries.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.entries[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.entries.pop((service, username))


def use_fake_hub(monkeypatch, tmp_path, store: MemoryKeyring | None = None) -> FakeHub:
    """Start a FakeHub and point this test's Hub settings at it: HF_ENDPOINT and huggingface_hub's own defaults (read
    when it was imported; transformers' loader uses them), an empty cache and HF_HOME under `tmp_path`, offline mode
    off (tests/conftest.py turns it on for the session), no HF_TOKEN, no saved login, and an in-memory keyring
    (`store`, or an empty one). Looking up any host but 127.0.0.1 fails, so nothing reaches the network.
    The caller stops the hub (`request.addfinalizer(hub.stop)`)."""
    import socket

    import keyring.core
    from huggingface_hub import constants

    hub = FakeHub().start()
    cache = tmp_path / "hf-home" / "hub"
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    resolve = socket.getaddrinfo

    def loopback_only(host, *args, **kwargs):
        if host not in ("127.0.0.1", "localhost"):
            raise socket.gaierror(f"tests reach no host but 127.0.0.1 (asked for {host})")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", loopback_only)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))
    monkeypatch.setattr(keyring.core, "_keyring_backend", store if store is not None else MemoryKeyring())
    return hub


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
