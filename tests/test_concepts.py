"""Regex concept extractor, CCS (Eq. 5) and C_intra on a 5-document fixture, and the C_conf merge."""

from __future__ import annotations

import pytest

from repair.diagnosis.ccs import compute_ccs, merge_cconf, negatives_of, referenced_docs
from repair.diagnosis.concepts import RegexExtractor, extract_concepts, extract_typed

# ------------------------------------------------------------------------------------------ extractor
EXPECTED = [
    ("In this study, we synthesized NaCl and Fe2O3 nanoparticles on TiO2 supports.", ["NaCl", "Fe2O3", "TiO2"]),
    ("The CH3NH3PbI3 perovskite(ABX3) absorber was probed by XRD and TEM.",
     ["CH3NH3PbI3", "perovskite(ABX3)", "XRD", "TEM"]),
    ("Lead-free films of MAPbI3, CNTs and mRNA vaccines.", ["lead-free", "MAPbI3", "CNT", "mRNA"]),
    ("Ca(OH)2 and CuSO4·5H2O react with poly(methyl methacrylate) and Fe(III).",
     ["Ca(OH)2", "CuSO4·5H2O", "poly(methyl methacrylate)", "Fe(III)"]),
    ("TiO2-based catalysts for SARS-CoV-2 and COVID-19 sensing in O2 and CO2.",
     ["TiO2-based", "TiO2", "SARS-CoV-2", "COVID-19", "O2", "CO2"]),
    ("The film was doped with Fe and Co; Li1.5Al0.5Ge1.5(PO4)3 and Ti6Al4V were tested.",
     ["Fe", "Co", "Li1.5Al0.5Ge1.5(PO4)3", "Ti6Al4V"]),
    ("polyvinylidene fluoride (PVDF) membranes and PM2.5 filters with LEDs and IL-6 and X-ray imaging.",
     ["PVDF", "PM2.5", "LED", "IL-6", "X-ray"]),
    ("Density-functional theory predicts GaN and BaTiO3 behaviour.", ["density-functional", "GaN", "BaTiO3"]),
    ("XRD and TEM: sharp peaks. RESULTS: HIV loads fell.", ["XRD", "TEM", "HIV"]),
    ("Species-Specific Binding of SRGP-1 and HLH-30 to Fe-doped ZnO", ["species-specific", "SRGP-1", "HLH-30",
                                                                        "Fe-doped", "ZnO"]),
]
PROSE = [  # ordinary prose: nothing may come out (the original emitted In, As, He, Be, At, No, I, ...)
    "In the beginning, As we noted, He said that I am at home.",
    "No one knows. At least Be careful. It is what it is, and so on.",
    "We found that the results are robust; this method is based on the data analysis of the model.",
    "Here we show a so-called well-known state-of-the-art effect of 10-nm scale and 5-fold gains in Table S1.",
    "EFFECT OF TEMPERATURE ON THE GROWTH OF CARBON NANOTUBES IN REACTORS",  # a title in capitals
    "Type II and type IV isotherms; see https://doi.org/10.1000/xyz123 and doi: 10.1/abc.",
    "OBJECTIVE: to test it. METHODS: a non-randomized, self-reported survey. RESULTS: none. CONCLUSIONS: none.",
    "DATA SOURCES: registries. STUDY SELECTION: trials. MAIN OUTCOME MEASURES: mortality.",
    "Serology was done. MAIN OUTCOMES MEASURES Clinical data were collected. DATA SOURCES Registries.",
]


@pytest.mark.parametrize("text,expected", EXPECTED)
def test_regex_finds_expected_concepts(text, expected):
    assert extract_concepts(text) == expected


@pytest.mark.parametrize("text", PROSE)
def test_regex_emits_nothing_from_prose(text):
    assert extract_concepts(text) == []


