"""``fetch_text``: huggingface_hub's own download code against a stand-in hub.

There is no internet here: a small HTTP server plays the hub's two endpoints that the
fetch uses (the dataset's file metadata, ``/api/datasets/<repo>/revision/<rev>``, and
the files, ``/datasets/<repo>/resolve/<rev>/<path>`` with HEAD, GET and Range), serving a
folder shaped like the real repository. Everything on this side of the socket is the
real code: the fetch runs in a fresh process with ``HF_ENDPOINT`` pointing at the server.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from text_helpers import small_file_system

from hpcllm.text.fetch import card_patterns, glob_match

REPO_ID = "HuggingFaceFW/fineweb"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class StandInHub:
    """Serves ``root`` as the dataset repository ``REPO_ID`` at ``COMMIT``; Parquet and
    .zst files as LFS files. ``cut_first`` files are cut off halfway on their first GET
    (a dropped connection); ``wrong_sha`` files are listed with another checksum."""

    def __init__(self, root: Path, cut_first=(), wrong_sha=()):
        self.root, self.cut_first, self.wrong_sha = root, set(cut_first), set(wrong_sha)
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.serve(self, body=False)

            def do_GET(self):
                hub.serve(self, body=True)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())

    def sibling(self, name: str) -> dict:
        data = (self.root / name).read_bytes()
        entry = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
        if name.endswith((".parquet", ".zst")):
            sha = hashlib.sha256(data).hexdigest()
            if name in self.wrong_sha:
                sha = "0" * 64
            entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
        return entry

    def serve(self, handler, body: bool) -> None:
        path = handler.path.split("?", 1)[0]
        self.requests.append((handler.command, path, handler.headers.get("Range")))
        api = f"/api/datasets/{REPO_ID}"
        if path in (api, f"{api}/revision/main", f"{api}/revision/{COMMIT}"):
            info = {
                "id": REPO_ID,
                "sha": COMMIT,
                "private": False,
                "siblings": [self.sibling(f) for f in self.files()],
            }
            return self.send(handler, 200, json.dumps(info).encode(), {}, body)
        prefix = f"/datasets/{REPO_ID}/resolve/"
        if not path.startswith(prefix):
            return self.send(handler, 404, b"{}", {}, body)
        name = path[len(prefix) :].split("/", 1)[1]
        file = self.root / name
        if not file.is_file():
            return self.send(handler, 404, b"{}", {"X-Error-Code": "EntryNotFound"}, body)
        data = file.read_bytes()
        sib = self.sibling(name)
        etag = sib["lfs"]["sha256"] if "lfs" in sib else sib["blobId"]
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"'}
        if "lfs" in sib:
            headers |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))}
        status, start = 200, 0
        rng = handler.headers.get("Range")
        if rng and body:
            start = int(rng.split("=")[1].split("-")[0])
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        chunk = data[start:]
        if body and name in self.cut_first:
            self.cut_first.discard(name)
            handler.send_response(200)
            for k, v in headers.items():
                handler.send_header(k, v)
            handler.send_header("Content-Length", str(len(chunk)))
            handler.end_headers()
            handler.wfile.write(chunk[: len(chunk) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            return
        self.send(handler, status, chunk, headers, body)

    @staticmethod
    def send(handler, status, data, headers, body) -> None:
        handler.send_response(status)
        for k, v in headers.items():
            handler.send_header(k, v)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)


@pytest.fixture
def fineweb_repo(repo, tmp_path):
    """A repository shaped like HuggingFaceFW/fineweb: the shipped mirror plus a file of
    another config that the fetch must leave alone."""
    import shutil

    root = tmp_path / "hub"
    shutil.copytree(repo / "resources/hub_mirror/HuggingFaceFW/fineweb", root)
    (root / "data/CC-MAIN-2024-10").mkdir(parents=True)
    (root / "data/CC-MAIN-2024-10/000_00000.parquet").write_bytes(b"not fetched")
    return root


def fetch(tmp_path, hub: StandInHub, cfg: dict, name="web"):
    """fetch_source in a fresh process, its hub the stand-in (HF_ENDPOINT)."""
    out = tmp_path / "data/hub" / name
    code = (
        "import json, logging, sys; logging.basicConfig(level=logging.INFO)\n"
        "from hpcllm.text.fetch import fetch_source\n"
        "fetch_source(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4])\n"
    )
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_DISABLE_XET": "1",
        "NO_PROXY": "127.0.0.1",
    }
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        env.pop(var, None)
    args = [name, json.dumps(cfg), str(out / "files"), str(out / "fetched.json")]
    # A hang guard far above the expected time (2-5 s here; the machine is shared).
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    ), out


FINEWEB = {"type": "hub", "dataset": REPO_ID, "name": "sample-10BT"}
PARTS = ("000_00000.parquet", "001_00000.parquet")


def test_fetch_copies_the_configs_files_as_they_are_verified(tmp_path, fineweb_repo, repo):
    hub = StandInHub(fineweb_repo)
    proc, out = fetch(tmp_path, hub, FINEWEB)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "fetched.json").read_text())
    wanted = ["README.md", "sample/10BT/000_00000.parquet", "sample/10BT/001_00000.parquet"]
    assert sorted(manifest["files"]) == wanted and manifest["revision"] == COMMIT
    for name in wanted:  # byte for byte the hub's files: fetched, not re-encoded
        assert (out / "files" / name).read_bytes() == (fineweb_repo / name).read_bytes()
        want = hashlib.sha256((fineweb_repo / name).read_bytes()).hexdigest()
        assert manifest["files"][name].get("sha256", want) == want
    assert not (out / "files/data").exists(), "another config's files are not fetched"
    # The fetched mirror reads in place like the shipped one: the same documents.
    from hpcllm.text.sources import shard_documents

    cfg = {**FINEWEB, "mirror": str(out / "files")}
    shipped = {**FINEWEB, "mirror": str(repo / "resources/hub_mirror/HuggingFaceFW/fineweb")}
    assert [d.text for d in shard_documents("web", cfg, 0, 1)] == [
        d.text for d in shard_documents("web", shipped, 0, 1)
    ]
    # ... and its shards' manifests name the commit the fetch resolved.
    from hpcllm.text.shards import ShardCounts, shard_manifest

    assert shard_manifest("web", cfg, 0, 1, ShardCounts())["revision"] == f"{COMMIT} (fetched)"
    assert "local mirror" in shard_manifest("web", shipped, 0, 1, ShardCounts())["revision"]


def test_fetch_reports_files_bytes_rate_and_time_left(tmp_path, fineweb_repo, monkeypatch):
    """Issue 51 item 2: a line per file said neither which of how many nor how much was
    left. Now each file's line says "file k of n", and progress lines the megabytes done
    of all, the share, the rate and the time left (as tokenize's and training's do)."""
    import re

    monkeypatch.setenv("HPCLLM_PROGRESS_S", "0")  # a progress line at every update
    hub = StandInHub(fineweb_repo)
    proc, out = fetch(tmp_path, hub, FINEWEB)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = [f"sample/10BT/{p}" for p in PARTS]
    for k, part in enumerate(parts, 1):
        size = (fineweb_repo / part).stat().st_size
        assert f"web: {part} ({size:,} bytes) verified, file {k} of 2" in proc.stderr
    total = sum((fineweb_repo / p).stat().st_size for p in parts) / 1e6
    lines = re.findall(r"fetch_text web: .*", proc.stderr)
    assert lines and lines[-1].startswith(
        f"fetch_text web: {total:,.0f} of {total:,.0f} MB (100.0%)"
    )
    assert "done in" in lines[-1]
    # again, everything there already: the files count from the start, nothing is left
    proc, _ = fetch(tmp_path, hub, FINEWEB)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(100.0%)" in re.findall(r"fetch_text web: .*", proc.stderr)[0]


def test_a_dropped_download_resumes_from_where_it_stopped(tmp_path, fineweb_repo):
    # Bigger than huggingface_hub's download chunk (10 MB), so that part of it is on disk
    # when the connection drops: 24 MB of incompressible text in one more file.
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = "sample/10BT/002_00000.parquet"
    texts = [os.urandom(1 << 20).hex() for _ in range(12)]
    pq.write_table(pa.table({"text": texts}), fineweb_repo / part, compression="none")
    hub = StandInHub(fineweb_repo, cut_first=[part])
    proc, out = fetch(tmp_path, hub, FINEWEB)
    if proc.returncode != 0:  # the library gave up on the dropped connection: run again
        assert not (out / "fetched.json").exists()
        proc, out = fetch(tmp_path, hub, FINEWEB)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "files" / part).read_bytes() == (fineweb_repo / part).read_bytes()
    ranges = [r for method, path, r in hub.requests if method == "GET" and path.endswith(part)]
    assert any(r and not r.startswith("bytes=0-") for r in ranges), (ranges, proc.stderr[-2000:])


def test_a_file_whose_checksum_is_not_the_hubs_fails_naming_it(tmp_path, fineweb_repo):
    part = "sample/10BT/000_00000.parquet"
    hub = StandInHub(fineweb_repo, wrong_sha=[part])
    proc, out = fetch(tmp_path, hub, FINEWEB)
    assert proc.returncode != 0
    assert f"{part}: sha256 " in proc.stderr and "is not the hub's 0000" in proc.stderr
    assert not (out / "fetched.json").exists()


def test_a_fetch_without_room_for_the_files_fails_before_downloading(tmp_path, fineweb_repo):
    """The hub lists the files' sizes: 210 KiB of Parquet into a 64 KiB file system."""
    hub = StandInHub(fineweb_repo)
    with small_file_system(tmp_path / "data/hub/web", "64k"):
        proc, out = fetch(tmp_path, hub, FINEWEB)
        left = sorted(p.name for p in (out / "files").iterdir())
    needed = sum((fineweb_repo / "sample/10BT" / f).stat().st_size for f in PARTS)
    assert proc.returncode != 0
    assert (
        f"DiskFull: no space left on device writing in {out / 'files'}: the file system at "
        f"{out} has "
    ) in proc.stderr, proc.stderr[-3000:]
    assert f"; this step needs {needed / 1024:.1f} KiB there. Fix: free space on" in proc.stderr
    assert left == [".cache", "README.md"], "no Parquet file was started"
    assert not [r for r in hub.requests if r[1].endswith(".parquet")]


