"""A model hub on a loopback port, answering what huggingface_hub asks to download a snapshot.

It publishes repositories held in memory, each at one commit, and answers:

- ``GET /api/models/<repo>/revision/<revision>``: the repo's info, its commit (``sha``) and its
  files (``siblings``); clients resolve a branch with it, and older ones start a snapshot there;
- ``GET /api/models/<repo>/tree/<revision>``: the files with their sizes and digests (the git
  blob id; the SHA-256 of a large, LFS, file), which newer clients list a snapshot from;
- ``HEAD`` and ``GET /<repo>/resolve/<revision>/<file>``: a file, with the headers the client
  checks: ``X-Repo-Commit``, ``ETag`` (the blob id, or an LFS file's SHA-256) and
  ``Content-Length``;
- a 404 with the hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
  ``EntryNotFound``) for anything else, which the client turns into its own exceptions.

A revision is the repo's commit or ``main``. A ``tampered`` file is served with its first byte
changed but listed as published, as a corrupted transfer or a bad mirror would deliver it.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from tests.integration.loopback import LoopbackHandler, LoopbackServer

if TYPE_CHECKING:
    from collections.abc import Mapping

_API = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/(?P<what>revision|tree)/(?P<revision>[^/]+)")
_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<file>.+)")


def blob_id(content: bytes) -> str:
    """The git blob id of a file's contents."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass(frozen=True)
class PublishedRepo:
    """A model repository as the hub publishes it at its one commit.

    Attributes:
        repo_id: ``<owner>/<name>``.
        files: Path in the repo -> contents.
        lfs: The paths stored in LFS (the hub lists them by the SHA-256 of their contents).
    """

    repo_id: str
    files: Mapping[str, bytes]
    lfs: frozenset[str] = field(default_factory=frozenset)

    @property
    def commit(self) -> str:
        """A 40-hex commit id fixed by the files, as git's is by its tree."""
        listing = "".join(f"{name}\0{blob_id(self.files[name])}\n" for name in sorted(self.files))
        return hashlib.sha1(listing.encode()).hexdigest()

    def tree(self) -> list[dict[str, object]]:
        """The recursive tree listing: every folder, then every file with its digests."""
        folders = sorted({name.rsplit("/", 1)[0] for name in self.files if "/" in name})
        entries: list[dict[str, object]] = [
            {"type": "directory", "oid": blob_id(folder.encode()), "size": 0, "path": folder}
            for folder in folders
        ]
        for name in sorted(self.files):
            content = self.files[name]
            entry: dict[str, object] = {
                "type": "file",
                "oid": blob_id(content),
                "size": len(content),
                "path": name,
            }
            if name in self.lfs:
                sha256 = hashlib.sha256(content).hexdigest()
                # A stand-in for the LFS pointer file that git stores: no client reads it.
                pointer = f"oid sha256:{sha256}\nsize {len(content)}\n".encode()
                entry |= {
                    "oid": blob_id(pointer),
                    "lfs": {"oid": sha256, "size": len(content), "pointerSize": len(pointer)},
                }
            entries.append(entry)
        return entries

    def etag(self, name: str) -> str:
        """The ETag the hub gives a file: its LFS SHA-256, or its blob id."""
        content = self.files[name]
        return hashlib.sha256(content).hexdigest() if name in self.lfs else blob_id(content)


class HubServer(LoopbackServer):
    """A loopback model hub publishing ``repos``; point ``HF_ENDPOINT`` at ``url``.

    Args:
        repos: The repositories it publishes.
        tampered: Paths whose served bytes differ from the published ones.
    """

    def __init__(self, *repos: PublishedRepo, tampered: frozenset[str] = frozenset()) -> None:
        super().__init__(_HubHandler)
        self.repos = {repo.repo_id: repo for repo in repos}
        self.tampered = tampered
        self._requests: list[str] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The hub's endpoint, ``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[str]:
        """``<method> <path>`` of every request so far, in order."""
        with self._lock:
            return list(self._requests)

    def record(self, request: str) -> None:
        """Note a request (handlers run on threads of their own)."""
        with self._lock:
            self._requests.append(request)


class _HubHandler(LoopbackHandler):
    def do_GET(self) -> None:
        self._answer()

    def do_HEAD(self) -> None:
        self._answer()

    def _answer(self) -> None:
        hub: HubServer = self.server.owner
        hub.record(f"{self.command} {self.path}")
        path = urlsplit(self.path).path
        if match := _API.fullmatch(path):
            repo = self._published(hub, match["repo"], unquote(match["revision"]))
            if repo is None:
                return
            if match["what"] == "tree":
                body = json.dumps(repo.tree()).encode()
            else:
                siblings = [{"rfilename": name} for name in sorted(repo.files)]
                info = {"id": repo.repo_id, "sha": repo.commit, "siblings": siblings}
                body = json.dumps(info).encode()
            self._send(200, {"Content-Type": "application/json"}, body)
        elif match := _RESOLVE.fullmatch(path):
            repo = self._published(hub, match["repo"], unquote(match["revision"]))
            if repo is None:
                return
            name = unquote(match["file"])
            if name not in repo.files:
                self._not_found("EntryNotFound", f"{name} is not in {repo.repo_id}")
                return
            content = repo.files[name]
            if name in hub.tampered:
                content = bytes([content[0] ^ 0xFF]) + content[1:]
            headers = {
                "Content-Type": "application/octet-stream",
                "X-Repo-Commit": repo.commit,
                "ETag": f'"{repo.etag(name)}"',
            }
            self._send(200, headers, content)
        else:
            self._not_found("RepoNotFound", f"no route {path}")

    def _published(self, hub: HubServer, repo_id: str, revision: str) -> PublishedRepo | None:
        """The repo if it has ``revision``; otherwise answer the hub's 404 and return None."""
        repo = hub.repos.get(repo_id)
        if repo is None:
            self._not_found("RepoNotFound", f"repository {repo_id} not found")
            return None
        if revision not in (repo.commit, "main"):
            self._not_found("RevisionNotFound", f"invalid rev id: {revision}")
            return None
        return repo

    def _not_found(self, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Error-Code": code,
            "X-Error-Message": message,
        }
        self._send(404, headers, body)

    def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        # A HEAD answer announces the length a GET would send, and sends nothing.
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
