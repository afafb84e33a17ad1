"""Concept extraction: the concepts (materials, formulas, acronyms, named entities) of each document's text.

Stage I's PathA scores concepts by how often they appear in the documents that confuse the retriever
(:mod:`repair.diagnosis.ccs`); this module only says which concepts a text holds. Two extractors share one interface
(``extractor(texts) -> list[list[str]]``, concepts in first-occurrence order, de-duplicated per text), so
the scoring never knows which one ran:

- :class:`RegexExtractor`: chemical formulas (``NaCl``, ``Fe2O3``, ``Ca(OH)2``, ``CH3NH3PbI3``; every symbol
  checked against the periodic table), acronyms (``XRD``, ``mRNA``, ``CNTs`` -> ``CNT``), hyphenated compounds
  (``lead-free``, ``SARS-CoV-2``), parenthesised names (``poly(3-hexylthiophene)``) and stand-alone
  two-letter element symbols that are not English words. It fixes the original's quirks (UPSTREAM 5.16):
  words are never chopped into 3-letter chunks (so ``NaCl`` is found and "In", "As", "He", "I" are not
  emitted from prose), the parenthesis pattern fires, and the per-document cap keeps the first concepts
  in text order instead of hash order.
- :class:`TokenClassificationExtractor`: any Hugging Face token-classification model with BIO labels
  (MatDetector: ``B/I-matname``, ``B/I-mf``), run on whole sentences in batches and mapped back to words.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from typing import Sequence

from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

ELEMENTS = frozenset(
    "H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se Br Kr Rb Sr Y "
    "Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy Ho Er Tm Yb Lu Hf Ta W Re "
    "Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf Es Fm Md No Lr Rf Db Sg Bh Hs Mt Ds Rg "
    "Cn Nh Fl Mc Lv Ts Og".split())
# Two-letter symbols that are ordinary words or common abbreviations in prose: never emitted alone.
AMBIGUOUS_SYMBOLS = frozenset("In As He Be At No Am Re Pm Md Mt Es Pa".split())
# Elements that form molecules of one element (O2, N2, Cl2, C60): a single symbol with a count >= 2 is a formula.
MOLECULAR_ELEMENTS = frozenset("H N O F Cl Br I P C".split())
STOPWORDS = frozenset(
    "the a an and or of in on for with to from by as at is are was were be been this that these those we our "
    "their they it its study method results data analysis using used based paper model et al vs fig figs table "
    "eq eqs ref refs ok "
    # section headings of structured abstracts, often in capitals
    "background objective objectives aim aims purpose introduction methods methodology design setting "
    "participants interventions measurements findings conclusion conclusions importance context".split())
GENERIC_HYPHENATED = frozenset(
    "so-called well-known state-of-the-art up-to-date follow-up long-term short-term real-time large-scale "
    "small-scale high-quality low-cost one-step two-step cost-effective time-consuming well-defined "
    "non-invasive in-depth".split())
GENERIC_HYPHEN_PREFIXES = frozenset("non self well so ill ever all".split())
NUMERIC_PREFIX_NOUNS = frozenset("fold year years day days week weeks month months hour hours minute minutes "
                                 "step steps times".split())
ROMAN = re.compile(r"^(?=[IVXLC]+$)C{0,3}(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})$")

_UNIT = r"[A-Z][a-z]?(?:\d+(?:\.\d+)?)?"
_GROUP = rf"\((?:{_UNIT})+\)(?:\d+(?:\.\d+)?)?"
FORMULA_RE = re.compile(rf"^(?:\d*(?:{_UNIT}|{_GROUP})+)(?:[·•∙*]\d*(?:{_UNIT}|{_GROUP})+)?$")
SYMBOL_RE = re.compile(r"[A-Z][a-z]?")
COUNT_RE = re.compile(r"^[A-Z][a-z]?(\d+)$")
GROUP_RE = re.compile(r"\(([A-Za-z0-9]+)\)")
PLURAL_ACRONYM_RE = re.compile(r"^[A-Z]{2,}s$")
ACRONYM_RE = re.compile(r"^[a-z]{0,2}[A-Z][A-Z0-9]*[A-Z][A-Z0-9]*(?:\.\d+)?$")
MIXED_CODE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
HYPHENATED_RE = re.compile(r"^[A-Za-z0-9]+(?:-[A-Za-z0-9]+)+$")
PAREN_NAME_RE = re.compile(
    r"(?<![\w(\[\-])([A-Za-z][A-Za-z0-9\-]+\([A-Za-z0-9,+\-]+(?: [A-Za-z0-9,+\-]+){0,3}\)[A-Za-z0-9\-]*)")
URL_RE = re.compile(r"(?:https?\s*:\s*//\S+|\bdoi\s*:\s*\S+|\b10\.\d{4,9}/\S+)", re.IGNORECASE)
# section headings of structured abstracts: capitals + colon at the start of the text or of a sentence
# ("RESULTS:"), or two or more words of 4+ capitals in a row ("MAIN OUTCOME MEASURES", "DATA SOURCES")
HEADING_RE = re.compile(r"(?:^|[.!?;]\s+)([A-Z]{2,}(?:[ \t]+[A-Z]{2,})*)[ \t]*:", re.MULTILINE)
CAPS_RUN_RE = re.compile(r"\b([A-Z]{4,}(?:[ \t]+[A-Z]{4,})+)\b")
LEAD_PUNCT = "\"'“‘<[{(«"
TRAIL_PUNCT = ".,;:!?\"'”’>]})»"


def clean_token(token: str) -> str:
    """Strip quotes and sentence punctuation from both ends; brackets only when unbalanced (keeps Fe(III))."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    token = token.strip(TRAIL_PUNCT.replace(")", "").replace("]", "").replace("}", "") + "\"'“‘")
    while len(token) >= 2 and token[0] in pairs and token[-1] == pairs[token[0]]:
        token = token[1:-1]  # "(PVDF)"
    while token:
        if token[-1] in TRAIL_PUNCT:
            if token[-1] in ")]}" and token.count(token[-1]) <= token.count({")": "(", "]": "[", "}": "{"}[token[-1]]):
                break
            token = token[:-1]
        elif token.endswith("'s") or token.endswith("’s"):
            token = token[:-2]
        else:
            break
    while token and token[0] in LEAD_PUNCT:
        if token[0] in "([{" and token.count(token[0]) <= token.count({"(": ")", "[": "]", "{": "}"}[token[0]]):
            break
        token = token[1:]
    return token.strip()