def test_a_config_the_card_does_not_name_asks_for_data_files(tmp_path, fineweb_repo):
    hub = StandInHub(fineweb_repo)
    proc, _ = fetch(tmp_path, hub, {**FINEWEB, "name": "CC-MAIN-2099-01"})
    assert proc.returncode != 0
    assert "names no data files for config 'CC-MAIN-2099-01'" in proc.stderr
    assert "text.sources.web.data_files" in proc.stderr


def test_card_patterns_and_hub_globs():
    card = (
        "---\nconfigs:\n- config_name: a\n  data_files:\n  - split: train\n"
        "    path: data/a/*.parquet\n  - split: test\n    path: [t/*.parquet]\n"
        "- config_name: b\n  data_files: b/**\n---\n# card\n"
    )
    assert card_patterns(card, {"name": "a"}) == ["data/a/*.parquet"]
    assert card_patterns(card, {"name": "a", "split": "test"}) == ["t/*.parquet"]
    assert card_patterns(card, {"name": "b"}) == ["b/**"]
    assert card_patterns(card, {"name": "c"}) is None
    assert glob_match("data/a/*.parquet", "data/a/x.parquet")
    assert not glob_match("data/*.parquet", "data/a/x.parquet")  # * stays in its folder
    assert glob_match("b/**", "b/c/d.jsonl")
