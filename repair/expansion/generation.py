"""Text generation backends (DESIGN 5 step 5): prompts in, completions out, and the flags that pick one.

Two backends with one API, ``generate(prompts, *, n, seed, max_new_tokens, temperature, top_p,
repetition_penalty) -> list[str]`` (``n`` completions per prompt, grouped by prompt):

- :class:`HFGenerator`: a local causal LM through ``transformers`` (default: the retriever's own backbone,
  as in the paper where M_theta writes the queries), batched with left padding, chat template when the
  tokenizer has one, seeded sampling. A retriever LoRA adapter (trained on ``AutoModel``) is merged into the
  causal LM's inner decoder, so its key prefixes match (the original loaded it onto the causal-LM wrapper,
  where they may not: UPSTREAM 5.22).
- :class:`OpenAIGenerator`: any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, llama.cpp server,
  Ollama), through the same HTTP core as the literature sources (retries, timeouts, key never logged).
- ``ct2`` (:class:`repair.expansion.ct2_generation.CT2Generator`, issue 33): the local model on the CTranslate2 engine
  (int8 on CPU), HFGenerator's API and prompt formatting; ``--gen_backend ct2`` picks it for ``--backend hf``.

A prompt is a string (sent as one user message when a chat template is used) or a list of chat messages.
Separate from what is asked: 05's prompt and cleaning (:mod:`repair.expansion.query_generation`), the T0-style rewrite
(:mod:`repair.expansion.t0_style`) and the CausalNeg negatives step all use these backends.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from repair.cli import non_negative_float, positive_float, positive_int, positive_share
from repair.expansion.local_llm import Prompt, format_prompt, load_generation_tokenizer, merge_adapter
from repair.models import DEFAULT_MODEL
from repair.expansion.server_pool import ServerPool, split_urls
from repair.expansion.sources.http import ApiClient, KeyPool, load_keys

logger = logging.getLogger(__name__)


# Sampling defaults of the original 05 (UPSTREAM 2.6).
DEFAULT_SAMPLING = {"max_new_tokens": 40, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.2}


# ---------------------------------------------------------------------------------------------- HF backend
class HFGenerator:
    """A local causal LM (HF id, folder, or alias ``smollm2-135m``) with batched, seeded generation."""

    backend = "hf"

    def __init__(self, model: str = DEFAULT_MODEL, adapter: str | None = None, *, device: str | None = None,
                 dtype: Any = None, batch_size: int = 8, chat_template: str = "auto",
                 trust_remote_code: bool = False):
        import torch
        from transformers import AutoModelForCausalLM

        from repair.models import resolve_model
        from repair.runtime import default_dtype, pick_device

        spec = resolve_model(model, pooling="eos", trust_remote_code=trust_remote_code)
        self.model_name, self.path, self.adapter = model, spec.path, adapter
        self.device = pick_device(device)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        self.dtype = dtype or default_dtype(self.device)
        self.batch_size = max(1, int(batch_size))
        self.tokenizer, self.use_chat = load_generation_tokenizer(spec.path, model, chat_template, trust_remote_code)
        self.model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=self.dtype,
                                                          trust_remote_code=trust_remote_code)
        if adapter:
            self.model = merge_adapter(self.model, adapter)
        self.model.to(self.device).eval()

    def describe(self) -> dict:
        return {"backend": self.backend, "model": self.model_name, "path": str(self.path), "adapter": self.adapter,
                "chat_template": self.use_chat}

    def format(self, prompt: Prompt) -> str:
        """The exact text fed to the model: the chat template applied, or the raw completion prompt."""
        return format_prompt(self.tokenizer, self.use_chat, prompt)

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

    ``base_url`` may name several servers serving the same model (comma-separated, issue 42): requests spread over
    them, ``concurrency`` in flight on each, a failed one goes to another (:class:`repair.expansion.server_pool.ServerPool`).

    ``extra_body`` is merged into each request (e.g. ``{"repetition_penalty": 1.2}``, understood by vLLM,
    or ``{"repeat_penalty": 1.2}`` for llama.cpp); the official API rejects unknown fields, so
    ``repetition_penalty`` is only sent when ``send_repetition_penalty`` is true. A server that ignores
    ``n`` is asked again (seed + j) until ``n`` completions are collected.
    """

    backend = "openai"

    def __init__(self, base_url: str | None = None, model: str | None = None, *, api_key_env: str = OPENAI_KEY_ENV,
                 timeout: float = 120.0, max_retries: int = 3, backoff_base: float = 1.0, concurrency: int = 4,
                 send_repetition_penalty: bool = True, extra_body: dict | None = None):
        urls = split_urls(base_url or os.environ.get(OPENAI_URL_ENV) or "http://127.0.0.1:8000/v1")
        keys = load_keys(None, api_key_env)
        # several servers: each client tries once and the pool sends a failed request to another server
        clients = [ApiClient("openai-compatible", url, keys=KeyPool(keys, None, "openai-compatible",
                                                                    f"${api_key_env}"),
                             auth_header="Authorization", auth_prefix="Bearer ", timeout=timeout,
                             max_retries=max_retries if len(urls) == 1 else 0, backoff_base=backoff_base,
                             cache=None, passthrough_statuses=(), key_env=api_key_env) for url in urls]
        self.concurrency = max(1, concurrency)
        self.client = ServerPool(clients, per_server=self.concurrency, attempts=len(urls) * (max_retries + 1),
                                 backoff_base=backoff_base)
        self.base_url = self.client.base_url
        self.parallel = self.concurrency * self.client.size  # threads that keep every server's slots busy
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
        with ThreadPoolExecutor(max_workers=self.parallel) as pool:
            results = list(pool.map(lambda ip: self._complete(ip[1], n, seed + ip[0] * n, sampling),
                                    enumerate(prompts)))
        return [text for group in results for text in group]