def is_formula(token: str) -> bool:
    """A chemical formula: element units (+ parenthesised groups, hydrate dot) whose symbols all exist.

    At least two element symbols, or one molecular element with a count >= 2 (O2, Cl2, C60). Tokens in
    capitals without digits (``CO``, ``HIV``) are left to the acronym rule, which emits them too.
    """
    if not FORMULA_RE.match(token) or not any(c.isdigit() or c.islower() for c in token):
        return False
    if PLURAL_ACRONYM_RE.match(token) or any(ROMAN.match(g) for g in GROUP_RE.findall(token)):
        return False  # CNTs (not C N Ts), Fe(III) (an oxidation state, not iodine)
    symbols = SYMBOL_RE.findall(token)
    if not symbols or any(s not in ELEMENTS for s in symbols):
        return False
    if len(symbols) >= 2:
        return True
    m = COUNT_RE.match(token)
    return bool(m) and symbols[0] in MOLECULAR_ELEMENTS and int(m.group(1)) >= 2


def _acronym(token: str) -> str | None:
    core = token[:-1] if token.endswith("s") and ACRONYM_RE.match(token[:-1] or "-") else token
    if not ACRONYM_RE.match(core) or sum(c.isupper() for c in core) < 2 or ROMAN.match(core):
        return None
    return core


def _hyphenated(token: str) -> str | None:
    if not HYPHENATED_RE.match(token):
        return None
    parts = token.split("-")
    if not any(sum(c.isalpha() for c in p) >= 2 for p in parts):
        return None
    if parts[0].isdigit() and (len(parts[1]) < 4 or not parts[1].isalpha()
                               or parts[1].lower() in NUMERIC_PREFIX_NOUNS):
        return None  # 10-nm, 5-fold
    if token.lower() in GENERIC_HYPHENATED or parts[0].lower() in GENERIC_HYPHEN_PREFIXES:
        return None
    first = parts[0]
    plain = all(p.isalpha() and (p.islower() or (p[0].isupper() and p[1:].islower())) for p in parts[1:])
    if len(first) >= 3 and first[0].isupper() and first[1:].islower() and plain:
        token = token.lower()  # "Lead-free" at a sentence start, "Species-Specific" in a title -> lower case
    return token


