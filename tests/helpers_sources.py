"""Real HTTP servers on 127.0.0.1 for the source tests, answering in each API's documented JSON shape
(API_FACTS D.1-D.4): Semantic Scholar, Elsevier Scopus (+ Abstract Retrieval), PubChem PUG REST, the
Materials Project, and an OpenAI-compatible chat endpoint.

A :class:`FakeServer` records every request (method, path, query, headers, body) and first serves any
replies queued in ``server.queue`` (to inject 429 / 503 / 403 / slow answers), then the API's route.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: bytes

    @property
    def form(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.body.decode()).items()}

    @property
    def json(self) -> Any:
        return json.loads(self.body.decode() or "null")


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict/list -> JSON, str -> text/html
    headers: dict = field(default_factory=dict)
    delay: float = 0.0


class FakeServer:
    def __init__(self, route: Callable[[Request], Reply]):
        self.route = route
        self.requests: list[Request] = []
        self.queue: list[Reply] = []
        self.slow_all: float = 0.0  # delay every answer (timeout tests)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _handle(self):
                parsed = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                req = Request(self.command, parsed.path, {k: v[0] for k, v in parse_qs(parsed.query).items()},
                              {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length))
                with server._lock:
                    server.requests.append(req)
                    reply = server.queue.pop(0) if server.queue else None
                if reply is None:
                    reply = server.route(req)
                delay = max(reply.delay, server.slow_all)
                if delay:
                    time.sleep(delay)
                if isinstance(reply.body, (dict, list)):
                    data, ctype = json.dumps(reply.body).encode(), "application/json"
                else:
                    data, ctype = str(reply.body or "").encode(), "text/html"
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            do_GET = do_POST = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def paths(self, prefix: str = "") -> list[Request]:
        return [r for r in self.requests if r.path.startswith(prefix)]


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) >= 3}


# ---------------------------------------------------------------------------------------------- Semantic Scholar
def s2_paper(i: int, title: str, abstract: str | None, doi: str | None = None) -> dict:
    return {"paperId": f"s2-{i:04d}", "title": title, "abstract": abstract, "year": 2000 + i % 20,
            "venue": "Journal of Tests", "url": f"https://example.org/paper/{i}",
            "externalIds": {"DOI": doi} if doi else {}}


def s2_route(papers: list[dict], keys: set[str] | None = None) -> Callable[[Request], Reply]:
    """``GET /graph/v1/paper/search``: hits = papers sharing a word with the query, in list order."""

    def route(req: Request) -> Reply:
        if keys is not None and req.headers.get("x-api-key") not in keys:
            return Reply(403, {"message": "Forbidden"})
        if req.path != "/graph/v1/paper/search":
            return Reply(404, {"error": "Not found"})
        offset, limit = int(req.query.get("offset", 0)), int(req.query.get("limit", 100))
        if limit > 100 or offset + limit > 1000:
            return Reply(400, {"error": "Requested data for this limit and/or offset is not available"})
        q = words(req.query.get("query", ""))
        hits = [p for p in papers if q & words(p["title"] + " " + (p["abstract"] or ""))]
        if not hits:
            return Reply(200, {"total": 0, "offset": 0})
        fields = set(req.query.get("fields", "paperId,title").split(","))
        page = [{k: v for k, v in p.items() if k in fields} for p in hits[offset:offset + limit]]
        body = {"total": len(hits), "offset": offset, "data": page}
        if offset + limit < len(hits):
            body["next"] = offset + limit
        return Reply(200, body)

    return route


# ---------------------------------------------------------------------------------------------- Elsevier
def scopus_entry(i: int, title: str, abstract: str, doi: str | None = None) -> dict:
    return {"@_fa": "true", "eid": f"2-s2.0-{8500000000 + i}", "dc:identifier": f"SCOPUS_ID:{8500000000 + i}",
            "dc:title": title, "dc:creator": "Doe J.", "prism:publicationName": "Acta Testica",
            "prism:coverDate": f"{2010 + i % 10}-05-01", "prism:doi": doi or f"10.1000/scopus.{i}",
            "citedby-count": "3", "subtype": "ar", "dc:description": abstract,
            "link": [{"@ref": "self", "@href": f"https://api.example/abstract/{i}"},
                     {"@ref": "scopus", "@href": f"https://www.scopus.example/record/{i}"}]}


def elsevier_route(entries: list[dict], keys: set[str] | None = None, entitled: bool = True
                   ) -> Callable[[Request], Reply]:
    """Scopus Search (TITLE-ABS-KEY(a AND b) / (a OR b)) and Abstract Retrieval by scopus_id."""
    by_id = {e["dc:identifier"].split(":")[1]: e for e in entries}

    def route(req: Request) -> Reply:
        if keys is not None and req.headers.get("x-els-apikey") not in keys:
            return Reply(401, {"service-error": {"status": {"statusCode": "AUTHENTICATION_ERROR",
                                                            "statusText": "Invalid API Key"}}})
        if req.path.startswith("/content/abstract/scopus_id/"):
            e = by_id.get(req.path.rsplit("/", 1)[1])
            if e is None:
                return Reply(404, {"service-error": {"status": {"statusCode": "RESOURCE_NOT_FOUND",
                                                                "statusText": "not found"}}})
            return Reply(200, {"abstracts-retrieval-response": {"coredata": {
                "dc:title": e["dc:title"], "dc:description": e["dc:description"], "prism:doi": e["prism:doi"]}}})
        if req.path != "/content/search/scopus":
            return Reply(404, {"service-error": {"status": {"statusCode": "RESOURCE_NOT_FOUND"}}})
        view = req.query.get("view", "STANDARD")
        if view == "COMPLETE" and not entitled:
            return Reply(401, {"service-error": {"status": {
                "statusCode": "AUTHORIZATION_ERROR",
                "statusText": "The requestor is not authorized to access the requested view or fields"}}})
        count, start = int(req.query.get("count", 25)), int(req.query.get("start", 0))
        if count > (25 if view == "COMPLETE" else 200):
            return Reply(400, {"service-error": {"status": {"statusCode": "INVALID_INPUT",
                                                            "statusText": "Exceeds the maximum number allowed"}}})
        m = re.match(r"TITLE-ABS-KEY\((.*)\)$", req.query.get("query", ""))
        terms = re.split(r"\s+(AND|OR)\s+", m.group(1)) if m else [req.query.get("query", "")]
        op = "OR" if "OR" in terms[1::2] else "AND"
        q = [t.lower() for t in terms[0::2]]

        def match(e: dict) -> bool:
            text = (e["dc:title"] + " " + e["dc:description"]).lower()
            found = [t in text for t in q]
            return any(found) if op == "OR" else all(found)

        hits = [e for e in entries if match(e)]
        if not hits:
            return Reply(200, {"search-results": {
                "opensearch:totalResults": "0", "opensearch:startIndex": "0", "opensearch:itemsPerPage": "0",
                "entry": [{"@_fa": "true", "error": "Result set was empty"}]}})
        page = hits[start:start + count]
        if view != "COMPLETE":
            page = [{k: v for k, v in e.items() if k != "dc:description"} for e in page]
        return Reply(200, {"search-results": {
            "opensearch:totalResults": str(len(hits)), "opensearch:startIndex": str(start),
            "opensearch:itemsPerPage": str(len(page)), "entry": page}})

    return route


# ---------------------------------------------------------------------------------------------- PubChem
PUBCHEM = {
    "aspirin": {"CID": 2244, "MolecularFormula": "C9H8O4", "MolecularWeight": "180.16",
                "IUPACName": "2-acetyloxybenzoic acid",
                "synonyms": ["aspirin", "ACETYLSALICYLIC ACID", "50-78-2", "2-Acetoxybenzoic acid", "Acylpyrin",
                             "Ecotrin", "Easprin"]},
    "titanium dioxide": {"CID": 26042, "MolecularFormula": "O2Ti", "MolecularWeight": "79.866",
                         "IUPACName": "dioxotitanium", "synonyms": ["titanium dioxide", "TiO2", "Rutile"]},
}


def pubchem_route(compounds: dict = PUBCHEM) -> Callable[[Request], Reply]:
    """POST ``/rest/pug/compound/name/property/<props>/JSON`` and ``.../name/synonyms/JSON`` (form ``name``)."""

    def route(req: Request) -> Reply:
        name = (req.form.get("name") if req.method == "POST" else None) or ""
        c = compounds.get(name.lower())
        if c is None:
            return Reply(404, {"Fault": {"Code": "PUGREST.NotFound", "Message": "No CID found",
                                         "Details": [f"No CID found that matches the given name"]}})
        m = re.match(r"^/rest/pug/compound/name/property/([A-Za-z,]+)/JSON$", req.path)
        if m:
            props = {"CID": c["CID"], **{p: c[p] for p in m.group(1).split(",") if p in c}}
            return Reply(200, {"PropertyTable": {"Properties": [props]}},
                         {"X-Throttling-Control": "Request Count status: Green (0%), Request Time status: Green "
                                                  "(0%), Service status: Green (20%)"})
        if req.path == "/rest/pug/compound/name/synonyms/JSON":
            return Reply(200, {"InformationList": {"Information": [{"CID": c["CID"], "Synonym": c["synonyms"]}]}})
        return Reply(400, {"Fault": {"Code": "PUGREST.BadRequest", "Message": "Bad request"}})

    return route


# ---------------------------------------------------------------------------------------------- Materials Project
MATERIALS = [
    {"material_id": "mp-24972", "formula_pretty": "Fe2O3", "band_gap": 1.9, "density": 5.1,
     "energy_above_hull": 0.12, "is_stable": False, "symmetry": {"crystal_system": "Cubic", "symbol": "Ia-3"}},
    {"material_id": "mp-19770", "formula_pretty": "Fe2O3", "band_gap": 2.0, "density": 5.2,
     "energy_above_hull": 0.0, "is_stable": True,
     "symmetry": {"crystal_system": "Trigonal", "symbol": "R-3c", "number": 167, "point_group": "-3m"}},
    {"material_id": "mp-2657", "formula_pretty": "TiO2", "band_gap": 1.78, "density": 4.1,
     "energy_above_hull": 0.0, "is_stable": True, "symmetry": {"crystal_system": "Tetragonal", "symbol": "P4_2/mnm"}},
]


def mp_route(materials: list[dict] = MATERIALS, keys: set[str] | None = None) -> Callable[[Request], Reply]:
    """``GET /materials/summary/?formula=..&_fields=..&_limit=..``: ``{"data": [...], "meta": {...}}``."""

    def route(req: Request) -> Reply:
        if keys is not None and req.headers.get("x-api-key") not in keys:
            return Reply(401, {"detail": "Invalid API key"})
        if req.path != "/materials/summary/":
            return Reply(404, {"detail": "Not Found"})
        fields = req.query.get("_fields", "").split(",")
        hits = [m for m in materials if m["formula_pretty"] == req.query.get("formula")]
        data = [{k: v for k, v in m.items() if k in fields} for m in hits[: int(req.query.get("_limit", 100))]]
        return Reply(200, {"data": data, "meta": {"total_doc": len(hits), "max_limit": 1000}})

    return route


# ---------------------------------------------------------------------------------------------- OpenAI-compatible
def openai_route(reply_for: Callable[[list[dict], int], str], model: str = "fake-model",
                 key: str | None = None) -> Callable[[Request], Reply]:
    """``POST /v1/chat/completions`` answering ``reply_for(messages, seed)``; ``GET /v1/models``."""

    def route(req: Request) -> Reply:
        if key is not None and req.headers.get("authorization") != f"Bearer {key}":
            return Reply(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
        if req.path == "/v1/models":
            return Reply(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
        if req.path != "/v1/chat/completions":
            return Reply(404, {"error": {"message": "not found"}})
        body = req.json
        n = int(body.get("n", 1))
        choices = [{"index": i, "message": {"role": "assistant", "content": reply_for(body["messages"],
                                                                                      body.get("seed", 0) + i)},
                    "finish_reason": "stop"} for i in range(n)]
        return Reply(200, {"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                           "choices": choices, "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    return route
