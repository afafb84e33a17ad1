"""The HTTP core on its own: key loading, scrubbing, Retry-After parsing, the rate limiter, the cache key,
keys echoed by a server never reaching an exception or a log line, and give-up rules."""

from __future__ import annotations

import email.utils
import logging
import time

import pytest

from repair.expansion.sources.cache import ResponseCache
from repair.expansion.sources.http import ApiClient, KeyPool, RateLimiter, SourceError, load_keys, retry_after_seconds, scrub
from tests.helpers_sources import FakeServer, Reply

SECRET = "sk-live-PLANTED-0123456789abcdef"


def test_load_keys_file_env_and_errors(tmp_path, monkeypatch):
    f = tmp_path / "keys.txt"
    f.write_text("# my keys\nkey-one\n\n  key-two  \n#key-three\n")
    assert load_keys(f) == ["key-one", "key-two"]
    monkeypatch.setenv("X_TEST_KEYS", " a1, b2 ,,c3")
    assert load_keys(None, "X_TEST_KEYS") == ["a1", "b2", "c3"]
    assert load_keys(f, "X_TEST_KEYS") == ["key-one", "key-two"]  # an explicit file wins
    monkeypatch.delenv("X_TEST_KEYS")
    assert load_keys(None, "X_TEST_KEYS") == []
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="holds no key"):
        load_keys(tmp_path / "empty.txt")
    with pytest.raises(FileNotFoundError):
        load_keys(tmp_path / "nope.txt")


def test_scrub_and_retry_after():
    assert scrub(f"bad key {SECRET} (again {SECRET})", [SECRET, ""]) == "bad key *** (again ***)"
    assert retry_after_seconds("3") == 3.0 and retry_after_seconds(" 0.5 ") == 0.5
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_seconds(date) <= 31
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_rate_limiter_spaces_reservations():
    limiter = RateLimiter(10.0)
    waits = [limiter.reserve() for _ in range(4)]
    assert waits[0] == pytest.approx(0.0, abs=0.01)
    assert [b - a for a, b in zip(waits, waits[1:])] == pytest.approx([0.1, 0.1, 0.1], abs=0.01)
    assert RateLimiter(None).reserve() == 0.0


def test_key_pool_prefers_the_key_free_first():
    pool = KeyPool(["a", "b"], 10.0)
    order = [pool.acquire()[1] for _ in range(4)]
    assert order == ["a", "b", "a", "b"]
    pool.cooldown(0, 5.0)  # "a" got a 429 with Retry-After: 5
    assert [pool.acquire()[1] for _ in range(2)] == ["b", "b"]


def test_cache_key_ignores_param_order_and_never_holds_keys():
    k1 = ResponseCache.key("s2", "GET", "http://h/x", {"a": 1, "b": "two"})
    assert k1 == ResponseCache.key("s2", "get", "http://h/x", {"b": "two", "a": 1})
    assert k1 != ResponseCache.key("s2", "GET", "http://h/x", {"a": 2, "b": "two"})
    assert k1 != ResponseCache.key("elsevier", "GET", "http://h/x", {"a": 1, "b": "two"})


def test_key_echoed_by_the_server_is_scrubbed(caplog):
    """A server that echoes the key in its error body: neither the exception nor the log may show it."""
    def route(req):
        return Reply(400, {"error": f"malformed request from key {req.headers.get('x-api-key')}"})

    caplog.set_level(logging.DEBUG)
    with FakeServer(route) as srv:
        client = ApiClient("demo", srv.url, keys=KeyPool([SECRET], None), auth_header="x-api-key", max_retries=0)
        with pytest.raises(SourceError) as err:
            client.get_json("search", {"q": "x"})
        assert srv.requests[0].headers["x-api-key"] == SECRET  # it was sent, in a header only
        assert SECRET not in srv.requests[0].path
    assert "malformed request from key ***" in str(err.value)
    assert SECRET not in str(err.value) and SECRET not in caplog.text


def test_retry_after_beyond_the_limit_gives_up_at_once():
    with FakeServer(lambda req: Reply(429, {"message": "Too Many Requests"}, {"Retry-After": "3600"})) as srv:
        client = ApiClient("demo", srv.url, max_retry_after=5)
        start = time.monotonic()
        with pytest.raises(SourceError, match="asks to wait 3600 s") as err:
            client.get_json("x")
    assert time.monotonic() - start < 2 and not err.value.fatal and len(srv.requests) == 1


def test_non_json_200_is_retried_and_5xx_gives_up_after_max_retries():
    with FakeServer(lambda req: Reply(200, {"ok": True})) as srv:
        srv.queue.append(Reply(200, "<html>captive portal</html>"))
        client = ApiClient("demo", srv.url, backoff_base=0.01)
        assert client.get_json("x").data == {"ok": True} and len(srv.requests) == 2
    with FakeServer(lambda req: Reply(502, "<html>Bad Gateway</html>")) as srv:
        client = ApiClient("demo", srv.url, max_retries=2, backoff_base=0.01)
        with pytest.raises(SourceError, match="gave up after 3 attempts") as err:
            client.get_json("x")
        assert err.value.status == 502 and len(srv.requests) == 3 and not err.value.fatal