def _shouting(tokens: Sequence[str]) -> bool:
    """Text typed in capitals (titles): its capital words are not acronyms."""
    words = [t for t in tokens if len(t) >= 4 and t.isalpha()]
    caps = sum(t.isupper() for t in words)
    return len(words) >= 5 and caps >= 0.6 * len(words)


def extract_typed(text: str, max_entities: int | None = 200) -> list[tuple[str, str]]:
    """(concept, kind) pairs in first-occurrence order; kinds: formula, acronym, hyphenated, paren, element."""
    text = URL_RE.sub(" ", text)
    found: dict[str, str] = {}
    order: list[tuple[int, int, str]] = []

    def add(concept: str, kind: str, start: int) -> None:
        if len(concept) >= 2 and concept.lower() not in STOPWORDS and concept not in found:
            order.append((start, len(order), concept))
            found[concept] = kind

    for m in PAREN_NAME_RE.finditer(text):  # names with a parenthesised part, e.g. poly(methyl methacrylate)
        name = clean_token(m.group(1))
        if not is_formula(name):  # Ca(OH)2 is left to the formula rule
            add(name, "paren", m.start())
    spans = [(m.group(), m.start()) for m in re.finditer(r"[^\s/–—]+", text)]
    cleaned = [(clean_token(tok), start) for tok, start in spans]
    shouting = _shouting([c for c, _ in cleaned])
    headings = [m.span(1) for m in HEADING_RE.finditer(text)] + [m.span(1) for m in CAPS_RUN_RE.finditer(text)]
    for token, start in cleaned:
        if not token or not any(c.isalpha() for c in token):
            continue
        if "(" in token and PAREN_NAME_RE.fullmatch(token) and not is_formula(token):
            continue  # already taken whole by the parenthesised-name pass
        if is_formula(token):
            add(token, "formula", start)
        elif "-" in token:
            hyph = _hyphenated(token)
            if hyph:
                add(hyph, "hyphenated", start)
            for part in token.split("-"):  # TiO2-based, Fe2O3-TiO2: the formulas themselves too
                if any(c.isdigit() for c in part) and is_formula(part):
                    add(part, "formula", start + 1)
        elif not shouting and (acr := _acronym(token)) and not any(a <= start < b for a, b in headings):
            add(acr, "acronym", start)
        elif token in ELEMENTS and len(token) == 2 and token not in AMBIGUOUS_SYMBOLS:
            add(token, "element", start)
        elif (MIXED_CODE_RE.match(token) and any(c.isdigit() for c in token)
              and sum(c.isupper() for c in token) >= 2):
            add(token, "formula", start)  # formula-like codes: MAPbI3, Ti3C2Tx
    order.sort()
    out = [(concept, found[concept]) for _, _, concept in order]
    return out[:max_entities] if max_entities else out


def extract_concepts(text: str, max_entities: int | None = 200) -> list[str]:
    """Concept strings of one text (see :func:`extract_typed`)."""
    return [c for c, _ in extract_typed(text, max_entities)]


class RegexExtractor:
    """Rule-based concept extractor (no model); ``extractor(texts) -> list[list[str]]``."""

    name = "regex"

    def __init__(self, max_entities: int | None = 200):
        self.max_entities = max_entities

    def __call__(self, texts: Sequence[str], show_progress: bool | None = None) -> list[list[str]]:
        show = len(texts) > 2000 if show_progress is None else show_progress
        return [extract_concepts(t, self.max_entities)
                for t in tqdm(texts, desc="regex concepts", unit="doc", disable=not show, mininterval=2.0)]

    def describe(self) -> dict:
        return {"extractor": "regex", "max_entities_per_doc": self.max_entities,
                "kinds": ["formula", "acronym", "hyphenated", "paren", "element"]}


# ------------------------------------------------------------------------------------------ NER extractor
SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[\"'])")


def split_words(sentence: str) -> list[str]:
    """Whitespace words with their outer punctuation split off: "(LiFePO4)," -> "(", "LiFePO4", "),".

    Otherwise the brackets' sub-tokens would out-vote the word's own tag, and entities would carry them.
    """
    words = []
    for token in sentence.split():
        core = clean_token(token)
        at = token.find(core) if core else -1
        if at < 0:
            words.append(token)
            continue
        words.extend(w for w in (token[:at], core, token[at + len(core):]) if w)
    return words


