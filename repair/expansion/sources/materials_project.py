"""Materials Project summary search (API_FACTS D.4; DESIGN 5 step 5): formula, crystal system, band gap,
density of the most stable entry for a formula. Key header ``x-api-key``; ``{"data": [...], "meta": {...}}``.
"""

from __future__ import annotations

import logging
import os
import re

from repair.expansion.sources.cache import ResponseCache
from repair.expansion.sources.http import ApiClient, KeyPool, SourceError, load_keys

logger = logging.getLogger(__name__)

DEFAULT_URL = "https://api.materialsproject.org"
URL_ENV, KEY_ENV = "MP_API_URL", "MP_API_KEY"
FIELDS = "material_id,formula_pretty,band_gap,density,symmetry,energy_above_hull,is_stable"
# Two or more element-like units (Fe2O3, TiO2, LiFePO4) or one element with a count (O2): worth asking MP.
_FORMULA = re.compile(r"^(?:[A-Z][a-z]?\d*(?:\.\d+)?){2,}$|^[A-Z][a-z]?\d+$")


ELEMENTS = set("""H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se Br
Kr Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy Ho Er Tm Yb Lu Hf Ta
W Re Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf Es Fm Md No Lr Rf Db Sg Bh Hs Mt Ds Rg
Cn Nh Fl Mc Lv Ts Og""".split())


def looks_like_formula(text: str) -> bool:
    """A chemical formula made of real element symbols (Fe2O3, LiFePO4, O2), worth a Materials Project query;
    acronyms such as "DNA" or "XRD" are not (D, X, R are no elements)."""
    text = text.strip()
    if not _FORMULA.match(text):
        return False
    return all(sym in ELEMENTS for sym in re.findall(r"[A-Z][a-z]?", text))


class MaterialsProject:
    """``ground(formula)`` -> {material_id, formula, crystal_system, band_gap, density} or ``None``."""

    name = "materials_project"

    def __init__(self, api_url: str | None = None, keys: list[str] | None = None, *, key_file: str | None = None,
                 rate: float = 5.0, limit: int = 20, cache: ResponseCache | None = None, timeout: float = 30.0,
                 **client_kw):
        if keys is None:
            keys = load_keys(key_file, KEY_ENV)
        if not keys:
            raise SourceError(self.name, None, f"an API key is required: set ${KEY_ENV} or pass a key file",
                              fatal=True)
        for i, key in enumerate(keys):
            if len(key) != 32:
                logger.warning("materials_project: key #%d is not 32 characters long (MP keys are)", i + 1)
        self.limit = limit
        source = f"key file {key_file}" if key_file else f"${KEY_ENV}"
        self.client = ApiClient(self.name, api_url or os.environ.get(URL_ENV) or DEFAULT_URL,
                                keys=KeyPool(keys, rate, self.name, source), auth_header="x-api-key",
                                cache=cache, timeout=timeout, key_env=KEY_ENV, **client_kw)

    def summaries(self, formula: str) -> list[dict]:
        resp = self.client.get_json("materials/summary/", {"formula": formula, "_fields": FIELDS,
                                                          "_limit": self.limit, "_skip": 0})
        if resp.status == 404 or not isinstance(resp.data, dict):
            return []
        return [d for d in resp.data.get("data") or [] if isinstance(d, dict)]

    def ground(self, formula: str) -> dict | None:
        """The most stable entry (lowest energy above hull, then material id) for ``formula``, or None."""
        docs = self.summaries(formula)
        if not docs:
            return None

        def stability(doc: dict) -> tuple:
            e = doc.get("energy_above_hull")
            return (e if isinstance(e, (int, float)) else float("inf"), str(doc.get("material_id")))

        best = min(docs, key=stability)
        symmetry = best.get("symmetry") or {}
        return {"source": self.name, "material_id": best.get("material_id"), "formula": best.get("formula_pretty"),
                "crystal_system": symmetry.get("crystal_system"), "band_gap": best.get("band_gap"),
                "density": best.get("density")}
