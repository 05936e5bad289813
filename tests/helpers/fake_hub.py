"""A Hugging Face Hub on 127.0.0.1 for tests: just the endpoints huggingface_hub and hone.core.hub call.

    GET  /api/models?search=&sort=downloads&limit=&expand=    the search (list_models)
    GET  /api/models/ORG/NAME[/revision/REV][?blobs=true]     one model's card and files (model_info)
    HEAD /ORG/NAME/resolve/REV/FILE                           a file's metadata: ETag, X-Repo-Commit, Content-Length
    GET  /ORG/NAME/resolve/REV/FILE                           its bytes, a `Range: bytes=N-` request answered with 206
    GET  /api/whoami-v2                                       the account a token belongs to (`add_user`)
    POST /api/repos/create                                    a new model repository (409 when it exists)
    POST /api/validate-yaml                                   a README's metadata: always valid here
    POST /api/models/ORG/NAME/preupload/REV                   "regular" for every file (and the oid of one there)
    POST /api/models/ORG/NAME/commit/REV                      the NDJSON commit: base64 files stored byte for byte

Pushing needs a token `add_user` made with write=True whose user (or one of its orgs) owns the namespace: an unknown
token is answered 401, a read token or another namespace 403. The fake answers every preupload with "regular", so
huggingface_hub sends every file's bytes base64 inside the commit and no LFS or Xet upload happens; an `lfsFile`
line in a commit is refused (400). Pushed files land in `models[repo].files` and each commit in `commits`.

Errors carry the headers `huggingface_hub.utils.hf_raise_for_status` reads, as the real Hub sends them: 404 with
`X-Error-Code: RepoNotFound`, `RevisionNotFound` or `EntryNotFound`; a gated model's files answer 401 without a token
and 403 with one that was not granted access, with `X-Error-Code: GatedRepo`.

    with FakeHub() as hub:
        hub.add_model("org/tiny", {"config.json": b"{}"}, downloads=10, license="mit")
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

_API_MODEL = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?/?$")
_WRITE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<action>preupload|commit)/(?P<rev>[^/]+)$")
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
    private: bool = False

    def __post_init__(self):
        if not self.sha:
            self.sha = hashlib.sha1(self.repo_id.encode()).hexdigest()

    def etag(self, name: str) -> str:
        """The file's ETag: its sha256, as the Hub gives for LFS files."""
        return hashlib.sha256(self.files[name]).hexdigest()

    def summary(self) -> dict:
        data = {
            "id": self.repo_id,
            "_id": self.sha[:24],
            "modelId": self.repo_id,
            "downloads": self.downloads,
            "likes": self.likes,
            "gated": self.gated,
            "pipeline_tag": self.pipeline_tag,
            "lastModified": self.last_modified,
            "library_name": "transformers",
            "private": self.private,
            "tags": ["transformers", "safetensors"] + ([f"license:{self.license}"] if self.license else []),
        }
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
        return {
            **self.summary(),
            "sha": self.sha,
            "siblings": siblings,
            "cardData": {"license": self.license} if self.license else {},
        }


@dataclass(frozen=True)
class FakeUser:
    """An account a token belongs to: its name, the organizations it writes to, whether the token can write."""

    name: str
    write: bool = True
    orgs: tuple[str, ...] = ()


@dataclass(frozen=True)
class FakeCommit:
    """One commit pushed to the fake: repository, summary, id, and the paths it added."""

    repo_id: str
    summary: str
    oid: str
    paths: tuple[str, ...]


