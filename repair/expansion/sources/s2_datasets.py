"""Download a Semantic Scholar Datasets API release (``papers``, ``abstracts``, ...) to disk, resumably (issue 41,
Build 2): the input of the on-disk literature index, which joins ``papers`` and ``abstracts`` on ``corpusid``.

Why a downloader of its own: the ``abstracts`` dataset is ~54 GB of gzipped shards; a download that breaks after
hours must lose at most the bytes in flight, and the shard links S2 hands out expire while it runs.

Facts the code is built on (read in the S2 Datasets API docs, https://api.semanticscholar.org/api-docs/datasets,
as summarised by allenai/s2-folks ``examples/python/s2ag_datasets/full-datasets.py`` and
``incremental-updates.py``, and by the API's JSON schema mirrored in api-evangelist/semantic-scholar
``json-schema/semantic-scholar-dataset-release.json`` and ``examples/semantic-scholar-datasets-releases-example.json``):

- base ``https://api.semanticscholar.org/datasets/v1``; ``GET release/`` is a JSON list of release ids, date stamps
  such as ``"2024-01-02"``, oldest first (the s2-folks example reads ``[0]`` as the earliest release);
  ``GET release/{release_id}`` (``latest`` allowed) is ``{"release_id", "README", "datasets": [{"name",
  "description", "README"}]}``;
- ``GET release/{release_id}/dataset/{dataset_name}`` is ``{"name", "description", "README", "files": [...]}``, where
  ``files`` are "temporary, pre-signed download links" to the dataset's partitions on S3, gzipped JSONL; they need
  the API key, sent in the ``x-api-key`` header (the same key as the Graph API's, allenai/s2-folks issue #37);
- ``GET diffs/{start_release_id}/to/{end_release_id}/{dataset_name}`` lists per-step ``update_files`` and
  ``delete_files``: not used here (the index is built from one full release);
- record formats (the sample files the release README links to, allenai/s2-folks PR #24; copies with the
  datasets' own READMEs in rimonim/quantitative_history ``semanticscholar_samples/``): ``papers`` rows hold
  ``corpusid`` (int), ``externalids`` (``DOI``, ``ArXiv``, ``CorpusId`` ... or null), ``title``, ``venue``,
  ``year``, ``url``, ``authors`` ...; ``abstracts`` rows hold ``corpusid``, ``abstract`` and ``openaccessinfo``
  (``externalids``, ``license``, ``url``, ``status``);
- an expired pre-signed S3 link answers HTTP 403 with an XML body ``<Error><Code>AccessDenied</Code><Message>Request
  has expired</Message>...`` (aws/aws-sdk-php issue #1333, aws/aws-sdk-js issue #3493); a link signed with
  temporary credentials whose token expired answers 400 ``<Code>ExpiredToken</Code><Message>The provided token has
  expired.</Message><Token-0>...`` (boto/boto3 issue #2392, craftcms/aws-s3 issue #182) -- the body echoes the
  token, so only Code and Message are ever shown. Either way the cure is a fresh listing.

What a user relies on:

- one folder per release: ``OUT/manifest.json`` names the release; every finished shard is
  ``OUT/<dataset>/<dataset>-<index:05d>.jsonl.gz`` (``index``: its position in the release's ``files`` list) and is
  listed in the manifest with its byte size and sha256 -- a file is in the manifest only once it is whole, its gzip
  stream read to the end (CRC and length checked), and renamed into place;
- a shard in progress is ``<name>.part`` (+ ``<name>.part.json``: the object's size and ETag); a rerun resumes it
  with an HTTP ``Range`` request when the server answers 206, else starts it again; a second run over a finished
  folder sends no download request at all;
- ``workers`` shards download at once (threads: the network and zlib/hashlib release the GIL), so one shard's
  gzip check overlaps another's download; the first failure stops the others, their bytes kept in ``.part``,
  after the shards already whole are recorded;
- each failure ends in one line (bad key, unknown release or dataset, 429 after bounded retries, links that stay
  refused after one fresh listing, a shard that keeps breaking off, a size or gzip mismatch, the network down);
- neither the API key nor a link's signature (the query string of a pre-signed URL is a bearer credential) appears
  in logs, errors or the manifest: links are named by their object name only; the key is never sent to S3.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import json
import logging
import os
import re
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Iterator
from urllib.parse import quote, unquote, urlsplit

import requests
import urllib3

from repair.data import DataError, read_json, write_json
from repair.expansion.sources.http import (RETRY_STATUSES, TRANSIENT_ERRORS, ApiClient, AuthError, KeyPool,
                                           SourceError, load_keys, retry_after_seconds, scrub)

logger = logging.getLogger(__name__)

SERVICE = "s2_datasets"
DEFAULT_URL = "https://api.semanticscholar.org/datasets/v1"
URL_ENV, KEY_ENV = "S2_DATASETS_API_URL", "S2_API_KEY"  # the key is the Graph API's (s2-folks issue #37)
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "repair-s2-datasets/1"
LOCK_NAME = ".download.lock"
CHUNK = 1 << 20
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# a URL's query string (pre-signed links carry their signature there): cut from any text that may be shown
_QUERY = re.compile(r"\?[^\s'\"<>]*")


def shard_file(dataset: str, index: int) -> str:
    """The shard's path inside the release folder: ``papers/papers-00003.jsonl.gz`` for ``files[3]``."""
    return f"{dataset}/{dataset}-{index:05d}.jsonl.gz"


