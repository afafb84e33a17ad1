"""One HTTP core for every external service REPAIR talks to (DESIGN 6).

What the original lacked (UPSTREAM 5.20): any non-200 silently became "zero papers", there was no retry,
no backoff, no per-key rate limit and no rotation. Here every client goes through :class:`ApiClient`:

- a :class:`KeyPool` rotates over several keys, each with its own :class:`RateLimiter` (S2: 1 req/s per key,
  PubChem: <= 5 req/s, Elsevier: per-API throttles); a key that gets 429 cools down, a rejected key (401/403)
  or an exhausted quota (Elsevier ``QUOTA_EXCEEDED``) is taken out of the pool;
- retries with exponential backoff on 429/5xx/timeouts, honouring ``Retry-After``;
- a :class:`~repair.expansion.sources.cache.ResponseCache` on disk keyed by method + URL + params + body (never the
  key), so a resumed or repeated run never asks twice;
- errors are :class:`SourceError` (service, status, message); a 4xx other than 429/401/403 is ``permanent``
  (the same request will fail again: 06 records the item as ``refused`` and does not retry it).

Keys never appear in logs, outputs or exception messages (issue 18): :func:`load_keys` splits keys on
newlines and commas and refuses, before the first request, any key that cannot travel in an HTTP header
(naming the variable or file line, never the key); keys travel only in headers; and every exception that
leaves :meth:`ApiClient.request`, including ``requests``' own (``InvalidHeader`` quotes the header value)
and unexpected ones, is a :class:`SourceError` whose text has every secret replaced by ``***`` and no chained
exception (a traceback would print the original text).
"""

from __future__ import annotations

import email.utils
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import requests

from repair.data import DataError
from repair.expansion.sources.cache import ResponseCache

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})  # 408 Request Timeout: the server gave up waiting
KEY_REJECTED_STATUSES = frozenset({401, 403})
# requests' errors for a request that may go through when sent again, and for one that cannot be built at all
# (a bad base URL or header: every request of the run would fail the same way).
TRANSIENT_ERRORS = (requests.Timeout, requests.ConnectionError, requests.exceptions.ChunkedEncodingError,
                    requests.exceptions.ContentDecodingError)
SETUP_ERRORS = (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
                requests.exceptions.InvalidSchema, requests.exceptions.URLRequired)


class SourceError(RuntimeError):
    """A request to an external service failed. ``fatal`` errors (bad key, quota gone, a request that cannot be
    built) stop a run; ``permanent`` ones (a 4xx such as 400 or 414: this request will never work) are recorded
    per item and not retried; the others are recorded per item and retried on ``--resume``."""

    def __init__(self, service: str, status: int | None, message: str, *, fatal: bool = False,
                 code: str | None = None, permanent: bool = False):
        self.service, self.status, self.fatal, self.code, self.permanent = service, status, fatal, code, permanent
        self._set_message(message)

    def _set_message(self, message: str) -> None:
        self.message = message
        where = f"HTTP {self.status}" if self.status is not None else "no response"
        self.args = (f"{self.service}: {where}: {message}",)

    def scrub(self, secrets: list[str]) -> "SourceError":
        """Replace every secret in the message (in place) and drop chained exceptions, whose text a traceback
        would print; returns self, ready to raise."""
        self._set_message(scrub(self.message, secrets))
        self.__cause__, self.__context__, self.__suppress_context__ = None, None, True
        return self


class AuthError(SourceError):
    """The service rejected every API key (401/403). Names the service and the key's *source*, never the key."""

    def __init__(self, service: str, status: int | None, message: str, code: str | None = None):
        super().__init__(service, status, message, fatal=True, code=code)


class QuotaExceeded(SourceError):
    """Every key's quota is used up (Elsevier ``X-ELS-Status: QUOTA_EXCEEDED``)."""

    def __init__(self, service: str, message: str):
        super().__init__(service, 429, message, fatal=True, code="QUOTA_EXCEEDED")