def test_regex_kinds_and_elements_not_chopped():
    kinds = dict(extract_typed("NaCl, XRD, lead-free, perovskite(ABX3), doped with Zn."))
    assert kinds == {"NaCl": "formula", "XRD": "acronym", "lead-free": "hyphenated", "perovskite(ABX3)": "paren",
                     "Zn": "element"}
    # the original chopped NaCl into 'NaC' + 'l' and emitted element chunks of words
    assert extract_concepts("NaCl") == ["NaCl"]
    assert extract_concepts("Fe2O3") == ["Fe2O3"]


def test_regex_cap_keeps_first_concepts_in_text_order():
    text = " ".join(f"X{c}A" for c in "BCDEFGHJKLMN")  # 12 acronyms XBA, XCA, ...
    assert extract_concepts(text, max_entities=3) == ["XBA", "XCA", "XDA"]
    assert RegexExtractor(max_entities=2)([text, "NaCl"]) == [["XBA", "XCA"], ["NaCl"]]


# ------------------------------------------------------------------------------------------ CCS fixture
DOCS = [
    "NaCl crystals were characterised by XRD.",      # d0 {NaCl, XRD}
    "TiO2 films were characterised by XRD.",         # d1 {TiO2, XRD}
    "Fe2O3 particles on a TiO2 support.",            # d2 {Fe2O3, TiO2}
    "Lead-free films with TiO2 layers.",             # d3 {lead-free, TiO2}
    "NaCl solutions studied by DFT.",                # d4 {NaCl, DFT}
]
RECORDS = [  # confused queries; D-(q) with top_neg_n = 2 skips the positive
    {"i": 0, "query": "q0", "pos_doc_index": 0, "topk_doc_indices_cos": [1, 0, 2, 3]},   # D- = d1, d2
    {"i": 1, "query": "q1", "pos_doc_index": 1, "topk_doc_indices_cos": [2, 3, 1, 4]},   # D- = d2, d3
    {"i": 3, "query": "q3", "pos_doc_index": 3, "topk_doc_indices_cos": [3, 4, 0, 2]},   # D- = d4, d0
]


@pytest.fixture(scope="module")
def doc_concepts():
    concepts = dict(enumerate(RegexExtractor()(DOCS)))
    assert concepts == {0: ["NaCl", "XRD"], 1: ["TiO2", "XRD"], 2: ["Fe2O3", "TiO2"], 3: ["lead-free", "TiO2"],
                        4: ["NaCl", "DFT"]}
    return concepts


def test_negatives_and_referenced_docs():
    assert negatives_of(RECORDS[0], 2) == [(0, 1), (2, 2)]
    assert negatives_of({**RECORDS[0], "positive_doc_indices": [0, 1]}, 2) == [(2, 2), (3, 3)]
    assert referenced_docs(RECORDS, 2) == [0, 1, 2, 3, 4]


def test_ccs_incidence_hand_computed(doc_concepts):
    # df(D+) over positives d0, d1, d3: NaCl 1, XRD 2, TiO2 2, lead-free 1
    # df(D-) per (query, doc): TiO2 4 (d1,d2 | d2,d3), XRD 2 (d1 | d0), Fe2O3 2, NaCl 2 (d4, d0), lead-free 1, DFT 1
    res = compute_ccs(RECORDS, doc_concepts, top_neg_n=2, eps=0.5, df="incidence")
    got = {e["entity"]: (e["CCS"], e["freq_neg"], e["freq_pos"]) for e in res.entities}
    assert got == {"Fe2O3": (4.0, 2, 0), "DFT": (2.0, 1, 0), "TiO2": (1.6, 4, 2), "NaCl": (pytest.approx(4 / 3), 2, 1),
                   "XRD": (0.8, 2, 2), "lead-free": (pytest.approx(2 / 3), 1, 1)}
    assert [e["entity"] for e in res.entities] == ["Fe2O3", "DFT", "TiO2", "NaCl", "XRD", "lead-free"]
    assert res.per_query == {0: ["TiO2", "XRD", "Fe2O3"], 1: ["Fe2O3", "TiO2", "lead-free"], 3: ["NaCl", "DFT", "XRD"]}
    assert [(c["query_i"], c["concept"], c["CCS"]) for c in res.cintra] == [(0, "Fe2O3", 4.0), (1, "Fe2O3", 4.0),
                                                                          (3, "DFT", 2.0)]
    assert res.entities[0]["examples"] == [{"q_i": 0, "doc_idx": 2, "rank0": 2}, {"q_i": 1, "doc_idx": 2, "rank0": 0}]


