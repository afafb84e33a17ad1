"""The four remote clients against real HTTP servers on 127.0.0.1 answering in each API's documented shape.

Parametrised over every client: 429 + Retry-After then success (the client really waited), 503 ServerBusy
then success, timeouts retried then a (non-fatal) failure, the response cache preventing a second request;
over the keyed ones: a 403/401 bad key gives a clear error naming the service (never the key), rotation
spreads requests over the keys. Then each API's own cases: normal page, empty result, null abstracts,
pagination limits, COMPLETE/STANDARD views, QUOTA_EXCEEDED, PubChem faults, MP's most stable entry.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from repair.expansion.sources import AuthError, QuotaExceeded, ResponseCache, SourceError
from repair.expansion.sources.elsevier import ElsevierScopus, keyword_queries
from repair.expansion.sources.materials_project import MaterialsProject, looks_like_formula
from repair.expansion.sources.pubchem import PubChem
from repair.expansion.sources.semantic_scholar import SemanticScholar
from tests.helpers_sources import (FakeServer, Reply, elsevier_route, mp_route, pubchem_route, s2_paper, s2_route,
                                   scopus_entry)

FAST = dict(backoff_base=0.01, backoff_max=0.05)
KEYS = ["key-AAAA-1111", "key-BBBB-2222", "key-CCCC-3333"]

S2_PAPERS = [s2_paper(0, "Graphene electron mobility under pressure", "We measure mobility in graphene.", "10.1/g0"),
             s2_paper(1, "Graphene oxide membranes", None, "10.1/g1"),
             s2_paper(2, "Perovskite solar cells", "Efficiency of perovskite cells.", "10.1/p2")]
SCOPUS = [scopus_entry(0, "Graphene electron mobility", "Mobility of graphene measured at 4 K."),
          scopus_entry(1, "Graphene oxide membranes for water", "Membranes of graphene oxide filter salt."),
          scopus_entry(2, "Perovskite solar cells", "Perovskite efficiency reached 25 percent.")]


@dataclass
class Case:
    name: str
    route: Callable[..., Any]  # route(keys) -> handler
    build: Callable[..., Any]  # build(url, keys, **client_kw) -> client
    call: Callable[[Any, int], Any]  # call(client, i) -> result (i varies the request)
    check: Callable[[Any], None]  # asserts on a successful result
    keyed: bool
    busy_body: Any  # the API's 503 body


def _s2_check(papers):
    assert [p.title for p in papers][:1] == ["Graphene electron mobility under pressure"]


def _els_check(papers):
    assert papers and papers[0].title.startswith("Graphene") and papers[0].abstract


def _pc_check(attrs):
    assert attrs["formula"] == "C9H8O4" and attrs["molecular_weight"] == pytest.approx(180.16)


def _mp_check(attrs):
    assert attrs["material_id"] == "mp-19770"


CASES = [
    Case("semantic_scholar", lambda keys: s2_route(S2_PAPERS, keys),
         lambda url, keys, **kw: SemanticScholar(url + "/graph/v1", keys=keys, rate=None, **kw),
         lambda c, i: c.search(["graphene", "graphene mobility", "graphene oxide", "graphene pressure",
                                "graphene electron", "graphene membranes"][i % 6], 5), _s2_check, True,
         {"message": "Service Unavailable"}),
    Case("elsevier", lambda keys: elsevier_route(SCOPUS, keys),
         lambda url, keys, **kw: ElsevierScopus(url, keys=keys, rate=None, view="COMPLETE", insttoken="", **kw),
         lambda c, i: c.search(["graphene", "graphene mobility", "graphene oxide", "graphene electron",
                                "graphene membranes", "graphene water"][i % 6], 5), _els_check, True,
         {"service-error": {"status": {"statusCode": "GENERAL_SYSTEM_ERROR", "statusText": "busy"}}}),
    Case("pubchem", lambda keys: pubchem_route(),
         lambda url, keys, **kw: PubChem(url + "/rest/pug", rate=None, **kw),
         lambda c, i: c.ground("aspirin"), _pc_check, False,
         {"Fault": {"Code": "PUGREST.ServerBusy", "Message": "Too many requests or server too busy"}}),
    Case("materials_project", lambda keys: mp_route(keys=keys),
         lambda url, keys, **kw: MaterialsProject(url, keys=keys, rate=None, **kw),
         lambda c, i: c.ground("Fe2O3"), _mp_check, True,
         {"error": "Service unavailable"}),
]
KEYED = [c for c in CASES if c.keyed]


def _keys(case: Case, n: int = 1) -> list[str] | None:
    return KEYS[:n] if case.keyed else None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_429_retry_after_is_honoured(case):
    with FakeServer(case.route(set(KEYS) if case.keyed else None)) as srv:
        client = case.build(srv.url, _keys(case), **FAST)
        srv.queue.append(Reply(429, {"message": "Too Many Requests"},
                               {"Retry-After": "1", "x-amzn-ErrorType": "TooManyRequestsException"}))
        start = time.monotonic()
        result = case.call(client, 0)
        waited = time.monotonic() - start
        case.check(result)
        assert waited >= 1.0, f"{case.name} retried after {waited:.2f}s, before the 1 s Retry-After"
        assert len(srv.requests) >= 2


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_503_server_busy_then_success(case):
    with FakeServer(case.route(set(KEYS) if case.keyed else None)) as srv:
        client = case.build(srv.url, _keys(case), **FAST)
        srv.queue += [Reply(503, case.busy_body),
                      Reply(503, "<html><body><h1>503 Service Unavailable</h1>Server busy</body></html>")]
        case.check(case.call(client, 0))
        assert client_stats(client)["retries"] >= 2


def client_stats(client) -> dict:
    inner = getattr(client, "client", None) or client.search_client
    return inner.stats


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_timeout_is_retried_then_fails_without_fatal(case):
    with FakeServer(case.route(set(KEYS) if case.keyed else None)) as srv:
        srv.slow_all = 0.6
        client = case.build(srv.url, _keys(case), timeout=0.15, max_retries=1, **FAST)
        with pytest.raises(SourceError) as err:
            case.call(client, 0)
        assert not err.value.fatal  # recorded as failed by 06, retried on --resume
        assert err.value.service == case.name and "timed out" in str(err.value)
        assert len(srv.requests) == 2  # first try + one retry


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_response_cache_prevents_a_second_request(case, tmp_path):
    with FakeServer(case.route(set(KEYS) if case.keyed else None)) as srv:
        first = case.build(srv.url, _keys(case), cache=ResponseCache(tmp_path), **FAST)
        a = case.call(first, 0)
        n = len(srv.requests)
        # a new client (a resumed run) with another key reads the same cache: no request at all
        second = case.build(srv.url, KEYS[1:2] if case.keyed else None, cache=ResponseCache(tmp_path), **FAST)
        b = case.call(second, 0)
        assert len(srv.requests) == n and a == b
        for f in tmp_path.rglob("*.json"):
            assert not any(k in f.read_text() for k in KEYS)


@pytest.mark.parametrize("case", KEYED, ids=lambda c: c.name)
def test_bad_key_gives_clear_error_naming_the_service_not_the_key(case, caplog):
    with FakeServer(case.route({"the-only-good-key"})) as srv:
        client = case.build(srv.url, ["bad-secret-key-0001"], **FAST)
        with pytest.raises(AuthError) as err:
            case.call(client, 0)
    msg = str(err.value)
    assert case.name in msg and err.value.fatal
    assert "bad-secret-key-0001" not in msg and "bad-secret-key-0001" not in caplog.text


@pytest.mark.parametrize("case", KEYED, ids=lambda c: c.name)
def test_bad_key_is_skipped_when_other_keys_work(case):
    with FakeServer(case.route({KEYS[1]})) as srv:
        client = case.build(srv.url, [KEYS[0], KEYS[1]], **FAST)
        case.check(case.call(client, 0))
        case.check(case.call(client, 1))
        used = [r.headers.get("x-api-key") or r.headers.get("x-els-apikey") for r in srv.requests]
        assert used.count(KEYS[0]) == 1  # rejected once, then out of the rotation


@pytest.mark.parametrize("case", KEYED, ids=lambda c: c.name)
def test_key_rotation_spreads_requests(case):
    with FakeServer(case.route(set(KEYS))) as srv:
        client = case.build(srv.url, KEYS, **FAST)
        for i in range(6):
            case.call(client, i)
        used = Counter(r.headers.get("x-api-key") or r.headers.get("x-els-apikey") for r in srv.requests)
        assert set(used) == set(KEYS)
        assert max(used.values()) - min(used.values()) <= 1, used


def test_per_key_rate_limit_with_rotation_doubles_throughput():
    """S2 allows 1 req/s per key: 4 requests with one key at 5/s take >= 0.6 s; with two keys about half."""
    with FakeServer(s2_route(S2_PAPERS, set(KEYS))) as srv:
        one = SemanticScholar(srv.url + "/graph/v1", keys=KEYS[:1], rate=5.0, **FAST)
        start = time.monotonic()
        for q in ["graphene", "perovskite", "mobility", "membranes"]:
            one.search(q, 3)
        t_one = time.monotonic() - start
        two = SemanticScholar(srv.url + "/graph/v1", keys=KEYS[:2], rate=5.0, **FAST)
        start = time.monotonic()
        for q in ["graphene", "perovskite", "mobility", "membranes"]:
            two.search(q, 3)
        t_two = time.monotonic() - start
    assert t_one >= 0.6 - 0.02  # 3 gaps of 0.2 s
    assert t_two >= 0.2 - 0.02 and t_two < t_one


# ---------------------------------------------------------------------------------------------- Semantic Scholar
def test_s2_normal_page_null_abstract_and_fields():
    with FakeServer(s2_route(S2_PAPERS)) as srv:
        papers = SemanticScholar(srv.url + "/graph/v1", keys=[], rate=None).search("graphene", 10)
        req = srv.requests[0]
    assert [p.id for p in papers] == ["s2-0000", "s2-0001"]
    assert papers[0].doi == "10.1/g0" and papers[0].year == 2000 and papers[0].venue == "Journal of Tests"
    assert papers[1].abstract == ""  # null abstract (elided by the publisher) becomes "", not "None"
    assert set(req.query["fields"].split(",")) >= {"title", "abstract", "externalIds", "year", "venue"}
    assert "x-api-key" not in req.headers  # no key: the header is omitted


def test_s2_empty_result_shape():
    with FakeServer(s2_route(S2_PAPERS)) as srv:
        assert SemanticScholar(srv.url + "/graph/v1", keys=[], rate=None).search("zeolite", 20) == []
        assert len(srv.requests) == 1


def test_s2_pagination_respects_limit_and_offset_cap():
    papers = [s2_paper(i, f"Catalysis study number {i}", f"Abstract {i}") for i in range(1500)]
    with FakeServer(s2_route(papers)) as srv:
        client = SemanticScholar(srv.url + "/graph/v1", keys=[], rate=None)
        got = client.search("catalysis", 250)
        pages = [(int(r.query["offset"]), int(r.query["limit"])) for r in srv.requests]
        assert [p.id for p in got] == [f"s2-{i:04d}" for i in range(250)]
        assert pages == [(0, 100), (100, 100), (200, 50)]
        srv.requests.clear()
        got = client.search("catalysis", 5000)
        pages = [(int(r.query["offset"]), int(r.query["limit"])) for r in srv.requests]
    assert len(got) == 1000  # the API's hard cap
    assert all(limit <= 100 and off + limit <= 1000 for off, limit in pages)


def test_s2_bad_request_is_a_clear_non_fatal_error():
    with FakeServer(lambda req: Reply(400, {"error": "Unrecognized or unsupported fields: [unknown]"})) as srv:
        with pytest.raises(SourceError) as err:
            SemanticScholar(srv.url, keys=[], rate=None).search("x", 3)
    assert err.value.status == 400 and "Unrecognized" in str(err.value) and not err.value.fatal


# ---------------------------------------------------------------------------------------------- Elsevier
def test_elsevier_complete_view_gives_abstracts_and_headers():
    with FakeServer(elsevier_route(SCOPUS, {KEYS[0]})) as srv:
        client = ElsevierScopus(srv.url, keys=KEYS[:1], insttoken="inst-TOKEN-9", rate=None, view="COMPLETE")
        papers = client.search("graphene mobility", 5)
        req = srv.requests[0]
    assert [p.title for p in papers] == ["Graphene electron mobility"]
    assert papers[0].abstract == "Mobility of graphene measured at 4 K." and papers[0].year == 2010
    assert papers[0].id == "8500000000" and papers[0].doi == "10.1000/scopus.0"
    assert req.query["view"] == "COMPLETE" and int(req.query["count"]) <= 25
    assert req.query["query"] == "TITLE-ABS-KEY(graphene AND mobility)"
    assert req.headers["accept"] == "application/json" and req.headers["x-els-insttoken"] == "inst-TOKEN-9"


def test_elsevier_auto_view_falls_back_to_standard_plus_abstract_retrieval():
    with FakeServer(elsevier_route(SCOPUS, {KEYS[0]}, entitled=False)) as srv:
        client = ElsevierScopus(srv.url, keys=KEYS[:1], rate=None, view="auto", insttoken="")
        papers = client.search("graphene", 5)
        views = [r.query.get("view") for r in srv.paths("/content/search/scopus")]
        fetched = srv.paths("/content/abstract/")
    assert views == ["COMPLETE", "STANDARD"]
    assert [p.abstract for p in papers] == ["Mobility of graphene measured at 4 K.",
                                            "Membranes of graphene oxide filter salt."]
    assert len(fetched) == 2


def test_elsevier_standard_view_without_entitlement_is_an_auth_error():
    with FakeServer(elsevier_route(SCOPUS, {KEYS[0]}, entitled=False)) as srv:
        client = ElsevierScopus(srv.url, keys=KEYS[:1], rate=None, view="COMPLETE", insttoken="")
        with pytest.raises(AuthError):
            client.search("graphene", 5)


def test_elsevier_empty_result_entry_is_not_a_paper_and_or_fallback():
    with FakeServer(elsevier_route(SCOPUS)) as srv:
        client = ElsevierScopus(srv.url, keys=KEYS[:1], rate=None, view="COMPLETE", insttoken="")
        assert client.search("zeolite catalysis", 5) == []
        # AND finds nothing, the OR variant does (the original's "tried variants")
        papers = client.search("perovskite zeolite", 5)
        queries = [r.query["query"] for r in srv.requests]
    assert [p.title for p in papers] == ["Perovskite solar cells"]
    assert queries[-2:] == ["TITLE-ABS-KEY(perovskite AND zeolite)", "TITLE-ABS-KEY(perovskite OR zeolite)"]


def test_elsevier_pagination_respects_the_complete_view_count():
    entries = [scopus_entry(i, f"Zeolite catalysis paper {i}", f"Abstract number {i}.") for i in range(80)]
    with FakeServer(elsevier_route(entries)) as srv:
        client = ElsevierScopus(srv.url, keys=KEYS[:1], rate=None, view="COMPLETE", insttoken="")
        papers = client.search("zeolite", 60)
        pages = [(int(r.query["start"]), int(r.query["count"])) for r in srv.requests]
    assert pages == [(0, 25), (25, 25), (50, 10)]
    assert [p.title for p in papers] == [f"Zeolite catalysis paper {i}" for i in range(60)]


def test_elsevier_quota_exceeded_rotates_then_is_fatal():
    quota = Reply(429, {"service-error": {"status": {"statusCode": "QUOTA_EXCEEDED"}}},
                  {"X-ELS-Status": "QUOTA_EXCEEDED - Quota Exceeded"})
    with FakeServer(elsevier_route(SCOPUS)) as srv:
        client = ElsevierScopus(srv.url, keys=KEYS[:2], rate=None, view="COMPLETE", insttoken="", **FAST)
        srv.queue.append(quota)
        assert client.search("graphene", 5)  # the second key takes over
        srv.queue += [quota]
        with pytest.raises(QuotaExceeded) as err:
            client.search("perovskite", 5)
    assert err.value.fatal and "elsevier" in str(err.value) and not any(k in str(err.value) for k in KEYS)


def test_keyword_queries():
    assert keyword_queries("How does the Fe2O3 band-gap change under strain?") == [
        "TITLE-ABS-KEY(Fe2O3 AND band-gap AND change AND strain)",
        "TITLE-ABS-KEY(Fe2O3 OR band-gap OR change OR strain)"]
    assert keyword_queries("the of and") == []


# ---------------------------------------------------------------------------------------------- PubChem
def test_pubchem_ground_properties_and_synonyms():
    with FakeServer(pubchem_route()) as srv:
        attrs = PubChem(srv.url + "/rest/pug", rate=None, max_synonyms=3).ground("Aspirin")
        methods = {(r.method, r.path) for r in srv.requests}
    assert attrs == {"source": "pubchem", "cid": 2244, "formula": "C9H8O4", "molecular_weight": 180.16,
                     "iupac_name": "2-acetyloxybenzoic acid",
                     "synonyms": ["ACETYLSALICYLIC ACID", "50-78-2", "2-Acetoxybenzoic acid"]}
    assert ("POST", "/rest/pug/compound/name/property/MolecularFormula,MolecularWeight,IUPACName/JSON") in methods


def test_pubchem_not_found_fault_is_none_and_cached(tmp_path):
    with FakeServer(pubchem_route()) as srv:
        client = PubChem(srv.url + "/rest/pug", rate=None, cache=ResponseCache(tmp_path))
        assert client.ground("unobtainium") is None
        assert client.ground("unobtainium") is None
        assert len(srv.requests) == 1


def test_pubchem_rate_limit_five_per_second():
    with FakeServer(pubchem_route()) as srv:
        client = PubChem(srv.url + "/rest/pug")  # default 5 req/s
        start = time.monotonic()
        for _ in range(6):
            client.properties("aspirin")
        elapsed = time.monotonic() - start
    assert elapsed >= 1.0 - 0.02  # 6 requests = 5 gaps of 0.2 s


# ---------------------------------------------------------------------------------------------- Materials Project
def test_mp_picks_the_most_stable_entry_and_sends_fields():
    with FakeServer(mp_route(keys={KEYS[0]})) as srv:
        attrs = MaterialsProject(srv.url, keys=KEYS[:1], rate=None).ground("Fe2O3")
        none = MaterialsProject(srv.url, keys=KEYS[:1], rate=None).ground("Xe9Q")
        req = srv.requests[0]
    assert attrs == {"source": "materials_project", "material_id": "mp-19770", "formula": "Fe2O3",
                     "crystal_system": "Trigonal", "band_gap": 2.0, "density": 5.2}
    assert none is None
    assert req.headers["x-api-key"] == KEYS[0]
    assert {"formula_pretty", "band_gap", "density", "symmetry"} <= set(req.query["_fields"].split(","))


def test_mp_blocked_429_is_retried():
    with FakeServer(mp_route()) as srv:
        srv.queue.append(Reply(429, {"error": "Your IP has been (temporarily) blocked due to rate limits",
                                     "version": "blocked"}))
        attrs = MaterialsProject(srv.url, keys=KEYS[:1], rate=None, **FAST).ground("TiO2")
    assert attrs["crystal_system"] == "Tetragonal" and len(srv.requests) == 2


def test_mp_requires_a_key(monkeypatch):
    monkeypatch.delenv("MP_API_KEY", raising=False)
    with pytest.raises(SourceError) as err:
        MaterialsProject("http://127.0.0.1:9", keys=[])
    assert "MP_API_KEY" in str(err.value) and err.value.fatal


def test_looks_like_formula():
    assert all(map(looks_like_formula, ["Fe2O3", "TiO2", "LiFePO4", "NaCl", "O2"]))
    assert not any(map(looks_like_formula, ["graphene", "DNA damage", "DNA", "XRD", "Al", "perovskite"]))