# ---------------------------------------------------------------------------------------------- keys
_KEY_SEPARATORS = re.compile(r"[,\r\n]")


def check_key(key: str, where: str) -> str:
    """Return ``key`` if it can travel in an HTTP header, else raise :class:`DataError` naming ``where`` (the
    variable or file line) and the offending character's position and code point, never the key itself.

    API keys are printable ASCII without spaces. A key with a newline inside made ``requests`` raise
    ``InvalidHeader`` quoting the whole header, which reached the log and the status file (issue 18).
    """
    for pos, char in enumerate(key, start=1):
        if "!" <= char <= "~":
            continue
        kind = ("whitespace" if char.isspace() else
                "a control character" if ord(char) < 32 or ord(char) == 127 else "a non-ASCII character")
        raise DataError(f"{where}: the API key holds {kind} (U+{ord(char):04X}) at character {pos} of {len(key)}; "
                        "a key is printable ASCII without spaces (put one key per line, or separate keys with "
                        "commas); the key itself is not shown")
    return key


def load_keys(key_file: str | os.PathLike | None = None, env_var: str | None = None) -> list[str]:
    """API keys from a key file (one per line or comma-separated, ``#`` comments) or else an environment
    variable (keys separated by commas or newlines, so ``VAR=$(cat keys.txt)`` works); blanks are dropped
    and every key is checked by :func:`check_key` before any request is sent.

    A key file that is given but holds no key is an error (the original raised too); no file and no
    variable means "no key", which S2 and PubChem allow.
    """
    if key_file:
        path = Path(key_file)
        if not path.exists():
            raise FileNotFoundError(f"{path}: key file not found")
        keys = []
        # utf-8-sig: a key file saved by an editor that writes a byte-order mark still reads as ASCII keys
        for lineno, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
            line = line.strip()
            if line and not line.startswith("#"):
                keys += [check_key(part.strip(), f"{path}:{lineno}") for part in line.split(",") if part.strip()]
        if not keys:
            raise DataError(f"{path}: the key file holds no key (one key per line, '#' starts a comment)")
        return keys
    if env_var and os.environ.get(env_var, "").strip():
        keys = [part.strip() for part in _KEY_SEPARATORS.split(os.environ[env_var]) if part.strip()]
        return [check_key(key, f"${env_var} (key {i} of {len(keys)})") for i, key in enumerate(keys, start=1)]
    return []