def test_ccs_unique_documents_and_tie_break(doc_concepts):
    # D+ = {d0, d1, d3}; D- = {d0..d4}: TiO2 3, NaCl 2, XRD 2, Fe2O3 1, lead-free 1, DFT 1 distinct documents
    res = compute_ccs(RECORDS, doc_concepts, top_neg_n=2, eps=0.5, df="unique")
    got = {e["entity"]: (e["CCS"], e["freq_neg"], e["freq_pos"]) for e in res.entities}
    assert got["TiO2"] == (1.2, 3, 2) and got["Fe2O3"] == (2.0, 1, 0) and got["DFT"] == (2.0, 1, 0)
    # CCS: DFT 2, Fe2O3 2, NaCl 2/1.5, TiO2 3/2.5, XRD 2/2.5, lead-free 1/1.5
    # Fe2O3 and DFT tie on CCS and df(D-): the string decides ("DFT" < "Fe2O3")
    assert [e["entity"] for e in res.entities] == ["DFT", "Fe2O3", "NaCl", "TiO2", "XRD", "lead-free"]
    assert [c["concept"] for c in res.cintra] == ["Fe2O3", "Fe2O3", "DFT"]


def test_cintra_tie_within_one_query():
    concepts = {0: [], 1: ["beta", "alpha"], 2: []}
    recs = [{"i": 0, "query": "q", "pos_doc_index": 0, "topk_doc_indices_cos": [1, 2]}]
    res = compute_ccs(recs, concepts, top_neg_n=5, eps=1.0)
    assert res.cintra[0]["concept"] == "alpha" and res.cintra[0]["CCS"] == 1.0
    assert res.short_negatives == 1  # only 2 negatives available, 5 asked


def test_eps_changes_scores(doc_concepts):
    res = compute_ccs(RECORDS, doc_concepts, top_neg_n=2, eps=1e-6)
    assert res.ccs["Fe2O3"] == pytest.approx(2 / 1e-6)
    with pytest.raises(ValueError):
        compute_ccs(RECORDS, doc_concepts, eps=0)


# ------------------------------------------------------------------------------------------ merge
def test_merge_provenance_and_counts():
    cintra = [{"query_i": 0, "concept": "TiO2", "CCS": 2.0}, {"query_i": 1, "concept": "tio2", "CCS": 1.0},
              {"query_i": 2, "concept": "XRD", "CCS": 1.5}, {"query_i": 3, "concept": "", "CCS": 0.0}]
    comps = [{"component_id": 0, "size": 3, "avg_margin": -0.5, "concept": "TIO2", "concept_count": 2},
             {"component_id": 1, "size": 2, "avg_margin": -0.1, "concept": "graphene", "concept_count": 1},
             {"component_id": 2, "size": 2, "avg_margin": 0.0, "concept": "", "concept_count": 0}]
    out = merge_cconf(cintra, comps)
    assert out["counts"] == {"A_raw": 3, "B_raw": 2, "A_unique": 2, "B_unique": 2, "overlap": 1, "union_total": 3}
    assert [(t["term"], t["from"]) for t in out["terms"]] == [("graphene", ["B"]), ("TiO2", ["A", "B"]),
                                                              ("XRD", ["A"])]
    tio2 = out["terms"][1]
    assert tio2["A"] == {"CCS": 2.0, "query_i": 0, "term": "TiO2", "queries": 2}
    assert tio2["B"] == {"component_id": 0, "component_size": 3, "component_avg_margin": -0.5, "concept_count": 2,
                         "term": "TIO2", "components": 1}
    limited = merge_cconf(cintra, comps, top_a=1, top_comp=1)
    assert [(t["term"], t["from"]) for t in limited["terms"]] == [("TiO2", ["A", "B"])]