class FakeHub:
    """The server: `add_model` repositories, `add_user` tokens, read `url`, and see what was asked in `requests`
    (method, path, headers) and pushed in `commits`. `token` is the one token the gated models accept."""

    def __init__(self, token: str = "hf_granted_token"):
        self.models: dict[str, FakeModel] = {}
        self.users: dict[str, FakeUser] = {}
        self.commits: list[FakeCommit] = []
        self.token = token
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        # A download's bytes stop at `hold_at` until `release` is set (a test presses Pause mid-file meanwhile).
        self.hold_at: int | None = None
        self.release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def add_model(self, repo_id: str, files: dict[str, bytes], **kwargs) -> FakeModel:
        model = FakeModel(repo_id, files, **kwargs)
        self.models[repo_id] = model
        return model

    def add_user(self, token: str, name: str, *, write: bool = True, orgs: tuple[str, ...] = ()) -> FakeUser:
        self.users[token] = FakeUser(name, write, tuple(orgs))
        return self.users[token]

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
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-hub", daemon=True)
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
        return [
            headers.get("range", "")
            for method, path, headers in self.requests
            if method == "GET" and "/resolve/" in path and unquote(path).endswith("/" + file)
        ]


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: pytest shows failures, not every request
        pass

    def do_GET(self) -> None:
        self._route(body=True)

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_POST(self) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if path == "/api/validate-yaml":
            return self._json({"errors": [], "warnings": []})
        if path == "/api/repos/create":
            return self._create(json.loads(data))
        if found := _WRITE.match(path):
            model = self._writable(found["repo"])
            if model is None:
                return None
            if found["action"] == "preupload":
                return self._preupload(model, json.loads(data))
            return self._commit(model, data)
        return self._error(404, "", "Not Found")

    def _route(self, body: bool) -> None:
        parts = urlsplit(self.path)
        path, query = unquote(parts.path), parse_qs(parts.query)
        self.hub.requests.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        if path == "/api/models":
            return self._search(query)
        if path == "/api/whoami-v2":
            return self._whoami()
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
                return self._error(
                    status,
                    "GatedRepo",
                    f"Access to model {repo} is restricted. You must have access "
                    "to it and be authenticated to access it. Please log in.",
                    body,
                    model.sha,
                )
        if file not in model.files:
            return self._error(404, "EntryNotFound", f'{file} does not exist on "{revision}"', body, model.sha)
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
        if not body:
            return
        hold = self.hub.hold_at
        if hold is not None and start < hold < len(content):
            self.wfile.write(content[start:hold])
            self.wfile.flush()
            self.hub.release.wait(20)
            start = hold
        self.wfile.write(content[start:])

    # ---- pushing ----
    def _user(self) -> FakeUser | None:
        """The account of the request's token; answers 401 and returns None for none or an unknown one."""
        given = self.headers.get("Authorization", "")
        user = self.hub.users.get(given.removeprefix("Bearer "))
        if user is None:
            self._error(401, "", "Invalid credentials in Authorization header")
        return user

    def _may_write(self, user: FakeUser, namespace: str) -> bool:
        if user.write and namespace in (user.name, *user.orgs):
            return True
        self._error(403, "", f'You don\'t have the rights to create a model under the namespace "{namespace}"')
        return False

    def _whoami(self) -> None:
        user = self._user()
        if user is not None:
            self._json(
                {
                    "type": "user",
                    "name": user.name,
                    "orgs": [{"name": org} for org in user.orgs],
                    "auth": {
                        "type": "access_token",
                        "accessToken": {"displayName": "test", "role": "write" if user.write else "read"},
                    },
                }
            )

    def _create(self, asked: dict) -> None:
        user = self._user()
        namespace = asked.get("organization") or (user.name if user else "")
        if user is None or not self._may_write(user, namespace):
            return
        repo_id = f"{namespace}/{asked['name']}"
        if repo_id in self.hub.models:
            # the Hub names the existing repo's page in the 409 body: create_repo(exist_ok=True) returns it
            return self._error(409, "", "You already created this model repo", url=f"{self.hub.url}/{repo_id}")
        private = asked.get("private", asked.get("visibility") == "private")
        self.hub.add_model(repo_id, {}, private=bool(private))
        self._json({"url": f"{self.hub.url}/{repo_id}", "name": repo_id})

    def _writable(self, repo: str) -> FakeModel | None:
        user = self._user()
        if user is None or not self._may_write(user, repo.partition("/")[0]):
            return None
        return self._repo(repo, None)

    def _preupload(self, model: FakeModel, asked: dict) -> None:
        files = []
        for entry in asked["files"]:
            found = model.files.get(entry["path"])
            files.append(
                {
                    "path": entry["path"],
                    "uploadMode": "regular",
                    "shouldIgnore": False,
                    "oid": _git_oid(found) if found is not None else None,
                }
            )
        self._json({"files": files, "commitOid": model.sha})

    def _commit(self, model: FakeModel, data: bytes) -> None:
        lines = [json.loads(line) for line in data.splitlines() if line.strip()]
        summary = next((line["value"].get("summary", "") for line in lines if line["key"] == "header"), "")
        added = {}
        for line in lines:
            if line["key"] == "lfsFile":
                return self._error(400, "", "the fake Hub takes no LFS files: it answers every preupload 'regular'")
            if line["key"] == "file":
                added[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
        model.files.update(added)
        model.sha = hashlib.sha1(model.sha.encode() + data).hexdigest()
        self.hub.commits.append(FakeCommit(model.repo_id, summary, model.sha, tuple(added)))
        self._json(
            {
                "commitUrl": f"{self.hub.url}/{model.repo_id}/commit/{model.sha}",
                "commitOid": model.sha,
                "pullRequestUrl": None,
            }
        )

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

    def _error(self, status: int, code: str, message: str, body: bool = True, sha: str = "", **extra: str) -> None:
        payload = json.dumps({"error": message, **extra}).encode()
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


def _git_oid(content: bytes) -> str:
    """A regular file's id as git (and the Hub's preupload) gives it: sha1 of "blob SIZE\\0" + content."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


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
