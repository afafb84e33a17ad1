"""The on-disk cache of JSON answers from external services, so a resumed or repeated run never asks twice.

One file per request, keyed by service + method + URL + params + body. API keys travel in headers and are
never part of the key, so a run with a new key reuses the cache. It is apart from the HTTP core
(:mod:`repair.expansion.sources.http`) because it knows nothing of keys, retries or status codes: callers build one
(``repair.expansion.sources.make_cache``) and hand it to any client.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class ResponseCache:
    """JSON responses on disk, one file per request, keyed by service + method + URL + params + body.

    Keys are never part of the cache key (they travel in headers), so a run with a new key reuses the
    cache. Files are written to a temp name and renamed, so a killed run never leaves a half entry.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @staticmethod
    def key(service: str, method: str, url: str, params: Any = None, body: Any = None) -> str:
        canon = json.dumps([service, method.upper(), url, _canon(params), _canon(body)], sort_keys=True,
                           ensure_ascii=False, default=str)
        return hashlib.sha256(canon.encode("utf-8")).hexdigest()

    def _path(self, service: str, key: str) -> Path:
        return self.root / service / key[:2] / f"{key}.json"

    def get(self, service: str, key: str) -> dict | None:
        path = self._path(service, key)
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            logger.warning("%s: unreadable cache entry, asking again", path)
            return None

    def put(self, service: str, key: str, entry: dict) -> None:
        path = self._path(service, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(json.dumps(entry, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)


def _canon(value: Any) -> Any:
    if isinstance(value, dict):
        return sorted((str(k), _canon(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    return value
