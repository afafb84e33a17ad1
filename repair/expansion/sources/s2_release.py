"""One Semantic Scholar Datasets API release: the API client that lists it (:class:`DatasetsApi`) and the folder a
download keeps it in (its manifest, shard names and checks), shared by the downloader
(:mod:`repair.expansion.sources.s2_download`) and its readers (issue 41, Build 2).

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
  (``externalids``, ``license``, ``url``, ``status``).

What a user relies on:

- one folder per release: ``OUT/manifest.json`` names the release; every finished shard is
  ``OUT/<dataset>/<dataset>-<index:05d>.jsonl.gz`` (``index``: its position in the release's ``files`` list) and is
  listed in the manifest with its byte size and sha256 -- a file is in the manifest only once it is whole, its gzip
  stream read to the end (CRC and length checked), and renamed into place;
- neither the API key nor a link's signature (the query string of a pre-signed URL is a bearer credential) appears
  in logs, errors or the manifest: links are named by their object name only.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator
from urllib.parse import quote, unquote, urlsplit

from repair.data import DataError, read_json
from repair.expansion.sources.http import ApiClient, AuthError, KeyPool, SourceError, load_keys, scrub

SERVICE = "s2_datasets"
DEFAULT_URL = "https://api.semanticscholar.org/datasets/v1"
URL_ENV, KEY_ENV = "S2_DATASETS_API_URL", "S2_API_KEY"  # the key is the Graph API's (s2-folks issue #37)
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "repair-s2-datasets/1"
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


def strip_query(text: str) -> str:
    """``text`` with every URL query string (a pre-signed link's signature) cut to ``?***``."""
    return _QUERY.sub("?***", text)


def redact(text: str, secrets: list[str]) -> str:
    """``text`` fit to show: the keys in ``secrets`` and every link's query string cut."""
    return strip_query(scrub(text, secrets))


def check_name(value: str, what: str) -> str:
    """A release or dataset name as it may appear in a URL path and a folder name."""
    if not _NAME_OK.match(value):
        raise DataError(f"{what} {value!r}: expected letters, digits, '-', '_' or '.' (e.g. 'papers', "
                        "'2025-01-07')")
    return value


def fatal(message: str, status: int | None = None) -> SourceError:
    """An error that ends the run in one line (retrying would not help)."""
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
                raise fatal(f"the S2 API refused a request without a key ({exc.status}) on {path}: dataset "
                            f"links need an API key (--key_file FILE or ${KEY_ENV})", exc.status) from None
            which = "the key" if len(self.secrets) == 1 else f"each of the {len(self.secrets)} keys"
            raise fatal(f"the S2 API refused {which} in {self.key_source} ({exc.status}); check that the key is "
                        "current (the key itself is not shown)", exc.status) from None
        return None if resp.status == 404 else resp.data

    def releases(self) -> list[str]:
        data = self._get("release/")
        if not isinstance(data, list):
            raise fatal(f"release/ answered {type(data).__name__}, not a list of release ids")
        return [str(r) for r in data]

    def release(self, release_id: str) -> dict:
        """``{"release_id", "README", "datasets": [...]}``; ``latest`` resolves to a dated id."""
        data = self._get(f"release/{quote(release_id)}")
        if data is None:
            raise fatal(f"the S2 Datasets API has no release {release_id!r} (404); 'list' shows the releases "
                        "(ids are dates such as 2025-01-07, or 'latest')", 404)
        if not isinstance(data, dict) or not data.get("release_id"):
            raise fatal(f"release/{release_id} answered without a release_id")
        return data

    def dataset(self, release_id: str, name: str) -> dict:
        """``{"name", "description", "README", "files": [pre-signed links]}``."""
        data = self._get(f"release/{quote(release_id)}/dataset/{quote(name)}")
        if data is None:
            raise fatal(f"release {release_id} has no dataset {name!r} (404)", 404)
        if not isinstance(data, dict) or not isinstance(data.get("files"), list):
            raise fatal(f"release/{release_id}/dataset/{name} answered without a 'files' list")
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