def split_sentences(text: str) -> list[list[str]]:
    """Whitespace-normalised text (URLs/DOIs removed) -> sentences -> words (:func:`split_words`)."""
    text = " ".join(URL_RE.sub(" ", text).split())
    return [split_words(s) for s in SENTENCE_RE.split(text) if s.strip()]


def vote(labels: Sequence[int]) -> int:
    """Majority label of a word's sub-tokens; ties go to the label seen first (the original's rule)."""
    counts = Counter(labels)
    best = max(counts.values())
    return next(lab for lab in labels if counts[lab] == best)


def bio_spans(words: Sequence[str], tags: Sequence[str], aggregation: str = "span") -> list[tuple[str, str]]:
    """(entity type, text) from per-word BIO tags. ``span`` joins B I I into one entity (an I after another
    type starts a new one); ``word`` emits every tagged word alone (the original MatDetector behaviour)."""
    out: list[tuple[str, list[str]]] = []
    prev = None
    for word, tag in zip(words, tags):
        if tag == "O" or not tag:
            prev = None
            continue
        prefix, _, etype = tag.partition("-") if tag[:2] in ("B-", "I-") else ("I", "", tag)
        if aggregation == "word" or prefix == "B" or prev != etype:
            out.append((etype, [word]))
        else:
            out[-1][1].append(word)
        prev = etype
    return [(t, clean_token(" ".join(ws))) for t, ws in out]