def object_name(url: str) -> str:
    """A link's S3 object name (the last path segment, no query): how logs, errors and the manifest name a shard
    (the full link is a credential), and how a fresh listing's links are matched to the shards already here."""
    return unquote(urlsplit(url).path.rsplit("/", 1)[-1]) or "?"


def _safe(text: str, secrets: list[str]) -> str:
    return _QUERY.sub("?***", scrub(text, secrets))


def _check_name(value: str, what: str) -> str:
    if not _NAME_OK.match(value):
        raise DataError(f"{what} {value!r}: expected letters, digits, '-', '_' or '.' (e.g. 'papers', "
                        "'2025-01-07')")
    return value


def _fail(message: str, status: int | None = None) -> SourceError:
    return SourceError(SERVICE, status, message, fatal=True)


# ---------------------------------------------------------------------------------------------- the API
class DatasetsApi:
    """The three Datasets API endpoints through the project's HTTP core (retries, Retry-After, key rotation,
    scrubbed errors). No response cache: file links expire, a listing must be fresh."""

    def __init__(self, base_url: str | None = None, keys: list[str] | None = None, *, key_file: str | None = None,
                 rate: float = 1.0, timeout: float = 30.0, max_retries: int = 5, backoff_base: float = 1.0):
        if keys is None:
            keys = load_keys(key_file, KEY_ENV)
        self.key_source = (f"key file {key_file}" if key_file else f"${KEY_ENV}") if keys else None
        self.client = ApiClient(SERVICE, base_url or os.environ.get(URL_ENV) or DEFAULT_URL,
                                keys=KeyPool(keys, rate, SERVICE, self.key_source or "no key"),
                                auth_header="x-api-key", timeout=timeout, max_retries=max_retries,
                                backoff_base=backoff_base, passthrough_statuses=(404,), key_env=KEY_ENV)

    @property
    def secrets(self) -> list[str]:
        return self.client.keys.secrets

    def _get(self, path: str) -> Any:
        try:
            resp = self.client.get_json(path)
        except AuthError as exc:
            if self.key_source is None:
                raise _fail(f"the S2 API refused a request without a key ({exc.status}) on {path}: dataset "
                            f"links need an API key (--key_file FILE or ${KEY_ENV})", exc.status) from None
            which = "the key" if len(self.secrets) == 1 else f"each of the {len(self.secrets)} keys"
            raise _fail(f"the S2 API refused {which} in {self.key_source} ({exc.status}); check that the key is "
                        "current (the key itself is not shown)", exc.status) from None
        return None if resp.status == 404 else resp.data

    def releases(self) -> list[str]:
        data = self._get("release/")
        if not isinstance(data, list):
            raise _fail(f"release/ answered {type(data).__name__}, not a list of release ids")
        return [str(r) for r in data]

    def release(self, release_id: str) -> dict:
        """``{"release_id", "README", "datasets": [...]}``; ``latest`` resolves to a dated id."""
        data = self._get(f"release/{quote(release_id)}")
        if data is None:
            raise _fail(f"the S2 Datasets API has no release {release_id!r} (404); 'list' shows the releases "
                        "(ids are dates such as 2025-01-07, or 'latest')", 404)
        if not isinstance(data, dict) or not data.get("release_id"):
            raise _fail(f"release/{release_id} answered without a release_id")
        return data

    def dataset(self, release_id: str, name: str) -> dict:
        """``{"name", "description", "README", "files": [pre-signed links]}``."""
        data = self._get(f"release/{quote(release_id)}/dataset/{quote(name)}")
        if data is None:
            raise _fail(f"release {release_id} has no dataset {name!r} (404)", 404)
        if not isinstance(data, dict) or not isinstance(data.get("files"), list):
            raise _fail(f"release/{release_id}/dataset/{name} answered without a 'files' list")
        return data