# In-process engines (--gen_backend): transformers, the default and the fallback, and CTranslate2 (issue 33).
LOCAL_ENGINES = ("hf", "ct2")
CT2_ONLY_ARGS = ("quantization", "compute_type", "threads")


def make_generator(backend: str, **kw) -> Any:
    """``hf``, ``ct2`` or ``openai``; keyword arguments go to the backend's constructor (unset ones dropped).
    ``ct2`` falls back to ``hf`` (with a warning) where the ``ctranslate2`` package is not installed."""
    kw = {k: v for k, v in kw.items() if v is not None}
    if backend == "ct2":
        import importlib.util

        if importlib.util.find_spec("ctranslate2") is not None:
            from repair.expansion.ct2_generation import CT2Generator

            return CT2Generator(**kw)
        logger.warning("ctranslate2 is not installed (pip install -r requirements.txt): generating with "
                       "transformers instead")
        backend = "hf"
    if backend == "hf":
        return HFGenerator(**{k: v for k, v in kw.items() if k not in CT2_ONLY_ARGS})
    if backend == "openai":
        return OpenAIGenerator(**kw)
    raise ValueError(f"unknown generator backend {backend!r}; expected hf, ct2 or openai")


def add_generator_args(parser, default_model_help: str = f"{DEFAULT_MODEL}, the retriever backbone",
                       default_batch_help: str = "8") -> None:
    """The generator flags every generating script shares (05 query generation, 06c, the CausalNeg negatives step):
    ``--backend --gen_backend --ct2_quantization --model --adapter --device --dtype --batch_size --chat_template --trust_remote_code --openai_url
    --openai_no_repetition_penalty --openai_extra --concurrency``."""
    g = parser.add_argument_group("generator")
    g.add_argument("--backend", choices=["hf", "openai"], default="hf",
                   help="hf: local causal LM via transformers; openai: an OpenAI-compatible chat endpoint "
                        "(default: %(default)s)")
    g.add_argument("--gen_backend", choices=list(LOCAL_ENGINES), default="hf",
                   help="hf backend's engine: hf = transformers (default; the fallback); ct2 = CTranslate2 on a "
                        "copy of the model converted once beside it (docs/generators.md)")
    g.add_argument("--ct2_quantization", choices=["int8", "float32"], default="int8",
                   help="ct2: weights of the converted copy (default: %(default)s; float32 = transformers' numbers)")
    g.add_argument("--model", default=None,
                   help=f"hf: HF id, folder or alias (default: {default_model_help}); openai: the "
                        "served model name (default: $OPENAI_MODEL, else the first model the server lists)")
    g.add_argument("--adapter", default=None, help="hf: the retriever's LoRA adapter, merged into the generator")
    g.add_argument("--device", default=None, help="hf: cpu | cuda | cuda:N (default: cuda when available)")
    g.add_argument("--dtype", default=None,
                   help="hf: float32 | bfloat16 | float16 (default: bf16 on CUDA, fp32 on CPU)")
    g.add_argument("--batch_size", type=positive_int, default=None,
                   help=f"hf: prompts per forward (default: {default_batch_help})")
    g.add_argument("--chat_template", choices=["auto", "on", "off"], default="auto",
                   help="hf: wrap prompts in the tokenizer's chat template (auto: when it has one)")
    g.add_argument("--trust_remote_code", action="store_true", help="hf: allow model code from the model folder")
    g.add_argument("--openai_url", default=None,
                   help="openai: base URL incl. /v1, or several servers of one model comma-separated (requests "
                        "spread over them; a failed one goes to another) (default: $OPENAI_BASE_URL or "
                        "http://127.0.0.1:8000/v1); the key is read from $OPENAI_API_KEY")
    g.add_argument("--openai_no_repetition_penalty", action="store_true",
                   help="openai: do not send repetition_penalty (the official API rejects it; vLLM accepts it)")
    g.add_argument("--openai_extra", default=None, help="openai: JSON object merged into every request body")
    g.add_argument("--concurrency", type=positive_int, default=4,
                   help="openai: requests in flight per server (default: %(default)s)")