def scrub(text: str, secrets: list[str]) -> str:
    """Replace every secret in ``text`` by ``***`` (longest first, so a key that contains another key is
    replaced whole)."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class RateLimiter:
    """Minimum spacing between requests (``rate`` per second); ``None``/0 means unlimited. Thread-safe."""

    def __init__(self, rate: float | None):
        self.interval = 1.0 / rate if rate else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def next_slot(self) -> float:
        with self._lock:
            return self._next

    def reserve(self) -> float:
        """Book the next slot; return how long the caller must sleep before using it."""
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval
            return start - now

    def defer(self, seconds: float) -> None:
        """No request before ``now + seconds`` (a 429's Retry-After applies to the key that got it)."""
        with self._lock:
            self._next = max(self._next, time.monotonic() + seconds)


class KeyPool:
    """Rotation over API keys, each with its own rate limiter. An empty key list is one anonymous slot.

    ``acquire`` picks the active key whose next free slot comes first (ties: the least used key), so
    requests spread over the keys and the pool's throughput is the sum of the per-key rates.
    """

    def __init__(self, keys: list[str] | None, rate_per_key: float | None, service: str = "service",
                 key_source: str = "the configured keys"):
        self.service, self.key_source = service, key_source
        for i, key in enumerate(keys or [], start=1):  # keys given directly (not through load_keys) too
            check_key(key, f"{service}: key #{i} of {len(keys)} from {key_source}")
        self.keys: list[str | None] = list(keys) if keys else [None]
        self.limiters = [RateLimiter(rate_per_key) for _ in self.keys]
        self.active = [True] * len(self.keys)
        self.used = [0] * len(self.keys)
        self._lock = threading.Lock()

    @property
    def secrets(self) -> list[str]:
        return [k for k in self.keys if k]

    def n_active(self) -> int:
        return sum(self.active)

    def acquire(self) -> tuple[int, str | None]:
        """Return (index, key) of the key to use now, after sleeping for its rate limit."""
        with self._lock:
            live = [i for i, a in enumerate(self.active) if a]
            if not live:
                raise AuthError(self.service, None, f"no usable API key left (all keys from {self.key_source} "
                                                    "were rejected or ran out of quota)")
            i = min(live, key=lambda j: (self.limiters[j].next_slot(), self.used[j], j))
            self.used[i] += 1
            wait = self.limiters[i].reserve()
        if wait > 0:
            time.sleep(wait)
        return i, self.keys[i]

    def cooldown(self, index: int, seconds: float) -> None:
        self.limiters[index].defer(seconds)

    def disable(self, index: int) -> int:
        """Take key ``index`` out of rotation; return how many keys are left."""
        with self._lock:
            self.active[index] = False
            return sum(self.active)


# ---------------------------------------------------------------------------------------------- client
@dataclass
class ApiResponse:
    status: int
    data: Any  # decoded JSON (None when the body was not JSON)
    text: str
    headers: dict
    from_cache: bool = False


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds: either a number or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _json_or_none(resp: requests.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def default_error_message(resp: requests.Response) -> str:
    """A short message from a JSON error body (S2 ``error``/``message``, PubChem ``Fault``, Elsevier
    ``service-error``, MP ``error``/``detail``) or the start of a non-JSON body."""
    body = _json_or_none(resp)
    if isinstance(body, dict):
        if isinstance(body.get("Fault"), dict):
            fault = body["Fault"]
            return f"{fault.get('Code', '')}: {fault.get('Message', '')}".strip(": ")
        if isinstance(body.get("service-error"), dict):
            status = body["service-error"].get("status", {})
            return f"{status.get('statusCode', '')}: {status.get('statusText', '')}".strip(": ")
        for field in ("error", "message", "detail", "Message"):
            if body.get(field):
                return str(body[field])[:300]
    text = (resp.text or "").strip().replace("\n", " ")
    return text[:200] if text else (resp.reason or "")


class ApiClient:
    """GET/POST JSON with rate limits, key rotation, retries, Retry-After, timeouts and a response cache.

    ``auth_header`` names the header that carries the key (``x-api-key``, ``X-ELS-APIKey``,
    ``Authorization`` with ``auth_prefix="Bearer "``). ``key_rejected(resp)`` decides whether a 401/403
    means "this key is bad" (rotate/disable) or a request-level refusal (raised as is).
    """

    def __init__(self, service: str, base_url: str, *, keys: KeyPool | None = None,
                 auth_header: str | None = None, auth_prefix: str = "", headers: dict | None = None,
                 timeout: float = 30.0, max_retries: int = 5, backoff_base: float = 1.0,
                 backoff_max: float = 60.0, max_retry_after: float = 600.0, jitter: float = 0.1,
                 cache: ResponseCache | None = None, cache_statuses: tuple[int, ...] = (200, 404),
                 passthrough_statuses: tuple[int, ...] = (404,), key_env: str | None = None,
                 secrets: list[str] | None = None,
                 key_rejected: Callable[[requests.Response], bool] | None = None,
                 error_message: Callable[[requests.Response], str] = default_error_message):
        self.service = service
        self.base_url = base_url.rstrip("/")
        self.keys = keys or KeyPool([], None, service)
        self.auth_header, self.auth_prefix = auth_header, auth_prefix
        self.headers = dict(headers or {})
        self.timeout, self.max_retries = timeout, max_retries
        self.backoff_base, self.backoff_max, self.max_retry_after = backoff_base, backoff_max, max_retry_after
        self.jitter = jitter
        self.cache, self.cache_statuses = cache, tuple(cache_statuses)
        self.passthrough_statuses = tuple(passthrough_statuses)
        self.key_env = key_env
        self.extra_secrets = [s for s in (secrets or []) if s]  # e.g. Elsevier's insttoken header
        self.key_rejected = key_rejected or (lambda resp: True)
        self.error_message = error_message
        self._local = threading.local()
        self.stats = {"requests": 0, "cache_hits": 0, "retries": 0}
        self._rng = random.Random(0)

    # -- helpers
    @property
    def session(self) -> requests.Session:
        """One ``requests.Session`` per thread (sessions are not documented as thread-safe)."""
        if getattr(self._local, "session", None) is None:
            self._local.session = requests.Session()
        return self._local.session

    def _msg(self, text: str) -> str:
        return scrub(text, self.keys.secrets + self.extra_secrets)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (0-based): doubling from ``backoff_base`` up to
        ``backoff_max``, with jitter; public so that a client's own download loop (s2_download) waits alike."""
        wait = min(self.backoff_max, self.backoff_base * (2 ** attempt))
        return wait * (1.0 + self.jitter * self._rng.random())

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}" if path else self.base_url

    # -- the request loop
    def request(self, method: str, path: str, *, params: dict | None = None, data: dict | None = None,
                json_body: Any = None, headers: dict | None = None, use_cache: bool = True) -> ApiResponse:
        """Send one logical request (several attempts at most); return the response of a 2xx or passthrough
        status, raise :class:`SourceError` otherwise.

        The one exit of the HTTP core: whatever goes wrong inside (an error body echoing the key, requests'
        ``InvalidHeader`` quoting a header, a bug), what leaves is a :class:`SourceError` with every secret
        scrubbed and no chained exception.
        """
        secrets = self.keys.secrets + self.extra_secrets
        try:
            return self._request(method, path, params=params, data=data, json_body=json_body, headers=headers,
                                 use_cache=use_cache)
        except SourceError as exc:
            raise exc.scrub(secrets) from None
        except Exception as exc:  # noqa: BLE001 - its text may hold a key: only a scrubbed copy may leave
            raise SourceError(self.service, None, f"unexpected {type(exc).__name__} on {path}: {exc}"
                              ).scrub(secrets) from None

    def _request(self, method: str, path: str, *, params: dict | None, data: dict | None, json_body: Any,
                 headers: dict | None, use_cache: bool) -> ApiResponse:
        url = self.url(path)
        body = data if data is not None else json_body
        cache_key = None
        if self.cache is not None and use_cache:
            cache_key = ResponseCache.key(self.service, method, url, params, body)
            hit = self.cache.get(self.service, cache_key)
            if hit is not None:
                self.stats["cache_hits"] += 1
                return ApiResponse(hit["status"], hit["data"], "", {}, from_cache=True)
        last_error = "no attempt made"
        last_status: int | None = None
        for attempt in range(self.max_retries + 1):
            index, key = self.keys.acquire()
            send_headers = {**self.headers, **(headers or {})}
            if key and self.auth_header:
                send_headers[self.auth_header] = f"{self.auth_prefix}{key}"
            self.stats["requests"] += 1
            try:
                resp = self.session.request(method, url, params=params, data=data, json=json_body,
                                            headers=send_headers, timeout=self.timeout)
            except TRANSIENT_ERRORS as exc:
                kind = ("timed out" if isinstance(exc, requests.Timeout) else
                        "connection failed" if isinstance(exc, requests.ConnectionError) else
                        f"answer broken off ({type(exc).__name__})")
                last_error, last_status = f"{kind} (timeout {self.timeout:g} s) on {path}", None
                wait = self.backoff(attempt)
                logger.warning("%s: %s; attempt %d/%d%s", self.service, self._msg(last_error), attempt + 1,
                               self.max_retries + 1, self._next_step(attempt, wait))
                if attempt < self.max_retries:
                    self.stats["retries"] += 1
                    time.sleep(wait)
                continue
            except SETUP_ERRORS as exc:  # the same for every request: stop the run with a clear (scrubbed) reason
                raise SourceError(self.service, None, f"the request could not be sent ({type(exc).__name__}: "
                                                      f"{exc}); check the base URL and headers", fatal=True)

            status = resp.status_code
            if 200 <= status < 300 or status in self.passthrough_statuses:
                payload = _json_or_none(resp)
                if payload is None and 200 <= status < 300:
                    last_error, last_status = f"answer on {path} is not JSON: {resp.text[:120]!r}", status
                    if attempt < self.max_retries:
                        self.stats["retries"] += 1
                        time.sleep(self.backoff(attempt))
                    continue
                if cache_key is not None and status in self.cache_statuses:
                    self.cache.put(self.service, cache_key, {"status": status, "data": payload,
                                                             "url": url, "time": time.time()})
                return ApiResponse(status, payload, resp.text, dict(resp.headers))

            message = self._msg(self.error_message(resp))
            if status == 429 and "QUOTA_EXCEEDED" in resp.headers.get("X-ELS-Status", "").upper():
                left = self.keys.disable(index)
                logger.warning("%s: key #%d's quota is exhausted (QUOTA_EXCEEDED); %d key(s) left",
                               self.service, index + 1, left)
                if left == 0:
                    raise QuotaExceeded(self.service, f"quota exceeded for {self._key_source()} "
                                                      "(weekly quotas reset after 7 days)")
                continue
            if status in KEY_REJECTED_STATUSES and self.key_rejected(resp):
                left = self.keys.disable(index)
                who = f"key #{index + 1} of {len(self.keys.keys)}" if key else "the request without a key"
                logger.warning("%s: HTTP %d rejected %s (%s); %d key(s) left", self.service, status, who,
                               message, left)
                if left == 0:
                    raise AuthError(self.service, status,
                                    f"access refused ({message}) with {self._key_source()}; check the key file "
                                    "or environment variable", code=message.split(":")[0])
                continue
            if status in RETRY_STATUSES:
                retry_after = retry_after_seconds(resp.headers.get("Retry-After"))
                last_error, last_status = f"{message} on {path}", status
                if retry_after is not None and retry_after > self.max_retry_after:
                    raise SourceError(self.service, status, f"asks to wait {retry_after:.0f} s (more than "
                                      f"{self.max_retry_after:.0f} s); giving up for now: {message}")
                wait = retry_after if retry_after is not None else self.backoff(attempt)
                if status == 429:
                    self.keys.cooldown(index, wait)
                logger.warning("%s: HTTP %d (%s); attempt %d/%d%s", self.service, status, message, attempt + 1,
                               self.max_retries + 1, self._next_step(attempt, wait))
                if attempt < self.max_retries:
                    self.stats["retries"] += 1
                    if status != 429:  # a 429 wait is enforced by the key's limiter on the next acquire
                        time.sleep(wait)
                continue
            # Any other 4xx (400, 404 off the passthrough list, 414 URI Too Long, 422 ...): sending the same
            # request again gives the same answer, so it is permanent (06: "refused", not retried on --resume).
            raise SourceError(self.service, status, f"{message} (on {path})", code=message.split(":")[0],
                              permanent=400 <= status < 500)
        raise SourceError(self.service, last_status,
                          self._msg(f"gave up after {self.max_retries + 1} attempts: {last_error}"))

    def _next_step(self, attempt: int, wait: float) -> str:
        return f", retrying in {wait:.1f} s" if attempt < self.max_retries else ", giving up"

    def _key_source(self) -> str:
        if self.keys.secrets:
            return f"the key(s) from {self.keys.key_source}"
        return f"no API key (set ${self.key_env} or pass a key file)" if self.key_env else "no API key"

    def get_json(self, path: str, params: dict | None = None, **kw) -> ApiResponse:
        return self.request("GET", path, params=params, **kw)

    def post_form(self, path: str, data: dict, **kw) -> ApiResponse:
        return self.request("POST", path, data=data, **kw)

    def post_json(self, path: str, body: Any, **kw) -> ApiResponse:
        return self.request("POST", path, json_body=body, **kw)
