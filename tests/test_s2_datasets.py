"""The S2 Datasets API downloader (issue 41, Build 2) against a real HTTP server on 127.0.0.1 that plays both the
Datasets API (release list, release metadata, dataset file lists in the documented JSON) and the S3 bucket behind the
pre-signed links (gzipped JSONL shards in the documented ``papers`` / ``abstracts`` record formats), and misbehaves
on purpose: 429 and 503 with Retry-After, answers that break off mid-body, servers with and without Range support,
links that expire (403 XML, as S3 answers), a rejected key, unknown releases and datasets, a corrupt shard.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from repair.cli import run_script
from repair.data import DataError
from repair.expansion.sources.s2_datasets import (MANIFEST_NAME, check_gzip, main, read_manifest, shard_paths,
                                                  verify)

ROOT = Path(__file__).resolve().parents[1]
RELEASE = "2025-01-07"
GOOD_KEY = "S2-PLANTED-good-key-0123456789"


# ---------------------------------------------------------------------------------------------- fixture shards
def paper(cid: int) -> dict:
    """A ``papers`` record as the datasets ship it (lower-case field names, ``externalids`` with nulls)."""
    return {"corpusid": cid, "externalids": {"ACL": None, "DBLP": None, "ArXiv": None, "MAG": str(3000000 + cid),
                                             "CorpusId": str(cid), "PubMed": None,
                                             "DOI": f"10.1234/test.{cid}" if cid % 3 else None,
                                             "PubMedCentral": None},
            "url": f"https://www.semanticscholar.org/paper/{cid:040x}", "title": f"Graphene transport study {cid}",
            "authors": [{"authorId": str(cid * 7), "name": "A. Author"}], "venue": "Journal of Tests",
            "publicationvenueid": None, "year": 2000 + cid % 25, "referencecount": 3, "citationcount": cid % 11,
            "influentialcitationcount": 0, "isopenaccess": False, "s2fieldsofstudy": None,
            "publicationtypes": ["JournalArticle"], "publicationdate": None,
            "journal": {"name": "Journal of Tests", "pages": "1-9", "volume": "5"}, "updated": "2025-01-03T00:00:00Z"}


def abstract(cid: int) -> dict:
    """An ``abstracts`` record: ``corpusid``, ``abstract``, ``openaccessinfo``."""
    return {"corpusid": cid, "abstract": f"We measure the Hall mobility of sample {cid}. " * 8,
            "openaccessinfo": {"externalids": {"DOI": f"10.1234/test.{cid}", "ArXiv": None, "PubMedCentral": None},
                               "license": "CCBY", "url": None, "status": "GREEN"}}


def shard_bytes(kind: str, start: int, n: int = 60) -> bytes:
    make = paper if kind == "papers" else abstract
    text = "".join(json.dumps(make(cid)) + "\n" for cid in range(start, start + n))
    return gzip.compress(text.encode(), mtime=0)


# ---------------------------------------------------------------------------------------------- the server
@dataclass
class Seen:
    method: str
    path: str
    query: dict
    headers: dict  # lower-case names


@dataclass
class S2Server:
    """The Datasets API under ``/datasets/v1`` and the bucket under ``/s3/`` on one port.

    Fault switches: ``api_faults`` (list of (status, headers, body) served first to dataset listings),
    ``s3_faults`` (object name -> list of faults, each used once: ``"truncate"`` half the remaining body then close,
    ``"stall"`` headers then close, ``"slowdown"`` 503 + Retry-After, ``"corrupt"`` right size, bad bytes),
    ``ranges`` (honour Range requests), ``valid_from`` (links of listings before this one are expired).
    """

    objects: dict = field(default_factory=dict)          # dataset -> [(object name, bytes)]
    keys: set = field(default_factory=lambda: {GOOD_KEY})
    key_status: int = 403
    ranges: bool = True
    valid_from: int = 1
    expired_style: str = "403"  # 403 AccessDenied "Request has expired", or 400 ExpiredToken (temporary credentials)
    api_faults: list = field(default_factory=list)
    s3_faults: dict = field(default_factory=dict)
    seen: list = field(default_factory=list)
    listings: int = 0

    def __post_init__(self):
        if not self.objects:
            self.objects = {kind: [(f"20250107_0705_{kind}_{i:03d}_0d1fa1a0.gz", shard_bytes(kind, 1000 * (i + 1)))
                                   for i in range(2)] for kind in ("papers", "abstracts")}
        self.lock = threading.Lock()
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                u = urlparse(self.path)
                with srv.lock:
                    srv.seen.append(Seen("GET", u.path, {k: v[0] for k, v in parse_qs(u.query).items()},
                                         {k.lower(): v for k, v in self.headers.items()}))
                if u.path.startswith("/s3/"):
                    return srv.s3(self, u)
                return srv.api(self, u.path.removeprefix("/datasets/v1/"))

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # a client that hangs up mid-answer: expected here
                pass

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def base(self) -> str:
        return self.url + "/datasets/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def shard_gets(self, name: str | None = None) -> list[Seen]:
        return [s for s in self.seen if s.path.startswith("/s3/") and (name is None or s.path.endswith(name))]

    def listing_gets(self) -> list[Seen]:
        return [s for s in self.seen if "/dataset/" in s.path]

    # -- answers
    @staticmethod
    def send(h, status: int, body, headers: dict | None = None, ctype: str = "application/json"):
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def api(self, h, path: str):
        release_meta = {"release_id": RELEASE, "README": "Subject to the terms ...",
                        "datasets": [{"name": k, "description": f"{k} of the test release", "README": "..."}
                                     for k in self.objects]}
        if path == "release/":
            return self.send(h, 200, ["2024-12-31", RELEASE])
        parts = path.split("/")
        if len(parts) == 2 and parts[0] == "release":
            if parts[1] in ("latest", RELEASE):
                return self.send(h, 200, release_meta)
            return self.send(h, 404, {"error": f"Release '{parts[1]}' not found"})
        if len(parts) == 4 and parts[0] == "release" and parts[2] == "dataset":
            if h.headers.get("x-api-key") not in self.keys:
                return self.send(h, self.key_status, {"message": "Forbidden"})
            if self.api_faults:
                status, headers, body = self.api_faults.pop(0)
                return self.send(h, status, body, headers)
            if parts[1] not in ("latest", RELEASE) or parts[3] not in self.objects:
                return self.send(h, 404, {"error": "Dataset not found"})
            with self.lock:
                self.listings += 1
                token = self.listings
            files = [f"{self.url}/s3/ai2-s2ag/staging/{RELEASE}/{parts[3]}/{name}?AWSAccessKeyId=AKIATESTONLY"
                     f"&Signature=SIG-SECRET-{token}&Expires=1736300000" for name, _ in self.objects[parts[3]]]
            return self.send(h, 200, {"name": parts[3], "description": "...", "README": "...", "files": files})
        return self.send(h, 404, {"error": "not found"})

    def s3(self, h, u):
        name = u.path.rsplit("/", 1)[-1]
        data = next((b for objs in self.objects.values() for n, b in objs if n == name), None)
        if data is None:
            return self.send(h, 404, b"<Error><Code>NoSuchKey</Code></Error>", ctype="application/xml")
        token = int(parse_qs(u.query).get("Signature", ["SIG-SECRET-0"])[0].rsplit("-", 1)[-1])
        if token < self.valid_from and self.expired_style == "400":
            return self.send(h, 400, b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>ExpiredToken</Code>"
                                     b"<Message>The provided token has expired.</Message><Token-0>TOKEN-SECRET-0"
                                     b"</Token-0><RequestId>X</RequestId></Error>", ctype="application/xml")
        if token < self.valid_from:
            return self.send(h, 403, b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code>"
                                     b"<Message>Request has expired</Message><X-Amz-Expires>604800</X-Amz-Expires>"
                                     b"<Expires>2025-01-08T00:00:00Z</Expires><ServerTime>2025-01-09T00:00:00Z"
                                     b"</ServerTime><RequestId>E4952EE21FC53CD9</RequestId></Error>",
                             ctype="application/xml")
        faults = self.s3_faults.get(name) or []
        fault = faults.pop(0) if faults else None
        if fault == "slowdown":
            return self.send(h, 503, b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate."
                                     b"</Message></Error>", {"Retry-After": "0"}, ctype="application/xml")
        if fault == "overlong" and h.headers.get("Range"):  # a 206 longer than its Content-Range says
            start = int(h.headers["Range"].split("=")[1].split("-")[0])
            return self.send(h, 206, data[start:] + b"extra", {"Content-Range": f"bytes {start}-{len(data) - 1}/"
                                                                                f"{len(data)}"})
        if fault == "corrupt":
            data = data[:20] + bytes(b ^ 0x55 for b in data[20:40]) + data[40:]
        start, status, headers = 0, 200, {"ETag": f'"{hashlib.md5(data).hexdigest()}"', "Accept-Ranges": "bytes"}
        rng = h.headers.get("Range")
        if rng and self.ranges:
            start = int(rng.split("=")[1].split("-")[0])
            if start >= len(data):
                return self.send(h, 416, b"<Error><Code>InvalidRange</Code></Error>", ctype="application/xml")
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if not self.ranges:
            headers.pop("Accept-Ranges")
        body = data[start:]
        if fault in ("truncate", "stall"):
            h.send_response(status)
            h.send_header("Content-Type", "binary/octet-stream")
            h.send_header("Content-Length", str(len(body)))
            for k, v in headers.items():
                h.send_header(k, v)
            h.end_headers()
            if fault == "truncate":
                h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            h.close_connection = True
            return
        return self.send(h, status, body, headers, ctype="binary/octet-stream")


@pytest.fixture
def srv():
    server = S2Server()
    yield server
    server.close()


@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "s2_key.txt"
    path.write_text(f"# my key\n{GOOD_KEY}\n")
    return path


def args(srv: S2Server, out: Path, key_file: Path | None, *extra: str) -> list[str]:
    a = ["download", "--release", "latest", "--datasets", "papers", "abstracts", "--out", str(out), "--base_url",
         srv.base, "--rate", "0", "--backoff", "0.01", "--max_retries", "2", "--no_progress", *extra]
    return a + (["--key_file", str(key_file)] if key_file else [])


def one_error_line(capsys, argv: list[str]) -> str:
    """Run the real entry point in-process: exit status 2 and exactly one ``error:`` line on stderr."""
    with pytest.raises(SystemExit) as exit_:
        run_script(main, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2, err
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]


def all_text(folder: Path) -> str:
    return "\n".join(p.read_bytes().decode("latin-1") for p in folder.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------- the normal path
def test_download_writes_shards_and_a_manifest_and_a_second_run_downloads_nothing(srv, key_file, tmp_path,
                                                                                   capsys, caplog):
    out = tmp_path / "s2"
    assert main(args(srv, out, key_file)) == 0
    manifest = read_manifest(out)
    assert manifest["release_id"] == RELEASE  # "latest" resolved to the dated id
    for kind in ("papers", "abstracts"):
        entry = manifest["datasets"][kind]
        assert entry["release_files"] == 2 and entry["complete"] is True
        for i, (s, (name, data)) in enumerate(zip(entry["shards"], srv.objects[kind])):
            assert s["file"] == f"{kind}/{kind}-{i:05d}.jsonl.gz" and s["index"] == i and s["object"] == name
            assert s["bytes"] == len(data) and s["sha256"] == hashlib.sha256(data).hexdigest()
            assert (out / s["file"]).read_bytes() == data
        assert shard_paths(out, kind) == [out / f"{kind}/{kind}-{i:05d}.jsonl.gz" for i in range(2)]
    with gzip.open(out / "abstracts/abstracts-00001.jsonl.gz", "rt") as fh:
        rows = [json.loads(line) for line in fh]
    assert [r["corpusid"] for r in rows] == list(range(2000, 2060)) and rows[0]["abstract"].startswith("We measure")
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == sorted(
        [MANIFEST_NAME, ".download.lock"] + [f"{k}-{i:05d}.jsonl.gz" for k in ("papers", "abstracts") for i in (0, 1)])
    # the key goes to the API only; the links' signatures and the key appear nowhere
    assert {s.headers.get("x-api-key") for s in srv.listing_gets()} == {GOOD_KEY}
    assert all("x-api-key" not in s.headers for s in srv.shard_gets()) and len(srv.shard_gets()) == 4
    shown = capsys.readouterr().out + caplog.text + all_text(out)
    assert GOOD_KEY not in shown and "SIG-SECRET" not in shown and "AKIATESTONLY" not in shown
    assert "4 downloaded now, 0 already here" in shown

    before = len(srv.seen)
    assert main(args(srv, out, key_file)) == 0
    again = srv.seen[before:]
    assert [s.path for s in again] == ["/datasets/v1/release/latest"]  # no listing, no download
    assert "0 downloaded now, 4 already here" in capsys.readouterr().out
    assert read_manifest(out) == manifest
    assert list(verify(out)) == [(s["file"], None) for k in ("papers", "abstracts")
                                 for s in manifest["datasets"][k]["shards"]]


def test_shards_n_takes_the_first_shards_and_a_full_run_adds_only_the_rest(srv, key_file, tmp_path):
    out = tmp_path / "s2"
    assert main(args(srv, out, key_file, "--shards", "1")) == 0
    entry = read_manifest(out)["datasets"]["papers"]
    assert [s["index"] for s in entry["shards"]] == [0] and entry["complete"] is False
    assert entry["release_files"] == 2
    n = len(srv.shard_gets())
    assert n == 2  # one per dataset
    assert main(args(srv, out, key_file)) == 0
    assert sorted(s.path.rsplit("_", 2)[-2] for s in srv.shard_gets()[n:]) == ["001", "001"]
    assert read_manifest(out)["datasets"]["papers"]["complete"] is True


# ---------------------------------------------------------------------------------------------- faults
def test_429_and_503_are_retried_honouring_retry_after_then_a_bounded_failure_is_one_line(srv, key_file, tmp_path,
                                                                                         capsys, caplog):
    srv.api_faults = [(429, {"Retry-After": "0.05"}, {"message": "Too Many Requests"})]
    papers0 = srv.objects["papers"][0][0]
    srv.s3_faults = {papers0: ["slowdown"]}
    assert main(args(srv, tmp_path / "a", key_file, "--datasets", "papers")) == 0
    assert len(srv.listing_gets()) == 2 and len(srv.shard_gets(papers0)) == 2
    assert "HTTP 429" in caplog.text and "SlowDown" in caplog.text
    assert (tmp_path / "a/papers/papers-00000.jsonl.gz").read_bytes() == srv.objects["papers"][0][1]

    srv.api_faults = [(429, {"Retry-After": "0"}, {"message": "Too Many Requests"})] * 3
    line = one_error_line(capsys, args(srv, tmp_path / "b", key_file, "--datasets", "papers"))
    assert "HTTP 429" in line and "gave up after 3 attempts" in line and GOOD_KEY not in line


@pytest.mark.parametrize("ranges", [True, False])
def test_a_shard_that_breaks_off_is_resumed_with_range_or_restarted(srv, key_file, tmp_path, ranges):
    srv.ranges = ranges
    name, data = srv.objects["papers"][1]
    srv.s3_faults = {name: ["truncate"]}
    out = tmp_path / "s2"
    assert main(args(srv, out, key_file, "--datasets", "papers")) == 0
    gets = srv.shard_gets(name)
    assert len(gets) == 2 and "range" not in gets[0].headers
    assert gets[1].headers.get("range") == f"bytes={len(data) // 2}-"  # asked to resume where the bytes stopped
    assert (out / "papers/papers-00001.jsonl.gz").read_bytes() == data  # final bytes equal, either way
    assert not list(out.rglob("*.part*"))


def test_a_killed_download_resumes_from_its_part_file_and_a_changed_object_starts_over(srv, key_file, tmp_path,
                                                                                      capsys):
    name, data = srv.objects["abstracts"][0]
    srv.s3_faults = {name: ["truncate", "stall", "stall", "stall"]}  # half, then nothing: no progress, give up
    out = tmp_path / "s2"
    line = one_error_line(capsys, args(srv, out, key_file, "--datasets", "abstracts", "--workers", "1"))
    assert "abstracts/abstracts-00000.jsonl.gz" in line and name in line and "gave up after 3 attempts" in line
    part = out / "abstracts/abstracts-00000.jsonl.gz.part"
    assert part.read_bytes() == data[: len(data) // 2]  # the bytes that came are kept
    assert "SIG-SECRET" not in line and read_manifest(out)["datasets"]["abstracts"]["shards"] == []

    # meanwhile another shard's part is from an object that has changed since (another size): started over
    old1, new1 = srv.objects["abstracts"][1][1], shard_bytes("abstracts", 5000, n=90)
    srv.objects["abstracts"][1] = (srv.objects["abstracts"][1][0], new1)
    part1 = out / "abstracts/abstracts-00001.jsonl.gz.part"
    part1.write_bytes(old1[:100])
    part1.with_name(part1.name + ".json").write_text(json.dumps({"object": srv.objects["abstracts"][1][0],
                                                                 "bytes": len(old1), "etag": '"old"'}))
    n, n1 = len(srv.shard_gets(name)), len(srv.shard_gets(srv.objects["abstracts"][1][0]))
    assert main(args(srv, out, key_file, "--datasets", "abstracts")) == 0  # the rerun resumes
    assert srv.shard_gets(name)[n].headers.get("range") == f"bytes={len(data) // 2}-"
    assert (out / "abstracts/abstracts-00000.jsonl.gz").read_bytes() == data and not part.exists()
    assert [g.headers.get("range") for g in srv.shard_gets(srv.objects["abstracts"][1][0])[n1:]] == [
        "bytes=100-", None]
    assert (out / "abstracts/abstracts-00001.jsonl.gz").read_bytes() == new1 and not part1.exists()
    assert read_manifest(out)["datasets"]["abstracts"]["shards"][1]["sha256"] == hashlib.sha256(new1).hexdigest()


@pytest.mark.parametrize("style,shown,workers", [("403", "AccessDenied: Request has expired", "1"),
                                                 ("400", "ExpiredToken: The provided token has expired.", "1"),
                                                 ("403", "AccessDenied: Request has expired", "2")])
def test_expired_links_are_refreshed_once_then_a_clear_line(srv, key_file, tmp_path, capsys, caplog, style, shown,
                                                            workers):
    srv.valid_from, srv.expired_style = 2, style  # the first listing's links have expired by the time they are used
    out = tmp_path / "s2"
    assert main(args(srv, out, key_file, "--datasets", "papers", "--workers", workers)) == 0
    assert len(srv.listing_gets()) == 2  # one fresh listing, even when both workers meet an expired link
    sigs = [s.query["Signature"] for s in srv.shard_gets()]
    if workers == "1":
        assert sigs == ["SIG-SECRET-1", "SIG-SECRET-2", "SIG-SECRET-2"]
    else:  # the second worker may start before or after the first one's refresh
        assert sigs.count("SIG-SECRET-2") == 2 and set(sigs) == {"SIG-SECRET-1", "SIG-SECRET-2"}
    assert f"HTTP {style} {shown}" in caplog.text
    assert "SIG-SECRET" not in caplog.text + all_text(out) and "TOKEN-SECRET" not in caplog.text + all_text(out)
    assert [p.read_bytes() for p in shard_paths(out, "papers")] == [d for _, d in srv.objects["papers"]]

    srv.valid_from = 10**6  # fresh links are refused too
    line = one_error_line(capsys, args(srv, tmp_path / "b", key_file, "--datasets", "abstracts"))
    assert "refused again after a fresh file list" in line and shown in line
    assert "SIG-SECRET" not in line and "AKIATESTONLY" not in line and "TOKEN-SECRET" not in line


@pytest.mark.parametrize("status", [401, 403])
def test_a_rejected_key_is_one_line_naming_the_file_not_the_key(srv, tmp_path, capsys, caplog, monkeypatch, status):
    monkeypatch.delenv("S2_API_KEY", raising=False)
    srv.key_status = status
    keys = tmp_path / "keys.txt"
    keys.write_text("S2-PLANTED-wrong-key-987\n")
    out = tmp_path / "s2"
    line = one_error_line(capsys, args(srv, out, keys))
    assert f"the S2 API refused the key in key file {keys} ({status})" in line
    assert "S2-PLANTED-wrong-key-987" not in line + caplog.text + all_text(out)
    assert srv.shard_gets() == []
    line = one_error_line(capsys, args(srv, tmp_path / "nokey", None))  # no key at all: say that one is needed
    assert "without a key" in line and "--key_file" in line


def test_in_a_real_process_at_debug_level_neither_key_nor_link_signature_shows_and_a_bad_key_exits_2(
        srv, key_file, tmp_path):
    def run(keys: Path, out: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "repair.expansion.sources.s2_datasets",
                               *args(srv, out, keys, "--log_level", "DEBUG")], capture_output=True, text=True,
                              timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})

    proc = run(key_file, tmp_path / "ok")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert " DEBUG " in proc.stderr  # the run did log at DEBUG
    shown = proc.stdout + proc.stderr + all_text(tmp_path / "ok")
    for secret in (GOOD_KEY, "SIG-SECRET", "AKIATESTONLY"):  # urllib3's DEBUG lines would quote the signed links
        assert secret not in shown, secret
    assert len(shard_paths(tmp_path / "ok", "papers")) == 2

    keys = tmp_path / "keys.txt"
    keys.write_text("S2-PLANTED-wrong-key-987\n")
    out = tmp_path / "s2"
    proc = run(keys, out)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: s2_datasets: HTTP 403: the S2 API refused the key in key file {keys} (403); check that the key "
        "is current (the key itself is not shown)")
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == \
        [proc.stderr.strip().splitlines()[-1]]
    assert "S2-PLANTED-wrong-key-987" not in proc.stdout + proc.stderr + all_text(out)
    assert srv.listing_gets()[-1].headers.get("x-api-key") == "S2-PLANTED-wrong-key-987"


def test_unknown_release_or_dataset_is_one_line(srv, key_file, tmp_path, capsys):
    line = one_error_line(capsys, args(srv, tmp_path / "a", key_file, "--release", "2099-01-01"))
    assert "has no release '2099-01-01' (404)" in line
    line = one_error_line(capsys, args(srv, tmp_path / "b", key_file, "--datasets", "papers", "nonesuch"))
    assert f"release {RELEASE} has no dataset 'nonesuch' (it has: abstracts, papers)" in line
    assert srv.listing_gets() == [] and srv.shard_gets() == []
    line = one_error_line(capsys, args(srv, tmp_path / "c", key_file, "--release", "../etc"))
    assert "release '../etc'" in line


def test_a_corrupt_shard_is_fetched_again_and_a_persistent_one_is_one_line(srv, key_file, tmp_path, capsys, caplog):
    name, data = srv.objects["papers"][0]
    srv.s3_faults = {name: ["corrupt"]}
    out = tmp_path / "s2"
    assert main(args(srv, out, key_file, "--datasets", "papers", "--shards", "1")) == 0
    assert "not a whole gzip file" in caplog.text and len(srv.shard_gets(name)) == 2
    assert (out / "papers/papers-00000.jsonl.gz").read_bytes() == data

    srv.s3_faults = {name: ["corrupt", "corrupt"]}
    line = one_error_line(capsys, args(srv, tmp_path / "b", key_file, "--datasets", "papers", "--shards", "1"))
    assert "not a whole gzip file twice" in line and "papers-00000.jsonl.gz" in line
    assert not (tmp_path / "b/papers/papers-00000.jsonl.gz").exists()
    assert read_manifest(tmp_path / "b")["datasets"]["papers"]["shards"] == []


def test_with_workers_one_failing_shard_stops_the_run_and_the_finished_ones_are_kept(srv, key_file, tmp_path,
                                                                                     capsys):
    bad, _ = srv.objects["papers"][0]
    srv.s3_faults = {bad: ["stall"] * 10}
    out = tmp_path / "s2"
    line = one_error_line(capsys, args(srv, out, key_file, "--datasets", "papers", "--workers", "2"))
    assert "papers/papers-00000.jsonl.gz" in line and "gave up after 3 attempts" in line
    assert [s["index"] for s in read_manifest(out)["datasets"]["papers"]["shards"]] == [1]
    srv.s3_faults = {}
    n = len(srv.shard_gets())
    assert main(args(srv, out, key_file, "--datasets", "papers")) == 0
    assert [s.path.rsplit("/", 1)[-1] for s in srv.shard_gets()[n:]] == [bad]  # only the missing one
    assert [p.read_bytes() for p in shard_paths(out, "papers")] == [d for _, d in srv.objects["papers"]]


def test_more_bytes_than_announced_is_a_size_mismatch_line(srv, key_file, tmp_path, capsys):
    name, data = srv.objects["papers"][0]
    srv.s3_faults = {name: ["truncate", "overlong"]}
    out = tmp_path / "s2"
    line = one_error_line(capsys, args(srv, out, key_file, "--datasets", "papers", "--shards", "1"))
    assert f"size mismatch: {len(data) + 5} bytes written, the server announced {len(data)}" in line
    assert not list(out.rglob("*.part*"))  # the mixed-up bytes are not kept: the rerun starts clean
    assert main(args(srv, out, key_file, "--datasets", "papers", "--shards", "1")) == 0
    assert "range" not in srv.shard_gets(name)[-1].headers
    assert (out / "papers/papers-00000.jsonl.gz").read_bytes() == data


def test_a_shard_changed_on_disk_is_reported_by_verify_and_downloaded_again(srv, key_file, tmp_path):
    out = tmp_path / "s2"
    assert main(args(srv, out, key_file, "--datasets", "papers")) == 0
    path = out / "papers/papers-00001.jsonl.gz"
    path.write_bytes(path.read_bytes()[:-8])  # lost its gzip trailer: another size
    assert [r for f, r in verify(out) if r] and "not a whole gzip file" in dict(verify(out))[
        "papers/papers-00001.jsonl.gz"]
    n = len(srv.shard_gets())
    assert main(args(srv, out, key_file, "--datasets", "papers")) == 0
    assert len(srv.shard_gets()) == n + 1 and path.read_bytes() == srv.objects["papers"][1][1]


def test_network_down_and_a_folder_of_another_release_are_one_line(srv, key_file, tmp_path, capsys):
    from repair.runtime import free_port

    dead = f"http://127.0.0.1:{free_port()}/datasets/v1"
    a = args(srv, tmp_path / "a", key_file)
    a[a.index("--base_url") + 1] = dead
    line = one_error_line(capsys, a)
    assert "connection failed" in line and "gave up after 3 attempts" in line

    out = tmp_path / "b"
    out.mkdir()
    (out / MANIFEST_NAME).write_text(json.dumps({"format": "repair-s2-datasets/1", "release_id": "2024-12-31",
                                                 "datasets": {}}))
    line = one_error_line(capsys, args(srv, out, key_file))
    assert f"{out / MANIFEST_NAME}: field 'release_id' is '2024-12-31' but release {RELEASE}" in line


def test_check_gzip_reads_every_member_and_refuses_a_truncated_stream(tmp_path):
    two = gzip.compress(b"a\n", mtime=0) + gzip.compress(b"b\n", mtime=0)  # multi-member, as concatenated parts
    good = tmp_path / "good.gz"
    good.write_bytes(two)
    assert check_gzip(good) == hashlib.sha256(two).hexdigest()
    bad = tmp_path / "bad.gz"
    bad.write_bytes(two[:-3])
    with pytest.raises(DataError, match=r"bad\.gz: not a whole gzip file"):
        check_gzip(bad)


def test_a_downloaded_release_folder_builds_a_literature_index_with_the_abstracts_joined(srv, key_file, tmp_path):
    """The two halves of issue 41 meet: the folder the downloader writes is an input of the index build as it is
    (manifest and lock files ignored), papers get their abstracts through ``corpusid``, and DOI / year / venue stay."""
    from repair.expansion.sources.literature import build_index
    from repair.expansion.sources.literature_search import LiteratureIndex

    out = tmp_path / "s2"
    assert main(args(srv, out, key_file)) == 0
    stats = build_index([out], tmp_path / "index", progress=False)
    assert stats["papers"] == 240 // 2  # 2 papers shards x 60; the abstracts shards add text, not papers
    index = LiteratureIndex(tmp_path / "index")
    hits = index.search("graphene transport study 2021 Hall mobility of sample 2021", 3)
    top = hits[0]
    assert (top.id, top.title, top.doi, top.year, top.venue) == (
        "2021", "Graphene transport study 2021", "10.1234/test.2021", 2021, "Journal of Tests")
    assert top.abstract.startswith("We measure the Hall mobility of sample 2021.")
    assert hits[1].score < top.score
    # a paper whose DOI is null in the papers record (cid % 3 == 0) has none in the index either
    assert index.search("graphene transport study 1002", 1)[0].doi is None