# ---------------------------------------------------------------------------------------------- the manifest
def read_manifest(out_dir: str | os.PathLike) -> dict:
    """The manifest of a download folder: ``{"format", "release_id", "datasets": {name: {"release_files",
    "complete", "shards": [{"file", "index", "object", "bytes", "sha256"}]}}}``. Raises :class:`DataError` (one line)
    for a folder that is not a download folder or a manifest of another format."""
    path = Path(out_dir) / MANIFEST_NAME
    manifest = read_json(path)
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise DataError(f"{path}: field 'format' is {found!r}, expected {MANIFEST_FORMAT!r} (a folder written by "
                        "python -m repair.expansion.sources.s2_datasets download)")
    for name, entry in (manifest.get("datasets") or {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("shards"), list):
            raise DataError(f"{path}: field 'datasets.{name}.shards' is missing or not a list")
    return manifest


def shard_paths(out_dir: str | os.PathLike, dataset: str) -> list[Path]:
    """The finished shards of ``dataset`` in a download folder, in release order: what the index builder reads."""
    manifest = read_manifest(out_dir)
    entry = manifest["datasets"].get(dataset)
    if entry is None:
        raise DataError(f"{Path(out_dir) / MANIFEST_NAME}: no dataset {dataset!r} (it has: "
                        f"{', '.join(sorted(manifest['datasets'])) or 'none'})")
    return [Path(out_dir) / s["file"] for s in sorted(entry["shards"], key=lambda s: s["index"])]


# ---------------------------------------------------------------------------------------------- checks
class _HashingReader:
    """A read-only file wrapper that hashes and counts every byte read through it."""

    def __init__(self, fh: BinaryIO):
        self.fh, self.digest, self.count = fh, hashlib.sha256(), 0

    def read(self, size: int = -1) -> bytes:
        data = self.fh.read(size)
        self.digest.update(data)
        self.count += len(data)
        return data


def check_gzip(path: str | os.PathLike) -> str:
    """Read the whole gzip stream (every member; CRC-32 and length trailers checked) and return the file's sha256,
    in one pass over the bytes. Raises :class:`DataError` naming the file for a truncated or corrupt stream."""
    path = Path(path)
    with open(path, "rb") as raw:
        reader = _HashingReader(raw)
        try:
            with gzip.GzipFile(fileobj=reader, mode="rb") as gz:  # type: ignore[arg-type]
                while gz.read(CHUNK):
                    pass
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise DataError(f"{path}: not a whole gzip file ({type(exc).__name__}: {exc})") from None
        while reader.read(CHUNK):  # nothing should be left; hash it anyway so the digest covers the whole file
            pass
    if reader.count == 0:
        raise DataError(f"{path}: empty file, not a gzip file")
    return reader.digest.hexdigest()


# ---------------------------------------------------------------------------------------------- downloading
@dataclass
class Shard:
    dataset: str
    index: int
    url: str

    @property
    def object(self) -> str:
        return object_name(self.url)

    @property
    def file(self) -> str:
        return shard_file(self.dataset, self.index)


class _Retry(Exception):
    """Internal: this attempt ended early (network, 5xx, truncated body); try again after ``wait`` seconds."""

    def __init__(self, reason: str, wait: float | None = None):
        super().__init__(reason)
        self.reason, self.wait = reason, wait


class _Expired(Exception):
    """Internal: the link was refused (403, or 400 ExpiredToken): a fresh listing is needed."""


class _Stopped(Exception):
    """Internal: another shard failed or the user interrupted; this one stops, its bytes kept in ``.part``."""


def _content_range(value: str | None) -> tuple[int, int | None] | None:
    """``bytes START-END/TOTAL`` -> (START, TOTAL or None for ``*``)."""
    m = re.match(r"^\s*bytes\s+(\d+)-\d+/(\d+|\*)\s*$", value or "")
    if not m:
        return None
    return int(m.group(1)), (int(m.group(2)) if m.group(2) != "*" else None)


def _int_header(resp: requests.Response, name: str) -> int | None:
    try:
        return int(resp.headers[name])
    except (KeyError, ValueError):
        return None


def _body_start(resp: requests.Response) -> str:
    try:
        return resp.raw.read(2000, decode_content=False).decode("utf-8", "replace")
    except (urllib3.exceptions.HTTPError, OSError):
        return ""


def _s3_error(body: str) -> str:
    """``Code: Message`` from an S3 XML error body, or its start."""
    code = re.search(r"<Code>(.*?)</Code>", body, re.S)
    msg = re.search(r"<Message>(.*?)</Message>", body, re.S)
    if code or msg:
        return _QUERY.sub("?***", ": ".join(m.group(1).strip() for m in (code, msg) if m))
    return _QUERY.sub("?***", " ".join(body.split())[:160])


class Downloader:
    """Download datasets of one release into ``out_dir`` (see the module docstring for the folder's layout)."""

    def __init__(self, api: DatasetsApi, out_dir: str | os.PathLike, *, progress: bool = True,
                 timeout: float = 60.0, workers: int = 2):
        self.api, self.out = api, Path(out_dir)
        self.progress, self.timeout = progress, timeout
        # shards download in parallel: one shard's gzip check (CPU) overlaps another's download (network)
        self.workers = max(1, int(workers))
        # waits as the API's: the same --max_retries, --backoff and Retry-After ceiling
        self.max_retries, self.max_retry_after = api.client.max_retries, api.client.max_retry_after
        self.stats = {"downloaded": 0, "skipped": 0, "bytes": 0, "resumed": 0, "refreshed": 0}
        self._lock, self._refresh_lock = threading.Lock(), threading.Lock()
        self._stop = threading.Event()
        self._local = threading.local()
        self._bar = None

    @property
    def session(self) -> requests.Session:
        """One session per thread, without the key (pre-signed links carry their own credentials)."""
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    # -- the manifest
    def _manifest(self, release_id: str) -> dict:
        path = self.out / MANIFEST_NAME
        if not path.exists():
            return {"format": MANIFEST_FORMAT, "release_id": release_id, "api": self.api.client.base_url,
                    "datasets": {}}
        manifest = read_manifest(self.out)
        if manifest.get("release_id") != release_id:
            raise DataError(f"{path}: field 'release_id' is {manifest.get('release_id')!r} but release "
                            f"{release_id} was asked for; one folder holds one release (use another --out)")
        return manifest

    def _save(self, manifest: dict) -> None:
        write_json(self.out / MANIFEST_NAME, manifest)

    # -- one dataset
    def _done(self, entry: dict) -> dict[int, dict]:
        """Shards of the manifest whose file is here at its recorded size (others are downloaded again)."""
        done = {}
        for s in entry["shards"]:
            path = self.out / s["file"]
            if path.is_file() and path.stat().st_size == s["bytes"]:
                done[s["index"]] = s
                continue
            logger.warning("%s: %s; downloading it again", s["file"], "of another size than the manifest says"
                           if path.is_file() else "missing")
            path.unlink(missing_ok=True)  # not the recorded object: never adopt it
        return done

    def download_dataset(self, manifest: dict, release_id: str, name: str, max_shards: int | None) -> dict:
        entry = manifest["datasets"].setdefault(name, {"release_files": None, "complete": False, "shards": []})
        done = self._done(entry)
        n_release = entry.get("release_files")
        if n_release is not None:
            wanted = range(min(n_release, max_shards) if max_shards is not None else n_release)
            if all(i in done for i in wanted):  # nothing to do: no listing request, no download (idempotent)
                self._count("skipped", len(wanted))
                logger.info("%s: %d shard(s) already here", name, len(wanted))
                return entry
        urls = self._listing(release_id, name)
        entry["release_files"] = len(urls)
        self._save(manifest)  # the folder names its release from the first listing on
        shards = [Shard(name, i, u) for i, u in enumerate(urls)]
        (self.out / name).mkdir(parents=True, exist_ok=True)

        def record(rec: dict | None = None) -> None:  # main thread only: the manifest grows by whole shards
            if rec is not None:
                done[rec["index"]] = rec
            entry["shards"] = [done[i] for i in sorted(done)]
            entry["complete"] = len(done) == len(urls)
            self._save(manifest)

        todo = []
        for shard in shards[:max_shards] if max_shards is not None else shards:
            if shard.index in done:
                if done[shard.index]["object"] != shard.object:
                    raise _fail(f"release {release_id}, dataset {name}: {shard.file} was object "
                                f"{done[shard.index]['object']}, the file list now names {shard.object}; the "
                                "release changed (use another --out)")
                self._count("skipped")
            elif (adopted := self._adopt(shard)) is not None:
                record(adopted)
            else:
                todo.append(shard)
        self._run(todo, shards, release_id, record)
        record()
        return entry

    def _run(self, todo: list[Shard], shards: list[Shard], release_id: str, record) -> None:
        """Fetch ``todo`` on ``workers`` threads; ``record`` each finished shard as it comes. The first failure
        stops the others (their bytes stay in ``.part``) after the shards already finished are recorded."""
        if not todo:
            return
        from tqdm.auto import tqdm

        first_error: BaseException | None = None
        self._stop.clear()
        self._bar = tqdm(total=None, unit="B", unit_scale=True, unit_divisor=1024, disable=not self.progress,
                         desc=f"{todo[0].dataset} 0/{len(todo)} shards", mininterval=1.0)
        try:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="s2-shard") as pool:
                futures = [pool.submit(self._fetch, s, shards, release_id) for s in todo]
                try:
                    for n, fut in enumerate(as_completed(futures), start=1):
                        if fut.cancelled():
                            continue
                        try:
                            record(fut.result())
                        except (_Stopped, Exception) as exc:  # noqa: BLE001 - the first error is re-raised below
                            if first_error is None and not isinstance(exc, _Stopped):
                                first_error = exc
                            self._stop.set()
                            for f in futures:
                                f.cancel()
                        self._bar.set_description(f"{todo[0].dataset} {n}/{len(todo)} shards", refresh=False)
                except BaseException:  # Ctrl-C: stop the workers at their next block, keep their bytes
                    self._stop.set()
                    for f in futures:
                        f.cancel()
                    raise
        finally:
            self._bar.close()
            self._bar = None
        if first_error is not None:
            raise first_error

    def _listing(self, release_id: str, name: str) -> list[str]:
        data = self.api.dataset(release_id, name)
        urls = [u for u in data["files"] if isinstance(u, str) and u]
        if len(urls) != len(data["files"]):
            raise _fail(f"release {release_id}, dataset {name}: 'files' holds an entry that is not a link")
        return urls

    def _refresh(self, release_id: str, shards: list[Shard], shard: Shard, stale_url: str) -> None:
        """Fresh links for every shard of the dataset (matched by object name, so a reordered list is fine); a
        worker whose link another worker has refreshed meanwhile just takes the new one."""
        with self._refresh_lock:
            if shard.url != stale_url:
                return
            self._count("refreshed")
            fresh = {object_name(u): u for u in self._listing(release_id, shard.dataset)}
            if set(fresh) != {s.object for s in shards}:
                raise _fail(f"release {release_id}, dataset {shard.dataset}: the fresh file list names other "
                            "objects than the first one; the release changed under the download")
            for s in shards:
                s.url = fresh[s.object]

    def _adopt(self, shard: Shard) -> dict | None:
        """A finished file not in the manifest (a run killed between the rename and the manifest write)."""
        path = self.out / shard.file
        if not path.is_file():
            return None
        try:
            sha = check_gzip(path)
        except DataError as exc:
            logger.warning("%s; downloading it again", exc)
            path.unlink()
            return None
        logger.info("%s: finished by an earlier run, checked and recorded", shard.file)
        return self._record(shard, path, sha)

    def _record(self, shard: Shard, path: Path, sha: str) -> dict:
        return {"file": shard.file, "index": shard.index, "object": shard.object, "bytes": path.stat().st_size,
                "sha256": sha, "downloaded": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    # -- one shard
    def _fetch(self, shard: Shard, shards: list[Shard], release_id: str) -> dict:
        """Download one shard to its final name (runs on a worker thread); returns its manifest record."""
        dest = self.out / shard.file
        part = dest.with_name(dest.name + ".part")
        label = f"{shard.file} ({shard.object}, {shard.index + 1}/{len(shards)})"
        refreshed, failures, best, gzip_retry = False, 0, -1, False
        while True:
            if self._stop.is_set():
                raise _Stopped()
            url = shard.url
            try:
                self._attempt(shard, url, part, label)
            except _Expired as exc:
                if refreshed:
                    raise _fail(f"{label}: the download link was refused again after a fresh file list "
                                f"({exc}); rerun later to resume") from None
                logger.warning("%s: link refused (%s); fetching fresh links", label, exc)
                self._refresh(release_id, shards, shard, url)
                refreshed = True
                continue
            except _Retry as exc:
                have = part.stat().st_size if part.exists() else 0
                progressed = have > best
                if progressed:  # progress resets the budgets: a long shard may break off (or outlive a link)
                    best, failures, refreshed = have, 0, False
                else:
                    failures += 1
                if failures > self.max_retries:
                    raise _fail(f"{label}: {exc.reason}; gave up after {self.max_retries + 1} attempts without "
                                "progress (rerun to resume from the bytes kept)") from None
                wait = (exc.wait if exc.wait is not None else 0.0 if progressed else
                        self.api.client.backoff(failures - 1))
                logger.warning("%s: %s; retrying in %.1f s", label, exc.reason, wait)
                self._stop.wait(wait)
                continue
            try:
                sha = check_gzip(part)
            except DataError as exc:
                part.unlink()
                _meta(part).unlink(missing_ok=True)
                if gzip_retry:
                    raise _fail(f"{label}: the download is not a whole gzip file twice ({exc})") from None
                logger.warning("%s: %s; downloading it again", label, exc)
                gzip_retry = True
                continue
            os.replace(part, dest)
            _meta(part).unlink(missing_ok=True)
            self._count("downloaded")
            return self._record(shard, dest, sha)

    def _attempt(self, shard: Shard, url: str, part: Path, label: str) -> None:
        """One GET of the shard into ``part`` (resumed with Range when part and its size record exist). Returns
        when the part holds exactly the object's bytes; raises :class:`_Retry` / :class:`_Expired` otherwise."""
        state = _read_meta(part)
        have = part.stat().st_size if part.exists() else 0
        if have and (state is None or state.get("object") != shard.object or
                     (state.get("bytes") is not None and have > state["bytes"])):
            have, state = 0, None  # not ours, or longer than the object: start again
        headers = {"Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        logger.debug("%s: GET %s", label, headers.get("Range", "from the start"))  # never the link: a credential
        try:
            resp = self.session.get(url, headers=headers, stream=True, timeout=(15.0, self.timeout),
                                    allow_redirects=True)
        except TRANSIENT_ERRORS as exc:
            raise _Retry(f"no answer ({self._safe(exc)})") from None
        with resp:
            status = resp.status_code
            if status in (400, 401, 403):
                body = _body_start(resp)
                if status != 400 or "expired" in body.lower():
                    raise _Expired(f"HTTP {status} {_s3_error(body)}")
                raise _fail(f"{label}: HTTP 400 {_s3_error(body)}", status)
            if status in RETRY_STATUSES:
                wait = retry_after_seconds(resp.headers.get("Retry-After"))
                if wait is not None and wait > self.max_retry_after:
                    raise _fail(f"{label}: HTTP {status}, asked to wait {wait:.0f} s; rerun later to resume", status)
                raise _Retry(f"HTTP {status} {_s3_error(_body_start(resp))}".strip(), wait)
            if status == 416:  # the range starts at or past the end: the part is not of this object
                _drop(part)
                raise _Retry("HTTP 416 on resume; starting the shard again", 0.0)
            if status == 206 and have:
                rng = _content_range(resp.headers.get("Content-Range"))
                total = rng[1] if rng else None
                etag = resp.headers.get("ETag")
                if (rng is None or rng[0] != have or (state.get("bytes") is not None and total != state["bytes"])
                        or (state.get("etag") and etag and etag != state["etag"])):
                    _drop(part)
                    raise _Retry("the resumed answer is of another object or range; starting the shard again", 0.0)
                self._count("resumed")
                logger.info("%s: resuming at byte %d of %s", label, have, total if total is not None else "?")
                self._stream(resp, part, "ab", total)
            elif status == 200:
                total = _int_header(resp, "Content-Length")
                if have:
                    logger.info("%s: the server ignores Range; downloading the shard again", label)
                _write_meta(part, {"object": shard.object, "bytes": total, "etag": resp.headers.get("ETag")})
                self._stream(resp, part, "wb", total)
            elif status == 404:
                raise _fail(f"{label}: the download link answers 404 (object not found)", 404)
            else:
                raise _fail(f"{label}: unexpected HTTP {status} {_s3_error(_body_start(resp))}", status)
        size = part.stat().st_size
        expected = (_read_meta(part) or {}).get("bytes")
        if expected is not None and size < expected:
            raise _Retry(f"the answer broke off at {size} of {expected} bytes")
        if expected is not None and size > expected:
            _drop(part)
            raise _fail(f"{label}: size mismatch: {size} bytes written, the server announced {expected}; the "
                        "partial file was removed")

    def _stream(self, resp: requests.Response, part: Path, mode: str, total: int | None) -> None:
        with open(part, mode) as fh:
            try:
                for block in resp.raw.stream(CHUNK, decode_content=False):
                    fh.write(block)
                    self._count("bytes", len(block))
                    if self._bar is not None:
                        self._bar.update(len(block))
                    if self._stop.is_set():
                        raise _Stopped()
            except (urllib3.exceptions.HTTPError, *TRANSIENT_ERRORS, ConnectionError, TimeoutError) as exc:
                # a broken connection; a full disk (OSError from write) is not retried
                raise _Retry(f"the answer broke off at {fh.tell()} of {total if total is not None else '?'} "
                             f"bytes ({type(exc).__name__})") from None
            finally:  # whatever came is on disk before anyone resumes from it
                fh.flush()
                os.fsync(fh.fileno())

    def _safe(self, exc: BaseException) -> str:
        return _safe(f"{type(exc).__name__}: {exc}", self.api.secrets)


def _meta(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def _read_meta(part: Path) -> dict | None:
    try:
        meta = json.loads(_meta(part).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _write_meta(part: Path, meta: dict) -> None:
    write_json(_meta(part), meta)


def _drop(part: Path) -> None:
    part.unlink(missing_ok=True)
    _meta(part).unlink(missing_ok=True)


class _FolderLock:
    """One download per folder at a time (two would write the same ``.part`` files)."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / LOCK_NAME
        self.fh = open(self.path, "a")

    def __enter__(self) -> "_FolderLock":
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.close()
            raise DataError(f"{self.path}: another download into this folder is running") from None
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def download(api: DatasetsApi, release: str, datasets: list[str], out_dir: str | os.PathLike, *,
             max_shards: int | None = None, **kw) -> dict:
    """Download ``datasets`` of ``release`` (a date id or ``latest``) into ``out_dir``; returns a summary. The
    release is resolved to its dated id first, so a new release published mid-download cannot mix into a folder."""
    _check_name(release, "release")
    for name in datasets:
        _check_name(name, "dataset")
    if max_shards is not None and max_shards < 1:
        raise DataError(f"--shards {max_shards}: expected a positive number of shards")
    meta = api.release(release)
    release_id = _check_name(str(meta["release_id"]), "release_id")
    listed = {d.get("name") for d in meta.get("datasets") or [] if isinstance(d, dict)}
    unknown = [n for n in datasets if listed and n not in listed]
    if unknown:
        raise _fail(f"release {release_id} has no dataset {', '.join(map(repr, unknown))} (it has: "
                    f"{', '.join(sorted(x for x in listed if x))})", 404)
    out = Path(out_dir)
    with _FolderLock(out):
        dl = Downloader(api, out, **kw)
        manifest = dl._manifest(release_id)
        entries = {name: dl.download_dataset(manifest, release_id, name, max_shards) for name in datasets}
    return {"release_id": release_id, "out": str(out), "manifest": str(out / MANIFEST_NAME), **dl.stats,
            "datasets": {n: {"shards": len(e["shards"]), "release_files": e["release_files"],
                             "complete": e["complete"], "bytes": sum(s["bytes"] for s in e["shards"])}
                         for n, e in entries.items()}}


def verify(out_dir: str | os.PathLike) -> Iterator[tuple[str, str | None]]:
    """Re-check every shard of a download folder: (file, None) when its size, sha256 and gzip stream match the
    manifest, (file, reason) otherwise."""
    manifest = read_manifest(out_dir)
    for entry in manifest["datasets"].values():
        for s in entry["shards"]:
            path = Path(out_dir) / s["file"]
            if not path.is_file():
                yield s["file"], "missing"
                continue
            try:
                sha = check_gzip(path)
            except DataError as exc:
                yield s["file"], str(exc)
                continue
            size = path.stat().st_size
            reason = (f"{size} bytes, the manifest says {s['bytes']}" if size != s["bytes"] else
                      "sha256 differs from the manifest's" if sha != s["sha256"] else None)
            yield s["file"], reason


# ---------------------------------------------------------------------------------------------- command line
def _api_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key_file", default=None,
                   help=f"file with the S2 API key (one per line; default: ${KEY_ENV}); dataset links need a key")
    p.add_argument("--base_url", default=None,
                   help=f"Datasets API base URL (default: ${URL_ENV} or {DEFAULT_URL})")
    p.add_argument("--rate", type=float, default=1.0, help="API requests per second per key (default: %(default)s)")
    p.add_argument("--max_retries", type=int, default=5,
                   help="retries on 429/5xx/broken connections, exponential backoff (default: %(default)s)")
    p.add_argument("--backoff", type=float, default=1.0,
                   help="first backoff wait in seconds, doubled each retry (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds without data before a request counts as broken (default: %(default)s)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m repair.expansion.sources.s2_datasets",
                                description="Download Semantic Scholar Datasets API releases (issue 41).")
    sub = p.add_subparsers(dest="action", required=True)
    d = sub.add_parser("download", help="download datasets of one release into a folder (resumable)")
    d.add_argument("--release", default="latest", help="release id such as 2025-01-07, or latest "
                                                      "(default: %(default)s)")
    d.add_argument("--datasets", nargs="+", default=["papers", "abstracts"],
                   help="dataset names (default: %(default)s)")
    d.add_argument("--out", required=True, help="folder for this release (manifest.json + <dataset>/ shards)")
    d.add_argument("--shards", type=int, default=None, help="only the first N shards of each dataset (a trial)")
    d.add_argument("--workers", type=int, default=2,
                   help="shards downloaded at once; one's gzip check overlaps another's download (default: "
                        "%(default)s)")
    d.add_argument("--no_progress", action="store_true", help="hide the progress bar")
    _api_args(d)
    ls = sub.add_parser("list", help="list the releases, or the datasets of --release")
    ls.add_argument("--release", default=None, help="show this release's datasets (an id or latest)")
    _api_args(ls)
    v = sub.add_parser("verify", help="re-check sizes, sha256 and gzip streams of a download folder")
    v.add_argument("--out", required=True, help="the download folder")
    v.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    from repair.runtime import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    # urllib3's DEBUG lines quote each request's URL, and a pre-signed link's query string is a credential
    logging.getLogger("urllib3").setLevel(max(logging.INFO, logging.getLogger().getEffectiveLevel()))
    if args.action == "verify":
        bad = [(f, r) for f, r in verify(args.out) if r]
        for f, r in bad:
            print(f"{f}: {r}")
        print(f"{args.out}: {'all shards match the manifest' if not bad else f'{len(bad)} shard(s) do not match'}")
        return 2 if bad else 0
    api = DatasetsApi(args.base_url, key_file=args.key_file, rate=args.rate, timeout=args.timeout,
                      max_retries=args.max_retries, backoff_base=args.backoff)
    if args.action == "list":
        if args.release is None:
            print("\n".join(api.releases()))
        else:
            meta = api.release(args.release)
            print(f"release {meta['release_id']}")
            for d in meta.get("datasets") or []:
                print(f"  {d.get('name')}: {' '.join(str(d.get('description') or '').split())[:100]}")
        return 0
    summary = download(api, args.release, args.datasets, args.out, max_shards=args.shards,
                       progress=not args.no_progress, timeout=args.timeout, workers=args.workers)
    parts = [f"{n} {d['shards']}/{d['release_files']} shards ({d['bytes'] / 1e6:.1f} MB)"
             for n, d in summary["datasets"].items()]
    print(f"release {summary['release_id']}: {', '.join(parts)}; {summary['downloaded']} downloaded now, "
          f"{summary['skipped']} already here -> {summary['manifest']}")
    return 0


if __name__ == "__main__":
    from repair.cli import run_script
    # the module under its own name (not __main__): its loggers and error classes are the library's
    from repair.expansion.sources.s2_datasets import main as _main

    run_script(_main)
