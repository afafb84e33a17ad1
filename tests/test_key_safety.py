"""API keys never leak (issue 18 item 1), for every service REPAIR talks to: Semantic Scholar, Elsevier,
PubChem, the Materials Project and an OpenAI-compatible generator.

The issue's case: ``S2_API_KEY=$(cat keys.txt)`` with two lines made ``requests`` raise ``InvalidHeader``
quoting the whole header, and both keys landed 40 times in stderr and in the status file. Here each keyed
service gets two keys in one variable *separated by a newline*, against a hostile local server that echoes
every header it receives into its error bodies (400, 429, 5xx, a non-JSON 200); the real scripts run at
DEBUG level as subprocesses, and stdout, stderr and every file they wrote (output, status, rounds, cache)
are searched for each key. Keys that cannot go in a header are refused before the first request, naming
the variable or file line, never the key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from repair.data import DataError, read_jsonl
from repair.expansion.cli import verification_main
from repair.expansion.sources.http import ApiClient, KeyPool, SourceError, load_keys
from repair.expansion.verification import read_status
from tests.helpers_sources import (FakeServer, Reply, elsevier_route, mp_route, openai_route, pubchem_route,
                                   s2_paper, s2_route, scopus_entry)

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "expansion"
PAPERS, GENERATED = FIX / "papers.jsonl", FIX / "generated.jsonl"


def _echo(req) -> str:
    """Every header value the client sent: what a hostile or buggy server might put in an error body."""
    return " | ".join(f"{k}={v}" for k, v in sorted(req.headers.items()))


def _everything_written(proc: subprocess.CompletedProcess, folder: Path) -> list[str]:
    return [proc.stdout, proc.stderr] + [p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file()]


def _assert_no_secret(texts: list[str], secrets: list[str]) -> None:
    for secret in secrets:
        hits = sum(t.count(secret) for t in texts)
        assert hits == 0, f"{secret!r} leaked {hits} time(s)"


def _run(script: str, args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / script), *args, "--log_level", "DEBUG", "--no_progress"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------- loading
def test_keys_split_on_newlines_and_commas(tmp_path, monkeypatch):
    monkeypatch.setenv("X_KEYS", "key-one\nkey-two, key-three\r\n\n")
    assert load_keys(None, "X_KEYS") == ["key-one", "key-two", "key-three"]
    f = tmp_path / "keys.txt"
    f.write_text("\ufeff# keys\nkey-one, key-two\n\nkey-three\n", encoding="utf-8")  # BOM from an editor
    assert load_keys(f) == ["key-one", "key-two", "key-three"]


@pytest.mark.parametrize("bad,kind", [("abc\tSECRETPART", "whitespace"), ("abc SECRETPART", "whitespace"),
                                      ("abc\x07SECRETPART", "a control character"),
                                      ("abc\u00e9SECRETPART", "a non-ASCII character")])
def test_a_key_that_cannot_go_in_a_header_is_refused_naming_where_not_what(bad, kind, tmp_path, monkeypatch):
    monkeypatch.setenv("X_KEYS", f"good-key,{bad}")
    with pytest.raises(DataError) as err:
        load_keys(None, "X_KEYS")
    assert str(err.value).startswith(f"$X_KEYS (key 2 of 2): the API key holds {kind}")
    assert "SECRETPART" not in str(err.value)
    f = tmp_path / "keys.txt"
    f.write_text(f"# comment\ngood-key\n{bad}\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        load_keys(f)
    assert str(err.value).startswith(f"{f}:3: the API key holds {kind}") and "SECRETPART" not in str(err.value)
    with pytest.raises(DataError, match="demo: key #1 of 1 from the test") as err:  # keys given directly too
        KeyPool([bad], None, "demo", "the test")
    assert "SECRETPART" not in str(err.value)
    from repair.expansion.sources.http import check_key

    assert check_key("sk-Abc_123.~!", "x") == "sk-Abc_123.~!"


def test_06_refuses_a_bad_key_before_any_request(tmp_path, monkeypatch):
    with FakeServer(s2_route([s2_paper(0, "Graphene", "abstract")])) as srv:
        keys = tmp_path / "keys.txt"
        keys.write_text("good-key-1\nbad key-SECRETPART\n")
        args = ["--generated_jsonl", str(GENERATED), "--out_jsonl", str(tmp_path / "exp.jsonl"), "--api_url",
                srv.url + "/graph/v1", "--rate", "0", "--cache_dir", "none", "--no_progress"]
        with pytest.raises(DataError, match=rf"{keys}:2: the API key holds whitespace") as err:
            verification_main("semantic_scholar", [*args, "--key_file", str(keys)])
        assert "SECRETPART" not in str(err.value)
        monkeypatch.setenv("S2_API_KEY", "good-key-1\nbad\x1bkey-SECRETPART")
        with pytest.raises(DataError, match=r"\$S2_API_KEY \(key 2 of 2\): the API key holds a control") as err:
            verification_main("semantic_scholar", args)
        assert "SECRETPART" not in str(err.value)
        assert srv.requests == []


# ---------------------------------------------------------------------------------------------- the core
def test_requests_own_and_unexpected_exceptions_leave_scrubbed(caplog):
    """``InvalidHeader`` quotes the header value; a parser bug may quote anything: only a scrubbed SourceError
    without a chained exception (a traceback would print the original) may leave the HTTP core."""
    secret = "sk-PLANTED-core-0123456789"
    caplog.set_level("DEBUG")
    with FakeServer(lambda req: Reply(400, {"error": "no"})) as srv:
        client = ApiClient("demo", srv.url, headers={"X-Trace": f"a\n{secret}"}, secrets=[secret], max_retries=0)
        with pytest.raises(SourceError) as err:
            client.get_json("search")
        assert "InvalidHeader" in str(err.value) and "***" in str(err.value) and err.value.fatal
        tb = "".join(traceback.format_exception(err.value))
        assert secret not in tb and err.value.__context__ is None

        def parser_bug(resp):
            raise KeyError(f"unexpected body for key {resp.request.headers['x-api-key']}")

        client = ApiClient("demo", srv.url, keys=KeyPool([secret], None), auth_header="x-api-key", max_retries=0,
                           error_message=parser_bug)
        with pytest.raises(SourceError) as err:
            client.get_json("search")
        assert "unexpected KeyError" in str(err.value) and "for key ***" in str(err.value)
        assert not err.value.fatal and secret not in "".join(traceback.format_exception(err.value))
    assert secret not in caplog.text


# ---------------------------------------------------------------------------------------------- services
def _s2_papers() -> list[dict]:
    return [s2_paper(i, r["title"], r["abstract"] or None) for i, r in enumerate(read_jsonl(PAPERS))]


def test_semantic_scholar_keys_never_leak(tmp_path):
    keys = ["S2-PLANTED-key-one", "S2-PLANTED-key-two"]
    normal = s2_route(_s2_papers(), set(keys))
    seen_429 = set()

    def hostile(req):
        q = req.query.get("query", "")
        if "zxcvbnm" in q:
            return Reply(400, {"error": f"bad request: {_echo(req)}"})  # permanent: "refused"
        if "venetoclax" in q:
            return Reply(500, {"message": f"internal error: {_echo(req)}"})  # retried, then "failed"
        if "STING" in q:
            return Reply(200, f"<html>not json: {_echo(req)}</html>")  # retried, then "failed"
        if "Hall mobility" in q and q not in seen_429:
            seen_429.add(q)
            return Reply(429, {"message": f"slow down {_echo(req)}"}, {"Retry-After": "0"})
        return normal(req)

    with FakeServer(hostile) as srv:
        proc = _run("expansion/06_semantic_scholar.py",
                    ["--generated_jsonl", str(GENERATED), "--out_jsonl", str(tmp_path / "exp.jsonl"), "--api_url",
                     srv.url + "/graph/v1", "--rate", "0", "--max_retries", "1", "--backoff", "0.01",
                     "--cache_dir", str(tmp_path / "cache")], {"S2_API_KEY": "\n".join(keys)})
        sent = {r.headers.get("x-api-key") for r in srv.requests}
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sent == set(keys)  # split on the newline: two keys, both used, each alone in its header
    status = read_status(tmp_path / "exp.jsonl.status.jsonl")
    assert status["r0-2"]["status"] == "refused" and "x-api-key=***" in status["r0-2"]["reason"]
    assert status["r0-1"]["status"] == "failed" and "x-api-key=***" in status["r0-1"]["reason"]
    assert status["r0-4"]["status"] == "failed" and "not JSON" in status["r0-4"]["reason"]
    assert status["r2-2"]["status"] in ("ok", "duplicate") and "slow down" in proc.stderr
    assert read_jsonl(tmp_path / "exp.jsonl")
    _assert_no_secret(_everything_written(proc, tmp_path), keys)


def test_elsevier_keys_and_insttoken_never_leak(tmp_path):
    keys, token = ["ELS-PLANTED-key-one", "ELS-PLANTED-key-two"], "INST-PLANTED-token"
    entries = [scopus_entry(i, r["title"], r["abstract"] or "x") for i, r in enumerate(read_jsonl(PAPERS))]
    normal = elsevier_route(entries, set(keys))

    def hostile(req):
        q = req.query.get("query", "")
        if "zxcvbnm" in q.lower():
            return Reply(400, {"service-error": {"status": {"statusCode": "INVALID_INPUT",
                                                            "statusText": f"bad query from {_echo(req)}"}}})
        if "venetoclax" in q.lower():
            return Reply(503, {"service-error": {"status": {"statusCode": "GENERAL_SYSTEM_ERROR",
                                                            "statusText": f"busy {_echo(req)}"}}})
        return normal(req)

    with FakeServer(hostile) as srv:
        proc = _run("expansion/06_elsevier.py",
                    ["--generated_jsonl", str(GENERATED), "--out_jsonl", str(tmp_path / "exp.jsonl"), "--api_url",
                     srv.url, "--rate", "0", "--max_retries", "1", "--backoff", "0.01", "--view", "COMPLETE",
                     "--cache_dir", str(tmp_path / "cache")],
                    {"ELSEVIER_API_KEY": "\n".join(keys), "ELSEVIER_INSTTOKEN": token})
        sent = {r.headers.get("x-els-apikey") for r in srv.requests}
        tokens = {r.headers.get("x-els-insttoken") for r in srv.requests}
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sent == set(keys) and tokens == {token}
    status = read_status(tmp_path / "exp.jsonl.status.jsonl")
    assert status["r0-2"]["status"] == "refused" and "x-els-apikey=***" in status["r0-2"]["reason"]
    assert "x-els-insttoken=***" in status["r0-2"]["reason"]
    assert status["r0-1"]["status"] == "failed" and "busy" in status["r0-1"]["reason"]
    _assert_no_secret(_everything_written(proc, tmp_path), [*keys, token])


def test_pubchem_materials_project_and_openai_keys_never_leak(tmp_path):
    """05 with an OpenAI-compatible generator and PubChem + MP grounding: grounding errors are written into
    the generated file itself, so an echoed key would land in an output, not just a log."""
    mp_keys, openai_keys = ["MP-PLANTED-key-one", "MP-PLANTED-key-two"], ["sk-PLANTED-key-one", "sk-PLANTED-key-two"]
    secrets = [*mp_keys, *openai_keys]
    normal_mp, normal_pc = mp_route(keys=set(mp_keys)), pubchem_route()
    llm_calls = []

    def hostile_mp(req):
        if req.query.get("formula") == "Fe2O3":
            return Reply(400, {"detail": f"bad formula request: {_echo(req)}"})
        return normal_mp(req)

    def hostile_pubchem(req):
        if req.form.get("name") == "graphene":
            return Reply(400, {"Fault": {"Code": "PUGREST.BadRequest", "Message": f"bad {_echo(req)}"}})
        return normal_pc(req)

    normal_llm = openai_route(lambda m, s: "Query: how do squeezed carbon sheets and rust pigments share electrons",
                              model="gen", key=None)

    def hostile_llm(req):
        llm_calls.append(req.headers.get("authorization"))
        if len(llm_calls) == 2:
            return Reply(503, {"error": {"message": f"overloaded; you sent {_echo(req)}"}})
        if req.headers.get("authorization") not in {f"Bearer {k}" for k in openai_keys}:
            return Reply(401, {"error": {"message": f"Incorrect API key provided: {_echo(req)}"}})
        return normal_llm(req)

    concepts = tmp_path / "concepts.txt"
    concepts.write_text("graphene\nFe2O3\nTiO2\n")
    with FakeServer(hostile_llm) as llm, FakeServer(hostile_mp) as mp, FakeServer(hostile_pubchem) as pc:
        proc = _run("expansion/05_query_generation.py",
                    ["--backend", "openai", "--openai_url", llm.url + "/v1", "--concept_txt", str(concepts),
                     "--out_jsonl", str(tmp_path / "gen.jsonl"), "--num_queries", "4", "--round_size", "4",
                     "--min_concepts", "3", "--max_concepts", "3", "--grounding", "both", "--mp_url", mp.url,
                     "--pubchem_url", pc.url + "/rest/pug", "--cache_dir", str(tmp_path / "cache")],
                    {"MP_API_KEY": "\n".join(mp_keys), "OPENAI_API_KEY": "\n".join(openai_keys)})
        mp_sent = {r.headers.get("x-api-key") for r in mp.requests}
        pubchem_headers = [r.headers for r in pc.requests]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert mp_sent == set(mp_keys) and set(llm_calls) == {f"Bearer {k}" for k in openai_keys}
    assert pubchem_headers and not any(s in json.dumps(h) for h in pubchem_headers for s in secrets)
    rec = read_jsonl(tmp_path / "gen.jsonl")[0]
    assert "x-api-key=***" in rec["grounding_errors"]["Fe2O3"]  # MP's echo, scrubbed, in the output file
    assert "PUGREST.BadRequest" in rec["grounding_errors"]["graphene"]
    assert "overloaded; you sent" in proc.stderr and "Bearer ***" in proc.stderr  # the 503 was logged, scrubbed
    _assert_no_secret(_everything_written(proc, tmp_path), secrets)
