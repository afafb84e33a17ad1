"""Download a Semantic Scholar Datasets API release (``papers``, ``abstracts``, ...) to disk, resumably (issue 41,
Build 2): the input of the on-disk literature index, which joins ``papers`` and ``abstracts`` on ``corpusid``.

The command line, ``python -m repair.expansion.sources.s2_datasets list | download | verify`` (docs/literature.md),
and the names its readers import. The parts: :mod:`repair.expansion.sources.s2_release` (the API client, the
release folder's manifest and checks) and :mod:`repair.expansion.sources.s2_download` (the resumable download).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from repair.cli import non_negative_float, non_negative_int, positive_float, positive_int
from repair.data import DataError
from repair.expansion.sources.s2_download import Downloader, FolderLock
from repair.expansion.sources.s2_release import (DEFAULT_URL, KEY_ENV, MANIFEST_FORMAT, MANIFEST_NAME, URL_ENV,
                                                 DatasetsApi, check_gzip, check_name, fatal, object_name,
                                                 read_manifest, shard_file, shard_paths, verify)

__all__ = ["DEFAULT_URL", "KEY_ENV", "MANIFEST_FORMAT", "MANIFEST_NAME", "URL_ENV", "DatasetsApi", "Downloader",
           "build_parser", "check_gzip", "download", "main", "object_name", "read_manifest", "shard_file",
           "shard_paths", "verify"]


# ---------------------------------------------------------------------------------------------- the download
def download(api: DatasetsApi, release: str, datasets: list[str], out_dir: str | os.PathLike, *,
             max_shards: int | None = None, **kw) -> dict:
    """Download ``datasets`` of ``release`` (a date id or ``latest``) into ``out_dir``; returns a summary. The
    release is resolved to its dated id first, so a new release published mid-download cannot mix into a folder;
    one download per folder at a time (:class:`FolderLock`)."""
    check_name(release, "release")
    for name in datasets:
        check_name(name, "dataset")
    if max_shards is not None and max_shards < 1:
        raise DataError(f"--shards {max_shards}: expected a positive number of shards")
    meta = api.release(release)
    release_id = check_name(str(meta["release_id"]), "release_id")
    listed = {d.get("name") for d in meta.get("datasets") or [] if isinstance(d, dict)}
    unknown = [n for n in datasets if listed and n not in listed]
    if unknown:
        raise fatal(f"release {release_id} has no dataset {', '.join(map(repr, unknown))} (it has: "
                    f"{', '.join(sorted(x for x in listed if x))})", 404)
    out = Path(out_dir)
    with FolderLock(out):
        dl = Downloader(api, out, **kw)
        manifest = dl.load_manifest(release_id)
        entries = {name: dl.download_dataset(manifest, release_id, name, max_shards) for name in datasets}
    return {"release_id": release_id, "out": str(out), "manifest": str(out / MANIFEST_NAME), **dl.stats,
            "datasets": {n: {"shards": len(e["shards"]), "release_files": e["release_files"],
                             "complete": e["complete"], "bytes": sum(s["bytes"] for s in e["shards"])}
                         for n, e in entries.items()}}


# ---------------------------------------------------------------------------------------------- command line
def _api_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key_file", default=None,
                   help=f"file with the S2 API key (one per line; default: ${KEY_ENV}); dataset links need a key")
    p.add_argument("--base_url", default=None,
                   help=f"Datasets API base URL (default: ${URL_ENV} or {DEFAULT_URL})")
    p.add_argument("--rate", type=non_negative_float, default=1.0,
                   help="API requests per second per key; 0 = no limit (a local mirror) (default: %(default)s)")
    p.add_argument("--max_retries", type=non_negative_int, default=5,
                   help="retries on 429/5xx/broken connections, exponential backoff (default: %(default)s)")
    p.add_argument("--backoff", type=non_negative_float, default=1.0,
                   help="first backoff wait in seconds, doubled each retry (default: %(default)s)")
    p.add_argument("--timeout", type=positive_float, default=60.0,
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
    d.add_argument("--shards", type=positive_int, default=None,
                   help="only the first N shards of each dataset (a trial)")
    d.add_argument("--workers", type=positive_int, default=2,
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
