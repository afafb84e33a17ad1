"""Several OpenAI-compatible servers behind one client (issue 42): requests spread over them, a bounded number in
flight on each, and a request that fails on one server sent again to another.

Why: at the paper's scale generation is served (vLLM, llama.cpp, one server per node or per GPU), and one URL is one
server. ``OPENAI_URL`` may name several (comma-separated); 05, 06c, 06d and 09b all reach them through
:class:`repair.expansion.generation.OpenAIGenerator`, whose ``client`` is a :class:`ServerPool`. Outputs do not depend
on which server answered: every request carries its own seed, and its prompt (all servers must serve the same model).
A server that dies costs the requests it had in flight: each fails there (connection refused or broken off) and goes
to another server; the dead one is skipped for a cool-down that doubles with each failure, then tried again.

What a request's failure means is the HTTP core's (:class:`repair.expansion.sources.http.ApiClient`): a fatal error
(bad key, unusable URL) or a permanent one (a 4xx: the same request fails everywhere) is raised at once; anything else
(connection, timeout, 5xx, 429) is worth another server. With one server nothing changes: its client retries with
backoff, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from repair.expansion.sources.http import ApiClient, ApiResponse, SourceError

logger = logging.getLogger(__name__)

MAX_COOLDOWN = 30.0  # seconds a failing server is skipped at most before it is tried again


def split_urls(text: str) -> list[str]:
    """``"http://a:8000/v1, http://b:8000/v1"`` -> both URLs (commas or spaces between them); duplicates dropped."""
    urls = [u.strip() for u in text.replace(",", " ").split()]
    if not urls:
        raise ValueError("no server URL given")
    return list(dict.fromkeys(urls))


def server_label(url: str) -> str:
    """A URL as logs show it: scheme, host and port only (a URL may carry user:password@)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port}" if parts.port else f"{parts.scheme}://{parts.hostname}"


class _Server:
    def __init__(self, client: ApiClient, slots: int):
        self.client = client
        self.label = server_label(client.base_url)
        self.in_flight = 0
        self.slots = slots
        self.failures = 0  # consecutive
        self.down_until = 0.0
        self.answered = 0


class ServerPool:
    """``post_json`` / ``get_json`` like one :class:`ApiClient`, over one client per server.

    ``per_server`` bounds the requests in flight on each server (the caller's thread pool may be larger: a thread
    waits for a free slot). A request is tried on at most ``attempts`` servers in turn (default: every server
    ``max_retries + 1`` times), each time on the healthy server with the fewest requests in flight.
    """

    def __init__(self, clients: Sequence[ApiClient], *, per_server: int = 4, attempts: int | None = None,
                 backoff_base: float = 1.0, clock: Callable[[], float] = time.monotonic):
        if not clients:
            raise ValueError("a server pool needs at least one server")
        self.servers = [_Server(c, max(1, per_server)) for c in clients]
        self.attempts = attempts or len(clients) * (clients[0].max_retries + 1)
        self.backoff_base = backoff_base
        self.clock = clock
        self._cond = threading.Condition()
        self.base_url = ",".join(c.base_url for c in clients)
        self.stats = {"requests": 0, "failed_over": 0}

    @property
    def size(self) -> int:
        return len(self.servers)

    def _acquire(self, avoid: set[int]) -> _Server:
        """A free slot on the best server: up, not ``avoid`` (where this request already failed) while another is
        up, fewest in flight. Waits when every slot is taken, or until the first server's cool-down ends."""
        with self._cond:
            while True:
                now = self.clock()
                up = [i for i, s in enumerate(self.servers) if s.down_until <= now]
                fresh = [i for i in up if i not in avoid] or up
                free = [i for i in fresh if self.servers[i].in_flight < self.servers[i].slots]
                if free:
                    best = min(free, key=lambda i: (self.servers[i].in_flight, self.servers[i].failures, i))
                    server = self.servers[best]
                    server.in_flight += 1
                    return server
                if up:
                    self._cond.wait(timeout=1.0)
                else:
                    self._cond.wait(timeout=max(0.01, min(s.down_until for s in self.servers) - now))

    def _release(self, server: _Server, error: SourceError | None) -> None:
        with self._cond:
            server.in_flight -= 1
            if error is None:
                server.failures, server.down_until = 0, 0.0
                server.answered += 1
            elif self.size > 1:  # one server: its client already retried with backoff; nothing to skip to
                server.failures += 1
                wait = min(MAX_COOLDOWN, self.backoff_base * 2 ** (server.failures - 1))
                server.down_until = self.clock() + wait
                logger.warning("%s failed (%s); skipping it for %.1f s, the request goes to another server",
                               server.label, error, wait)
            self._cond.notify_all()

    def request(self, method: str, path: str, **kw: Any) -> ApiResponse:
        tried: set[int] = set()
        last: SourceError | None = None
        for _ in range(self.attempts):
            server = self._acquire(tried)
            try:
                resp = server.client.request(method, path, **kw)
            except SourceError as exc:
                self._release(server, None if (exc.fatal or exc.permanent) else exc)
                if exc.fatal or exc.permanent or self.size == 1:
                    raise
                tried.add(self.servers.index(server))
                last = exc
                self.stats["failed_over"] += 1
                continue
            self._release(server, None)
            self.stats["requests"] += 1
            return resp
        assert last is not None
        raise SourceError(last.service, last.status, f"failed on every server ({self.size}) {self.attempts} "
                                                     f"times; last: {last.message}")

    def get_json(self, path: str, params: dict | None = None, **kw: Any) -> ApiResponse:
        return self.request("GET", path, params=params, **kw)

    def post_json(self, path: str, body: Any, **kw: Any) -> ApiResponse:
        return self.request("POST", path, json_body=body, **kw)

    def answered(self) -> dict[str, int]:
        """Requests each server answered (for logs: how the work spread)."""
        return {s.label: s.answered for s in self.servers}