class TokenClassificationExtractor:
    """Concepts from a token-classification model, sentence by sentence, batched, mapped back to words.

    Each sentence is split on whitespace into words and tokenised with ``is_split_into_words`` (a fast
    tokenizer gives the word of every sub-token); sentences longer than ``max_length`` are cut at word
    boundaries into pieces that fit. Pieces are sorted by length and batched. A word's tag is the majority of
    its sub-token argmax labels (UPSTREAM 2.3), then BIO tags become entities per sentence.
    """

    def __init__(self, model, tokenizer, *, batch_size: int = 32, max_length: int = 256, device=None,
                 types: Sequence[str] | None = None, aggregation: str = "span", name: str = "",
                 max_text_tokens: int = 4096):
        import torch

        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("the token-classification extractor needs a fast tokenizer (word_ids)")
        if aggregation not in ("span", "word"):
            raise ValueError(f"aggregation must be 'span' or 'word', got {aggregation!r}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.id2label = {int(k): v for k, v in model.config.id2label.items()}
        all_types = []
        for lab in self.id2label.values():
            t = lab[2:] if lab[:2] in ("B-", "I-") else lab
            if lab != "O" and t not in all_types:
                all_types.append(t)
        self.types = list(types) if types else all_types
        unknown = [t for t in self.types if t not in all_types]
        if unknown:
            raise ValueError(f"entity types {unknown} are not in the model's labels {sorted(set(all_types))}")
        self.aggregation = aggregation
        self.name = name or getattr(model.config, "_name_or_path", "") or "token-classification"
        self.budget = max_length - tokenizer.num_special_tokens_to_add(pair=False)
        if self.budget < 1:
            raise ValueError(f"max_length {max_length} leaves no room for tokens")
        # a text is read up to repair.text.char_budget(max_text_tokens) characters (4096 tokens: ~400k
        # characters, far beyond an abstract), so one huge line cannot hold the tokenizer for minutes and GBs
        self.max_text_tokens = int(max_text_tokens)

    @classmethod
    def load(cls, model: str, tokenizer: str | None = None, *, device: str | None = None,
             trust_remote_code: bool = False, **kw) -> "TokenClassificationExtractor":
        """Load a model id or local folder (MatDetector: ``yerim0210/MatDetector``) and its tokenizer."""
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        from repair.models import check_model_weights
        from repair.runtime import pick_device

        check_model_weights(model)  # a local folder's pickled weights holding code: one line naming the file
        dev = pick_device(device)
        try:
            tok = AutoTokenizer.from_pretrained(tokenizer or model, use_fast=True,
                                                trust_remote_code=trust_remote_code)
            net = AutoModelForTokenClassification.from_pretrained(model, trust_remote_code=trust_remote_code)
        except OSError as exc:
            raise OSError(f"cannot load token-classification model/tokenizer '{model}'"
                          f"{' / ' + tokenizer if tokenizer else ''}: {exc}. Without hub access, pass a local "
                          f"folder (--model, and --tokenizer if the model folder has no tokenizer)") from None
        return cls(net.to(dev), tok, device=dev, name=model, **kw)

    def describe(self) -> dict:
        return {"extractor": "token-classification", "model": self.name, "labels": self.id2label,
                "types": self.types, "aggregation": self.aggregation, "max_length": self.max_length,
                "batch_size": self.batch_size, "max_text_tokens": self.max_text_tokens}

    def _pieces(self, sentences: list[list[str]]) -> list[tuple[int, int, int]]:
        """(sentence, first word, end word) pieces whose sub-tokens fit the budget."""
        enc = self.tokenizer(sentences, is_split_into_words=True, add_special_tokens=False, truncation=False,
                             return_attention_mask=False, return_token_type_ids=False)
        pieces = []
        for s, words in enumerate(sentences):
            counts = [0] * len(words)
            for w in enc.word_ids(s):
                if w is not None:
                    counts[w] += 1
            start, used = 0, 0
            for w, c in enumerate(counts):
                if used and used + c > self.budget:
                    pieces.append((s, start, w))
                    start, used = w, 0
                used += c
            pieces.append((s, start, len(words)))
        return pieces

    def tag_sentences(self, sentences: list[list[str]], show_progress: bool = False) -> list[list[str]]:
        """BIO tag of every word of every sentence."""
        import torch

        tags = [["O"] * len(ws) for ws in sentences]
        pieces = [p for p in self._pieces(sentences) if p[2] > p[1]]
        order = sorted(range(len(pieces)), key=lambda j: -(pieces[j][2] - pieces[j][1]))
        bar = tqdm(total=len(pieces), desc="token classification", unit="sent", disable=not show_progress,
                   mininterval=2.0)
        for b in range(0, len(order), self.batch_size):
            batch = [pieces[j] for j in order[b:b + self.batch_size]]
            words = [sentences[s][a:e] for s, a, e in batch]
            enc = self.tokenizer(words, is_split_into_words=True, truncation=True, max_length=self.max_length,
                                 padding=True, return_tensors="pt")
            inputs = {k: v.to(self.device) for k, v in enc.items()
                      if k in ("input_ids", "attention_mask", "token_type_ids")}
            with torch.inference_mode():
                pred = self.model(**inputs).logits.argmax(dim=-1).cpu().tolist()
            for row, (s, a, _) in enumerate(batch):
                per_word: dict[int, list[int]] = defaultdict(list)
                for pos, w in enumerate(enc.word_ids(row)):
                    if w is not None:
                        per_word[w].append(pred[row][pos])
                for w, labs in per_word.items():
                    tags[s][a + w] = self.id2label[vote(labs)]
            bar.update(len(batch))
        bar.close()
        return tags

    def annotate(self, texts: Sequence[str], show_progress: bool | None = None,
                 block: int = 4096) -> list[dict[str, list[str]]]:
        """Per text: ``{type: [entities in first-occurrence order]}`` for the kept types (MatDetector:
        ``{"matname": [...], "mf": [...]}``)."""
        from repair.text import cap_chars

        show = len(texts) > 200 if show_progress is None else show_progress
        out: list[dict[str, list[str]]] = [{t: [] for t in self.types} for _ in texts]
        owners, sentences = [], []
        for t, text in enumerate(cap_chars(texts, self.max_text_tokens)):
            for sent in split_sentences(text):
                owners.append(t)
                sentences.append(sent)
        bar = tqdm(total=len(sentences), desc=f"{self.name} concepts", unit="sent", disable=not show,
                   mininterval=2.0)
        for s0 in range(0, len(sentences), block):
            chunk = sentences[s0:s0 + block]
            for j, tags in enumerate(self.tag_sentences(chunk)):
                found = out[owners[s0 + j]]
                for etype, concept in bio_spans(chunk[j], tags, self.aggregation):
                    if (etype in found and len(concept) >= 2 and concept.lower() not in STOPWORDS
                            and concept not in found[etype]):
                        found[etype].append(concept)
            bar.update(len(chunk))
        bar.close()
        return out

    def __call__(self, texts: Sequence[str], show_progress: bool | None = None) -> list[list[str]]:
        """All kept types of each text, in type order (matname then mf, like ``mat_concepts_all``)."""
        rows = []
        for ann in self.annotate(texts, show_progress):
            seen: dict[str, None] = {}
            for t in self.types:
                for c in ann[t]:
                    seen.setdefault(c, None)
            rows.append(list(seen))
        return rows
