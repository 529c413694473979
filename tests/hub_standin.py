"""A stand-in for the Hugging Face Hub's HTTP API on 127.0.0.1, for the push tests: just what
`huggingface_hub`'s `whoami`, `create_repo` and `create_commit` call (`/api/whoami-v2`,
`/api/repos/create`, `/api/validate-yaml`, `/api/models/{repo}/preupload/{revision}`,
`/api/models/{repo}/commit/{revision}`). Every file is "regular" in the preupload answer, so
all of them come inline (base64) in the commit's ndjson, and the stand-in keeps their bytes.

It runs in a thread of the test process: `HubStandIn.url` is what HF_ENDPOINT would be. Each
request is recorded with its Authorization header and whether the client's socket is held
by the test process itself (`Request.from_this_process`: the upload runs in the kernel, not
in a forked worker).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Request:
    method: str
    path: str
    authorization: str | None
    from_this_process: bool


@dataclass
class Repo:
    private: bool | None
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)


class HubStandIn:
    """The stand-in Hub: `start()`, point huggingface_hub at `url`, read `repos` and
    `requests`, `stop()`.

    Args:
        token: the one token it accepts.
        user: the name `whoami` answers.
        role: the token's role ("write", or "read" to be refused for a push).
    """

    def __init__(self, token: str, user: str = "tester", role: str = "write") -> None:
        self.token, self.user, self.role = token, user, role
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.fail_commits = False  # answer 500 to every commit (a Hub failing mid-push)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> HubStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet: no line per request in the test log
            pass

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _record(self) -> bool:
            auth = self.headers.get("Authorization")
            hub.requests.append(Request(self.command, self.path.split("?")[0], auth,
                                        _client_in_this_process(self)))
            return auth == f"Bearer {hub.token}"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            authorized = self._record()
            if self.path.startswith("/api/whoami-v2"):
                if not authorized:
                    return self._answer(401, {"error": "Invalid credentials in Authorization"})
                return self._answer(200, {"type": "user", "name": hub.user,
                                          "auth": {"accessToken": {"role": hub.role}}})
            self._answer(404, {"error": f"not in the stand-in: GET {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            authorized = self._record()
            body = self._body()
            path = self.path.split("?")[0]
            if not authorized:
                return self._answer(401, {"error": "Invalid credentials in Authorization"})
            if path == "/api/validate-yaml":
                return self._answer(200, {})
            if path == "/api/repos/create":
                return self._create(json.loads(body))
            parts = path.split("/")  # "", api, models, namespace, name, action, revision
            if len(parts) == 7 and parts[1:3] == ["api", "models"]:
                repo_id = f"{parts[3]}/{parts[4]}"
                if repo_id not in hub.repos:
                    return self._answer(404, {"error": "Repository not found"})
                if parts[5] == "preupload":
                    files = json.loads(body)["files"]
                    return self._answer(200, {"files": [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                        for f in files]})
                if parts[5] == "commit":
                    return self._commit(repo_id, body)
            self._answer(404, {"error": f"not in the stand-in: POST {path}"})

        def _create(self, payload: dict) -> None:
            repo_id = f"{payload.get('organization') or hub.user}/{payload['name']}"
            url = f"{hub.url}/{repo_id}"
            if repo_id in hub.repos:
                return self._answer(409, {"error": "You already created this model repo",
                                          "url": url})
            private = {"private": True, "public": False}.get(payload.get("visibility"))
            hub.repos[repo_id] = Repo(private=private)
            self._answer(200, {"url": url})

        def _commit(self, repo_id: str, body: bytes) -> None:
            if hub.fail_commits:
                return self._answer(500, {"error": "Internal Error (the stand-in fails)"})
            repo = hub.repos[repo_id]
            for line in body.splitlines():
                item = json.loads(line)
                if item["key"] == "header":
                    repo.commits.append(item["value"]["summary"])
                elif item["key"] == "file":
                    value = item["value"]
                    assert value["encoding"] == "base64", value["encoding"]
                    repo.files[value["path"]] = base64.b64decode(value["content"])
                else:
                    raise AssertionError(f"the stand-in takes inline files only: {item['key']}")
            oid = hashlib.sha1(body).hexdigest()
            self._answer(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{oid}",
                               "commitOid": oid})

    return Handler


def _client_in_this_process(handler: BaseHTTPRequestHandler) -> bool:
    """Whether the client end of this TCP connection is a socket of this process: its inode,
    from /proc/net/tcp (local port = the client's), among /proc/self/fd's links."""
    client_port = handler.client_address[1]
    server_port = handler.server.server_address[1]
    inodes = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if (int(local.split(":")[1], 16) == client_port
                    and int(remote.split(":")[1], 16) == server_port):
                inodes.add(fields[9])
    links = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return any(f"socket:[{inode}]" in links for inode in inodes)


@contextmanager
def hub_at(url: str, token: str | None, offline: bool = False) -> Iterator[None]:
    """huggingface_hub pointed at `url` (its `constants.ENDPOINT`, which it read from
    HF_ENDPOINT at import), with `token` as HF_TOKEN (None: no token at all: no saved login
    either), for the block."""
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "ENDPOINT", url)
        patch.setattr(constants, "HF_HUB_OFFLINE", offline)
        patch.setattr(constants, "HF_TOKEN_PATH", "/nonexistent-hfxla_nb-test/token")
        patch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
        if token is None:
            patch.delenv("HF_TOKEN", raising=False)
        else:
            patch.setenv("HF_TOKEN", token)
        yield


def card_metadata(readme: bytes | str) -> dict:
    """The YAML metadata of a model card (README.md), as huggingface_hub reads it."""
    from huggingface_hub import ModelCard

    text = readme.decode() if isinstance(readme, bytes) else readme
    return ModelCard(text).data.to_dict()


def closed_port_url() -> str:
    """An address on 127.0.0.1 where nothing listens (a Hub that cannot be reached)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"