def add_sampling_args(parser, max_new_tokens: int = DEFAULT_SAMPLING["max_new_tokens"]) -> None:
    """``--temperature --top_p --repetition_penalty --max_new_tokens`` (defaults of the original 05)."""
    s = parser.add_argument_group("sampling (defaults of the original 05)")
    s.add_argument("--temperature", type=non_negative_float, default=DEFAULT_SAMPLING["temperature"],
                   help="(default: %(default)s)")
    s.add_argument("--top_p", type=positive_share, default=DEFAULT_SAMPLING["top_p"], help="(default: %(default)s)")
    s.add_argument("--repetition_penalty", type=positive_float, default=DEFAULT_SAMPLING["repetition_penalty"],
                   help="(default: %(default)s)")
    s.add_argument("--max_new_tokens", type=positive_int, default=max_new_tokens, help="(default: %(default)s)")


def sampling_from_args(args) -> dict:
    """The sampling keyword arguments of ``generate`` that :func:`add_sampling_args` flags describe."""
    return {"temperature": args.temperature, "top_p": args.top_p, "repetition_penalty": args.repetition_penalty,
            "max_new_tokens": args.max_new_tokens}


def generator_from_args(args, default_batch_size: int = 8) -> Any:
    """The generator that :func:`add_generator_args` flags describe."""
    import json

    if args.backend == "hf":
        engine = getattr(args, "gen_backend", "hf")
        extra = {"quantization": args.ct2_quantization} if engine == "ct2" else {}
        return make_generator(engine, model=args.model or DEFAULT_MODEL, adapter=args.adapter, device=args.device,
                              dtype=args.dtype, batch_size=args.batch_size or default_batch_size,
                              chat_template=args.chat_template, trust_remote_code=args.trust_remote_code, **extra)
    return make_generator("openai", base_url=args.openai_url, model=args.model, concurrency=args.concurrency,
                          send_repetition_penalty=not args.openai_no_repetition_penalty,
                          extra_body=json.loads(args.openai_extra) if args.openai_extra else None)
