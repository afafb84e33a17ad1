"""The resumable download of a Semantic Scholar Datasets release's shards into its folder (issue 41, Build 2;
the folder's layout, manifest and the API are :mod:`repair.expansion.sources.s2_release`'s).

Why a downloader of its own: the ``abstracts`` dataset is ~54 GB of gzipped shards; a download that breaks after
hours must lose at most the bytes in flight, and the shard links S2 hands out expire while it runs.

Facts the code is built on: an expired pre-signed S3 link answers HTTP 403 with an XML body
``<Error><Code>AccessDenied</Code><Message>Request has expired</Message>...`` (aws/aws-sdk-php issue #1333,
aws/aws-sdk-js issue #3493); a link signed with temporary credentials whose token expired answers 400
``<Code>ExpiredToken</Code><Message>The provided token has expired.</Message><Token-0>...`` (boto/boto3 issue #2392,
craftcms/aws-s3 issue #182) -- the body echoes the token, so only Code and Message are ever shown. Either way the
cure is a fresh listing.

What a user relies on:

- a shard in progress is ``<name>.part`` (+ ``<name>.part.json``: the object's size and ETag); a rerun resumes it
  with an HTTP ``Range`` request when the server answers 206, else starts it again; a second run over a finished
  folder sends no download request at all;
- ``workers`` shards download at once (threads: the network and zlib/hashlib release the GIL), so one shard's
  gzip check overlaps another's download; the first failure stops the others, their bytes kept in ``.part``,
  after the shards already whole are recorded;
- each failure ends in one line (bad key, unknown release or dataset, 429 after bounded retries, links that stay
  refused after one fresh listing, a shard that keeps breaking off, a size or gzip mismatch, the network down);
- links are logged and reported by their object name only, and the key is never sent to S3.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import requests
import urllib3

from repair.data import DataError, write_json
from repair.expansion.sources.http import RETRY_STATUSES, TRANSIENT_ERRORS, retry_after_seconds
from repair.expansion.sources.s2_release import (CHUNK, MANIFEST_FORMAT, MANIFEST_NAME, DatasetsApi, check_gzip,
                                                 fatal, object_name, read_manifest, redact, shard_file, strip_query)

logger = logging.getLogger(__name__)

LOCK_NAME = ".download.lock"


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
        return strip_query(": ".join(m.group(1).strip() for m in (code, msg) if m))
    return strip_query(" ".join(body.split())[:160])


class Downloader:
    """Download datasets of one release into ``out_dir`` (the folder's layout: :mod:`.s2_release`)."""

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
    def load_manifest(self, release_id: str) -> dict:
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
                    raise fatal(f"release {release_id}, dataset {name}: {shard.file} was object "
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
            raise fatal(f"release {release_id}, dataset {name}: 'files' holds an entry that is not a link")
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
                raise fatal(f"release {release_id}, dataset {shard.dataset}: the fresh file list names other "
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
                    raise fatal(f"{label}: the download link was refused again after a fresh file list "
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
                    raise fatal(f"{label}: {exc.reason}; gave up after {self.max_retries + 1} attempts without "
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
                    raise fatal(f"{label}: the download is not a whole gzip file twice ({exc})") from None
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
            raise _Retry(f"no answer ({self.redact(exc)})") from None
        with resp:
            status = resp.status_code
            if status in (400, 401, 403):
                body = _body_start(resp)
                if status != 400 or "expired" in body.lower():
                    raise _Expired(f"HTTP {status} {_s3_error(body)}")
                raise fatal(f"{label}: HTTP 400 {_s3_error(body)}", status)
            if status in RETRY_STATUSES:
                wait = retry_after_seconds(resp.headers.get("Retry-After"))
                if wait is not None and wait > self.max_retry_after:
                    raise fatal(f"{label}: HTTP {status}, asked to wait {wait:.0f} s; rerun later to resume", status)
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
                raise fatal(f"{label}: the download link answers 404 (object not found)", 404)
            else:
                raise fatal(f"{label}: unexpected HTTP {status} {_s3_error(_body_start(resp))}", status)
        size = part.stat().st_size
        expected = (_read_meta(part) or {}).get("bytes")
        if expected is not None and size < expected:
            raise _Retry(f"the answer broke off at {size} of {expected} bytes")
        if expected is not None and size > expected:
            _drop(part)
            raise fatal(f"{label}: size mismatch: {size} bytes written, the server announced {expected}; the "
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

    def redact(self, exc: BaseException) -> str:
        return redact(f"{type(exc).__name__}: {exc}", self.api.secrets)


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


class FolderLock:
    """One download per folder at a time (two would write the same ``.part`` files)."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / LOCK_NAME
        self.fh = open(self.path, "a")

    def __enter__(self) -> "FolderLock":
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.close()
            raise DataError(f"{self.path}: another download into this folder is running") from None
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()
