"""A real OpenAI-compatible server in its own process, for the several-servers tests (issue 42): the tests'
:class:`helpers_sources.FakeServer` answering ``/v1/chat/completions`` with a text that depends on the prompt and the
request's seed only (as a seeded LLM's does), and, for a judge's one-token request with ``logprobs``, yes/no
log-probabilities that depend on the prompt only.

``python tests/openai_server_proc.py --port_file F [--die_after N] [--delay S]`` writes its URL to F once it
listens; with ``--die_after N`` the process exits abruptly (``os._exit``, no answer, sockets reset) when the N-th chat
request arrives, which is how a server dies mid-run; ``/stats`` reports the most chat requests it had in flight at
once.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers_sources import FakeServer, Reply, openai_route  # noqa: E402

TOPICS = ["band gap", "photocatalysis", "thermal stability", "ionic conductivity", "grain growth", "dopant levels"]


def digest(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def reply_for(messages: list[dict], seed: int) -> str:
    prompt = messages[-1]["content"]
    h = digest(prompt)
    return (f"How does the {TOPICS[(h + seed) % len(TOPICS)]} of sample {h % 997} change after "
            f"annealing step {seed % 13}?")


def judge_reply(body: dict) -> Reply:
    p_yes = (digest(body["messages"][-1]["content"]) % 1000 + 1) / 1002
    word = "yes" if p_yes >= 0.5 else "no"
    top = [{"token": "yes", "logprob": math.log(p_yes)}, {"token": "no", "logprob": math.log(1 - p_yes)}]
    return Reply(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": word},
                                    "logprobs": {"content": [{"token": word, "top_logprobs": top}]}}]})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port_file", required=True)
    p.add_argument("--die_after", type=int, default=0)
    p.add_argument("--delay", type=float, default=0.0)
    args = p.parse_args()
    chat = openai_route(reply_for, model="pool-model")
    lock = threading.Lock()
    state = {"seen": 0, "in_flight": 0, "max_in_flight": 0}

    def route(req):
        if req.path == "/stats":
            return Reply(200, dict(state))
        if req.path != "/v1/chat/completions":
            return chat(req)
        with lock:
            state["seen"] += 1
            if args.die_after and state["seen"] >= args.die_after:
                os._exit(3)  # dies with this and every other request in flight unanswered
            state["in_flight"] += 1
            state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        try:
            time.sleep(args.delay)
            return judge_reply(req.json) if req.json.get("logprobs") else chat(req)
        finally:
            with lock:
                state["in_flight"] -= 1

    with FakeServer(route) as server:
        Path(args.port_file).write_text(server.url + "/v1")
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
