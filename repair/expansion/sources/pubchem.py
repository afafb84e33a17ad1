"""PubChem PUG REST grounding of a concept name (API_FACTS D.3; DESIGN 5 step 5).

Names are POSTed (``name=<concept>``) as pubchempy does, so names with ``/`` or ``#`` need no URL escaping.
A name PubChem does not know answers 404 ``{"Fault": {"Code": "PUGREST.NotFound"}}``: that is "not a
compound" (``None``), and it is cached like any answer. ``503 PUGREST.ServerBusy`` (JSON or HTML) is retried
by the HTTP core. Policy: at most 5 requests per second.
"""

from __future__ import annotations

import os

from repair.expansion.sources.cache import ResponseCache
from repair.expansion.sources.http import ApiClient, KeyPool

DEFAULT_URL = "https://pubchem.ncbi.nlm.nih.gov/rest/pug"
URL_ENV = "PUBCHEM_API_URL"
PROPERTIES = "MolecularFormula,MolecularWeight,IUPACName"


class PubChem:
    """``ground(name)`` -> {cid, formula, molecular_weight, iupac_name, synonyms} or ``None``."""

    name = "pubchem"

    def __init__(self, api_url: str | None = None, *, rate: float = 5.0, max_synonyms: int = 5,
                 cache: ResponseCache | None = None, timeout: float = 30.0, **client_kw):
        self.max_synonyms = max_synonyms
        self.client = ApiClient(self.name, api_url or os.environ.get(URL_ENV) or DEFAULT_URL,
                                keys=KeyPool([], rate, self.name), cache=cache, timeout=timeout, **client_kw)

    def properties(self, name: str) -> dict | None:
        """First compound's formula, molecular weight (float) and IUPAC name; None if PubChem has no such name."""
        resp = self.client.post_form(f"compound/name/property/{PROPERTIES}/JSON", {"name": name})
        if resp.status == 404 or not isinstance(resp.data, dict):
            return None
        rows = (resp.data.get("PropertyTable") or {}).get("Properties") or []
        if not rows:
            return None
        row = rows[0]
        weight = row.get("MolecularWeight")
        try:
            weight = float(weight) if weight is not None else None  # arrives as a string
        except ValueError:
            weight = None
        return {"cid": row.get("CID"), "formula": row.get("MolecularFormula"), "molecular_weight": weight,
                "iupac_name": row.get("IUPACName")}

    def synonyms(self, name: str) -> list[str]:
        resp = self.client.post_form("compound/name/synonyms/JSON", {"name": name})
        if resp.status == 404 or not isinstance(resp.data, dict):
            return []
        info = (resp.data.get("InformationList") or {}).get("Information") or []
        return list(info[0].get("Synonym") or []) if info else []

    def ground(self, name: str) -> dict | None:
        """Attributes of ``name`` (the paper's "synonyms, formula, molecular weight, IUPAC name"), or None."""
        props = self.properties(name)
        if props is None:
            return None
        synonyms = [s for s in self.synonyms(name) if s.lower() != name.lower()][: self.max_synonyms]
        return {"source": self.name, **props, "synonyms": synonyms}
