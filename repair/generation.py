"""Text generation backends and the query-generation prompt of Stage II (DESIGN 5 step 5).

Two backends with one API, ``generate(prompts, *, n, seed, max_new_tokens, temperature, top_p,
repetition_penalty) -> list[str]`` (``n`` completions per prompt, grouped by prompt):

- :class:`HFGenerator`: a local causal LM through ``transformers`` (default: the retriever's own backbone,
  as in the paper where M_theta writes the queries), batched with left padding, chat template when the
  tokenizer has one, seeded sampling. A retriever LoRA adapter (trained on ``AutoModel``) is merged into the
  causal LM's inner decoder, so its key prefixes match (the original loaded it onto the causal-LM wrapper,
  where they may not: UPSTREAM 5.22).
- :class:`OpenAIGenerator`: any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, llama.cpp server,
  Ollama), through the same HTTP core as the literature sources (retries, timeouts, key never logged).

A prompt is a string (sent as one user message when a chat template is used) or a list of chat messages.
The CausalNeg negatives step and the T0-style rewrite (QUERY_FORM=t0, :func:`build_t0_style_prompt`) reuse
these backends.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence, Union

from .sources.http import ApiClient, KeyPool, load_keys
from .text import content_words

logger = logging.getLogger(__name__)

Prompt = Union[str, list[dict]]

# Sampling defaults of the original 05 (UPSTREAM 2.6).
DEFAULT_SAMPLING = {"max_new_tokens": 40, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.2}

# ---------------------------------------------------------------------------------------------- prompts
# The paper's prompt (App. A.2.1, as described in UPSTREAM 2.6 "Paper version"): one query that is
# inherently ambiguous or hard to resolve for standard retrievers, reading like a real paper title or
# research question, in indirect / context-dependent / metaphorical language, over 1-3 grounded concepts
# listed as "Concept k: {name} (Attributes: {attrs})", then an open "Query:". Our own wording.
PAPER_PROMPT_ID = "repair-paper-a2.1-v1"
PAPER_PROMPT_HEAD = (
    "You are an expert scientific researcher. Write one research query that is inherently ambiguous or hard "
    "to resolve for standard retrievers. It must read like a real paper title or research question, and use "
    "indirect, context-dependent or metaphorical language instead of naming the concepts plainly. "
    "Base it on the concepts below and their attributes. Write only the query, on one line."
)

# The original 05's three-shot completion prompt (UPSTREAM 2.6), our own wording, one term.
ORIGINAL_PROMPT_ID = "upstream-3shot-v1"
ORIGINAL_PROMPT_HEAD = (
    "You are an expert in materials science. For the given term, write exactly one specific research query.\n\n"
    "Term: Graphene\n"
    "Query: How does high pressure change the electron mobility and structural integrity of monolayer "
    "graphene?\n\n"
    "Term: Ti6Al4V\n"
    "Query: What controls the fatigue life of selective-laser-melted Ti6Al4V in biomedical implants?\n\n"
)
PROMPT_IDS = {"paper": PAPER_PROMPT_ID, "original": ORIGINAL_PROMPT_ID}


def describe_attributes(attributes: dict | None) -> str:
    """Grounded attributes as the short phrase the prompt shows ("formula C9H8O4; molecular weight ...")."""
    if not attributes:
        return "none known"
    parts: list[str] = []
    pc = attributes.get("pubchem") or {}
    mp = attributes.get("materials_project") or {}
    if pc.get("formula"):
        parts.append(f"formula {pc['formula']}")
    elif mp.get("formula"):
        parts.append(f"formula {mp['formula']}")
    if pc.get("molecular_weight") is not None:
        parts.append(f"molecular weight {pc['molecular_weight']:g} g/mol")
    if pc.get("iupac_name"):
        parts.append(f"IUPAC name {pc['iupac_name']}")
    if pc.get("synonyms"):
        parts.append("synonyms " + ", ".join(pc["synonyms"]))
    if mp.get("crystal_system"):
        parts.append(f"crystal system {mp['crystal_system']}")
    if mp.get("band_gap") is not None:
        parts.append(f"band gap {mp['band_gap']:g} eV")
    if mp.get("density") is not None:
        parts.append(f"density {mp['density']:.3g} g/cm^3")
    return "; ".join(parts) or "none known"


def build_prompt(concepts: list[str], attributes: dict[str, dict] | None = None, template: str = "paper") -> str:
    """The query-generation prompt for 1-3 concepts (``template`` "paper") or one term ("original")."""
    attributes = attributes or {}
    if template == "paper":
        lines = [PAPER_PROMPT_HEAD, ""]
        for k, concept in enumerate(concepts, start=1):
            lines.append(f"Concept {k}: {concept} (Attributes: {describe_attributes(attributes.get(concept))})")
        lines += ["", "Query:"]
        return "\n".join(lines)
    if template == "original":
        return f"{ORIGINAL_PROMPT_HEAD}Term: {concepts[0]}\nQuery:"
    raise ValueError(f"unknown prompt template {template!r}; expected one of {sorted(PROMPT_IDS)}")


# The T0-style rewrite (issue 16, QUERY_FORM=t0): the verified abstract gets a query in the form of the seed set's
# own queries (a claim for SciFact, a question for QA sets, a title for the paper's title -> abstract T0), shown
# through k (query, passage) examples of T0. Our own wording.
T0_STYLE_PROMPT_ID = "repair-t0-style-v1"
T0_STYLES = {
    "claim": "a claim (one declarative sentence) that the passage supports",
    "question": "a question that the passage answers",
    "title": "a title the passage could have, like a paper title",
    "keywords": "a short keyword query the passage is relevant to",
}


def query_style(query: str) -> str:
    """The form of one query: ``question`` (ends with ?), ``keywords`` (<= 4 words, no final punctuation),
    ``claim`` (ends with . or !), else ``title``."""
    text = query.strip()
    if text.endswith("?"):
        return "question"
    if text.endswith((".", "!")):
        return "claim"
    return "keywords" if len(re.findall(r"\w+", text)) <= 4 else "title"


def t0_query_style(queries: Sequence[str]) -> str:
    """The most common :func:`query_style` of a seed set's queries (ties: the order of :data:`T0_STYLES`), what
    the rewrite prompt asks for when ``--style auto``."""
    if not queries:
        raise ValueError("no query to infer the seed set's query style from")
    counts = Counter(query_style(q) for q in queries)
    return max(T0_STYLES, key=lambda style: (counts[style], -list(T0_STYLES).index(style)))


def build_t0_style_prompt(examples: Sequence[tuple[str, str]], passage: str, style: str,
                          max_passage_chars: int = 1000) -> str:
    """The T0-style rewrite prompt: ``examples`` (query, passage) pairs of T0, then ``passage`` (the verified
    abstract) and an open ``Query:``; passages are clipped to ``max_passage_chars`` (small-context generators)."""
    from .negatives import _clip

    if style not in T0_STYLES:
        raise ValueError(f"unknown query style {style!r}; expected one of {sorted(T0_STYLES)}")
    lines = ["Below are queries from a retrieval training set, each after the passage it retrieves. Write one new "
             f"query for the last passage in the same style: {T0_STYLES[style]}. Match the examples' form and "
             "length, and do not copy a sentence of the passage. Write only the query, on one line.", ""]
    for query, example in examples:
        lines += [f"Passage: {_clip(example, max_passage_chars)}", f"Query: {' '.join(query.split())}", ""]
    lines += [f"Passage: {_clip(passage, max_passage_chars)}", "Query:"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- cleaning
_PREAMBLE = re.compile(r"^(sure|here|certainly|okay|ok|of course|absolutely|great)\b", re.I)
_LABEL = re.compile(r"^(?:(?:research|generated|new|final)\s+)?(?:query|question|title)\s*\d*\s*[:\-–]\s*", re.I)


def _norm(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def clean_query(raw: str, prompt: str = "", min_words: int = 4,
                max_words: int | None = None) -> tuple[str | None, str]:
    """Turn a raw completion into one query, or reject it: returns (query, "ok") or (None, reason).

    Reasons: ``empty``, ``echo`` (the model repeated the prompt), ``too_short`` (< ``min_words`` words),
    ``too_long`` (> ``max_words`` words, when given), ``vague`` (< 3 distinct content words), ``not_text``,
    ``repetitive`` (degenerate loops). Like the original, the text after the last ``Query:`` is taken when present.
    """
    text = (raw or "").replace("\r", "\n").strip()
    match = list(re.finditer(r"query\s*:", text, re.I))
    if match:
        text = text[match[-1].end():]
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    # Drop chat preambles ("Here is a research query:") when something follows them.
    while len(lines) > 1 and (lines[0].endswith(":") or _PREAMBLE.match(lines[0])):
        lines.pop(0)
    if not lines:
        return None, "empty"
    line = lines[0]
    line = re.sub(r"^(?:[#>*\-]+|\d{1,2}[.)])\s+", "", line)  # one markdown bullet / list number
    line = line.replace("**", "").replace("__", "")
    line = _LABEL.sub("", line).strip()
    line = line.strip(" \"'`“”‘’").strip()
    line = " ".join(line.split())
    if not line:
        return None, "empty"
    # One query: cut at the first sentence end that leaves a full query before it ("...cells? A study ...").
    for end in re.finditer(r"[.?!](?=\s+[A-Z\"“])", line):
        if len(re.findall(r"\w+", line[:end.end()])) >= min_words:
            line = line[:end.end()]
            break
    words = re.findall(r"\w+", line.lower())
    if re.match(r"^concept\s*\d+\s*:", line, re.I) or (len(words) >= min_words and prompt and
                                                         _norm(line) in _norm(prompt)):
        return None, "echo"
    if len(words) < min_words:
        return None, "too_short"
    if max_words is not None and len(words) > max_words:
        return None, "too_long"
    letters = sum(ch.isalpha() for ch in line)
    if letters < 0.5 * len(line.replace(" ", "")):
        return None, "not_text"
    top = Counter(words).most_common(1)[0][1]
    if (len(words) >= 6 and top > 0.4 * len(words)) or len(set(words)) < 0.5 * len(words):
        return None, "repetitive"
    if len({w.lower() for w in content_words(line)}) < 3:  # "What can we do with this?"
        return None, "vague"
    return line, "ok"


def shared_content_words(text: str, reference: str) -> int:
    """Distinct content words of ``text`` that ``reference`` also holds (case-insensitive; a word of 6+ letters
    also matches on its first 6, so "microRNAs" meets "microRNA"): a query written *for* a passage shares its
    terms, one that drifted off topic does not."""
    ref = {w.lower() for w in content_words(reference)}
    stems = {w[:6] for w in ref if len(w) >= 6}
    words = {w.lower() for w in content_words(text)}
    return sum(1 for w in words if w in ref or (len(w) >= 6 and w[:6] in stems))


# ---------------------------------------------------------------------------------------------- HF backend
def _adapter_targets_inner_model(adapter: str | os.PathLike) -> bool:
    """True when the adapter was saved on a bare decoder (``AutoModel``: keys ``base_model.model.layers.*``),
    as REPAIR's retriever adapters are; False for one saved on a causal LM (``base_model.model.model.*``)."""
    from safetensors import safe_open

    path = Path(adapter) / "adapter_model.safetensors"
    if not path.exists():
        return True
    with safe_open(str(path), framework="pt") as fh:
        keys = list(fh.keys())
    return not any(k.startswith("base_model.model.model.") for k in keys)


class HFGenerator:
    """A local causal LM (HF id, folder, or alias ``smollm2-135m``) with batched, seeded generation."""

    backend = "hf"

    def __init__(self, model: str = "smollm2-135m", adapter: str | None = None, *, device: str | None = None,
                 dtype: Any = None, batch_size: int = 8, chat_template: str = "auto",
                 trust_remote_code: bool = False):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from .models import resolve_model
        from .runtime import default_dtype, pick_device

        spec = resolve_model(model, pooling="eos", trust_remote_code=trust_remote_code)
        self.model_name, self.path, self.adapter = model, spec.path, adapter
        self.device = pick_device(device)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        self.dtype = dtype or default_dtype(self.device)
        self.batch_size = max(1, int(batch_size))
        self.tokenizer = AutoTokenizer.from_pretrained(spec.path, trust_remote_code=trust_remote_code)
        self.tokenizer.padding_side = "left"  # decoder-only generation continues from the last real token
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if chat_template == "on" and not has_template:
            raise ValueError(f"{model}: the tokenizer has no chat template (use chat_template='off')")
        self.use_chat = has_template if chat_template == "auto" else chat_template == "on"
        self.model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=self.dtype,
                                                          trust_remote_code=trust_remote_code)
        if adapter:
            self._merge_adapter(adapter)
        self.model.to(self.device).eval()

    def _merge_adapter(self, adapter: str) -> None:
        from peft import PeftModel

        if _adapter_targets_inner_model(adapter):
            inner = self.model.get_decoder()
            merged = PeftModel.from_pretrained(inner, adapter).merge_and_unload()
            self.model.set_decoder(merged)
        else:
            self.model = PeftModel.from_pretrained(self.model, adapter).merge_and_unload()
        logger.info("merged LoRA adapter %s into the generator", adapter)

    def describe(self) -> dict:
        return {"backend": self.backend, "model": self.model_name, "path": str(self.path), "adapter": self.adapter,
                "chat_template": self.use_chat}

    def format(self, prompt: Prompt) -> str:
        """The exact text fed to the model: the chat template applied, or the raw completion prompt."""
        if isinstance(prompt, list):
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("chat messages given but the tokenizer has no chat template")
            return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        if self.use_chat:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                      add_generation_prompt=True)
        return prompt

    def generate(self, prompts: list[Prompt], *, n: int = 1, seed: int = 0, max_new_tokens: int = 40,
                 temperature: float = 0.6, top_p: float = 0.9, repetition_penalty: float = 1.2,
                 do_sample: bool = True) -> list[str]:
        """``n`` completions per prompt (grouped by prompt), decoded without the prompt and special tokens.

        Batch ``b`` is sampled after ``torch.manual_seed(seed + b)``, so a call repeats exactly.
        """
        import torch

        texts = [self.format(p) for p in prompts for _ in range(n)]
        chat_formatted = self.use_chat or any(isinstance(p, list) for p in prompts)
        outputs: list[str] = []
        for b, start in enumerate(range(0, len(texts), self.batch_size)):
            batch = texts[start:start + self.batch_size]
            enc = self.tokenizer(batch, return_tensors="pt", padding=True,
                                 add_special_tokens=not chat_formatted).to(self.device)
            torch.manual_seed(seed + b)
            kwargs = dict(max_new_tokens=max_new_tokens, repetition_penalty=repetition_penalty,
                          pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id)
            if do_sample:
                kwargs.update(do_sample=True, temperature=temperature, top_p=top_p)
            else:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            with torch.no_grad():
                out = self.model.generate(**enc, **kwargs)
            new_tokens = out[:, enc["input_ids"].shape[1]:]
            outputs.extend(self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
        return [o.strip() for o in outputs]


# ---------------------------------------------------------------------------------------------- OpenAI backend
OPENAI_URL_ENV, OPENAI_MODEL_ENV, OPENAI_KEY_ENV = "OPENAI_BASE_URL", "OPENAI_MODEL", "OPENAI_API_KEY"


class OpenAIGenerator:
    """``POST {base_url}/chat/completions`` on any OpenAI-compatible server; one request per prompt.

    ``extra_body`` is merged into each request (e.g. ``{"repetition_penalty": 1.2}``, understood by vLLM,
    or ``{"repeat_penalty": 1.2}`` for llama.cpp); the official API rejects unknown fields, so
    ``repetition_penalty`` is only sent when ``send_repetition_penalty`` is true. A server that ignores
    ``n`` is asked again (seed + j) until ``n`` completions are collected.
    """

    backend = "openai"

    def __init__(self, base_url: str | None = None, model: str | None = None, *, api_key_env: str = OPENAI_KEY_ENV,
                 timeout: float = 120.0, max_retries: int = 3, backoff_base: float = 1.0, concurrency: int = 4,
                 send_repetition_penalty: bool = True, extra_body: dict | None = None):
        base_url = base_url or os.environ.get(OPENAI_URL_ENV) or "http://127.0.0.1:8000/v1"
        keys = load_keys(None, api_key_env)
        self.client = ApiClient("openai-compatible", base_url, keys=KeyPool(keys, None, "openai-compatible",
                                                                            f"${api_key_env}"),
                                auth_header="Authorization", auth_prefix="Bearer ", timeout=timeout,
                                max_retries=max_retries, backoff_base=backoff_base, cache=None,
                                passthrough_statuses=(), key_env=api_key_env)
        self.base_url = base_url
        self.concurrency = max(1, concurrency)
        self.send_repetition_penalty = send_repetition_penalty
        self.extra_body = dict(extra_body or {})
        self.model_name = model or os.environ.get(OPENAI_MODEL_ENV) or self._served_model()

    def _served_model(self) -> str:
        """The first model the server lists (``GET /models``), for servers that serve one model."""
        resp = self.client.get_json("models")
        models = (resp.data or {}).get("data") if isinstance(resp.data, dict) else None
        if not models:
            raise ValueError(f"{self.base_url}/models lists no model; pass a model name")
        return str(models[0]["id"])

    def describe(self) -> dict:
        return {"backend": self.backend, "model": self.model_name, "base_url": self.base_url}

    def _complete(self, prompt: Prompt, n: int, seed: int, sampling: dict) -> list[str]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        texts: list[str] = []
        attempt = 0
        while len(texts) < n and attempt < n:
            body = {"model": self.model_name, "messages": messages, "n": n - len(texts), "seed": seed + attempt,
                    "max_tokens": sampling["max_new_tokens"], "temperature": sampling["temperature"],
                    "top_p": sampling["top_p"]}
            if self.send_repetition_penalty and sampling.get("repetition_penalty") is not None:
                body["repetition_penalty"] = sampling["repetition_penalty"]
            body.update(self.extra_body)
            resp = self.client.post_json("chat/completions", body)
            choices = (resp.data or {}).get("choices") if isinstance(resp.data, dict) else None
            if not isinstance(choices, list):
                raise ValueError(f"{self.base_url}/chat/completions answered without 'choices'")
            choices = sorted(choices, key=lambda c: c.get("index", 0))
            texts.extend(((c.get("message") or {}).get("content") or c.get("text") or "") for c in choices)
            attempt += 1
        return [t.strip() for t in texts[:n]]

    def generate(self, prompts: list[Prompt], *, n: int = 1, seed: int = 0, max_new_tokens: int = 40,
                 temperature: float = 0.6, top_p: float = 0.9, repetition_penalty: float | None = 1.2,
                 do_sample: bool = True) -> list[str]:
        """``n`` completions per prompt (grouped by prompt); prompt ``i`` is sampled with seed ``seed + i*n``."""
        sampling = {"max_new_tokens": max_new_tokens, "temperature": temperature if do_sample else 0.0,
                    "top_p": top_p, "repetition_penalty": repetition_penalty}
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            results = list(pool.map(lambda ip: self._complete(ip[1], n, seed + ip[0] * n, sampling),
                                    enumerate(prompts)))
        return [text for group in results for text in group]


def make_generator(backend: str, **kw) -> HFGenerator | OpenAIGenerator:
    """``hf`` or ``openai``; keyword arguments go to the backend's constructor (unset ones dropped)."""
    kw = {k: v for k, v in kw.items() if v is not None}
    if backend == "hf":
        return HFGenerator(**kw)
    if backend == "openai":
        return OpenAIGenerator(**kw)
    raise ValueError(f"unknown generator backend {backend!r}; expected hf or openai")


def add_generator_args(parser, default_model_help: str = "smollm2-135m, the retriever backbone",
                       default_batch_help: str = "8") -> None:
    """The generator flags every generating script shares (05 query generation, the CausalNeg negatives step):
    ``--backend --model --adapter --device --dtype --batch_size --chat_template --trust_remote_code --openai_url
    --openai_no_repetition_penalty --openai_extra --concurrency``."""
    g = parser.add_argument_group("generator")
    g.add_argument("--backend", choices=["hf", "openai"], default="hf",
                   help="hf: local causal LM via transformers; openai: an OpenAI-compatible chat endpoint "
                        "(default: %(default)s)")
    g.add_argument("--model", default=None,
                   help=f"hf: HF id, folder or alias (default: {default_model_help}); openai: the "
                        "served model name (default: $OPENAI_MODEL, else the first model the server lists)")
    g.add_argument("--adapter", default=None, help="hf: the retriever's LoRA adapter, merged into the generator")
    g.add_argument("--device", default=None, help="hf: cpu | cuda | cuda:N (default: cuda when available)")
    g.add_argument("--dtype", default=None,
                   help="hf: float32 | bfloat16 | float16 (default: bf16 on CUDA, fp32 on CPU)")
    g.add_argument("--batch_size", type=int, default=None, help=f"hf: prompts per forward (default: {default_batch_help})")
    g.add_argument("--chat_template", choices=["auto", "on", "off"], default="auto",
                   help="hf: wrap prompts in the tokenizer's chat template (auto: when it has one)")
    g.add_argument("--trust_remote_code", action="store_true", help="hf: allow model code from the model folder")
    g.add_argument("--openai_url", default=None,
                   help="openai: base URL incl. /v1 (default: $OPENAI_BASE_URL or http://127.0.0.1:8000/v1); "
                        "the key is read from $OPENAI_API_KEY")
    g.add_argument("--openai_no_repetition_penalty", action="store_true",
                   help="openai: do not send repetition_penalty (the official API rejects it; vLLM accepts it)")
    g.add_argument("--openai_extra", default=None, help="openai: JSON object merged into every request body")
    g.add_argument("--concurrency", type=int, default=4, help="openai: parallel requests (default: %(default)s)")


def add_sampling_args(parser, max_new_tokens: int = DEFAULT_SAMPLING["max_new_tokens"]) -> None:
    """``--temperature --top_p --repetition_penalty --max_new_tokens`` (defaults of the original 05)."""
    s = parser.add_argument_group("sampling (defaults of the original 05)")
    s.add_argument("--temperature", type=float, default=DEFAULT_SAMPLING["temperature"], help="(default: %(default)s)")
    s.add_argument("--top_p", type=float, default=DEFAULT_SAMPLING["top_p"], help="(default: %(default)s)")
    s.add_argument("--repetition_penalty", type=float, default=DEFAULT_SAMPLING["repetition_penalty"],
                   help="(default: %(default)s)")
    s.add_argument("--max_new_tokens", type=int, default=max_new_tokens, help="(default: %(default)s)")


def sampling_from_args(args) -> dict:
    """The sampling keyword arguments of ``generate`` that :func:`add_sampling_args` flags describe."""
    return {"temperature": args.temperature, "top_p": args.top_p, "repetition_penalty": args.repetition_penalty,
            "max_new_tokens": args.max_new_tokens}


def generator_from_args(args, default_batch_size: int = 8) -> HFGenerator | OpenAIGenerator:
    """The generator that :func:`add_generator_args` flags describe."""
    import json

    if args.backend == "hf":
        return make_generator("hf", model=args.model or "smollm2-135m", adapter=args.adapter, device=args.device,
                              dtype=args.dtype, batch_size=args.batch_size or default_batch_size,
                              chat_template=args.chat_template, trust_remote_code=args.trust_remote_code)
    return make_generator("openai", base_url=args.openai_url, model=args.model, concurrency=args.concurrency,
                          send_repetition_penalty=not args.openai_no_repetition_penalty,
                          extra_body=json.loads(args.openai_extra) if args.openai_extra else None)
