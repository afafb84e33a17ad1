"""Issue 44's up-front refusals, each on the real driver or script (subprocesses, as a user runs them) with real files,
a real HTTP server on 127.0.0.1 and real pickles: a read-only OUT_DIR, a hub id the hub does not know or a hub that
does not answer, pickled ADAPTER / GEN_ADAPTER weights, and a full-model folder whose pytorch_model.bin holds code.
Each ends in one line, exit 2, before any work; before the fix they were tracebacks (exit 1), a first step that
failed 26 s in, or a check at step 05."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.helpers_pickle import WritesMarker
from tests.test_cli_errors import error_line, run

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data" / "demo" / "scifact-tiny"
IR_TINY = ROOT / "tests" / "fixtures" / "eval" / "ir-tiny"
NOBODY = 65534


def settings_check(env: dict[str, str], prefix: tuple[str, ...] = (), record: bool = False,
                   timeout: int = 60) -> subprocess.CompletedProcess:
    """The driver's check (``run_repair.sh`` runs exactly this first) in a clean environment: no HF_HUB_OFFLINE
    unless ``env`` sets it, no proxy."""
    args = [*prefix, sys.executable, "-m", "repair.driver.settings", "resolve", "--root", str(ROOT)]
    return subprocess.run(args + ([] if record else ["--no_record"]), capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                                                "TRAIN_DATA": str(TINY), **env})


def one_line(proc: subprocess.CompletedProcess) -> str:
    """The driver check's refusal: exit 2, exactly one line on stderr, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


# ---------------------------------------------------------------------------------------------- a read-only OUT_DIR
@pytest.fixture
def other_user():
    """(command prefix, base folder): the prefix runs a command as a user who cannot write a folder locked under the
    base. As root (who writes everywhere) that user is nobody, through setpriv; as any other user it is the user
    itself, and a locked folder is one without its write bit. The base is world-traversable (pytest's tmp_path of
    root is not)."""
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: no user to be refused")
        prefix = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
        probe = subprocess.run([*prefix, sys.executable, "-c", "import repair.driver.settings"], cwd=ROOT,
                               env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, capture_output=True)
        if probe.returncode != 0:
            pytest.skip("user nobody cannot import this checkout")
    base = Path(tempfile.mkdtemp(prefix="repair-outdir-"))
    base.chmod(0o755)
    yield prefix, base
    for folder, dirs, _ in os.walk(base):
        for d in dirs:
            (Path(folder) / d).chmod(0o755)
    shutil.rmtree(base)


def lock(folder: Path) -> None:
    """Read-only for its owner (a non-root test user); root-owned 0555 is read-only for nobody as well."""
    for path in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        path.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)


def test_an_out_dir_the_user_cannot_write_is_refused_in_one_line_before_any_work(other_user):
    """A root-owned folder, a subfolder of one and a finished run's folder (another user's): the driver's check
    (what run_repair.sh runs first) exits 2 with one line naming OUT_DIR, before anything is written. Before: a
    PermissionError traceback from check_and_record (exit 1). A file in OUT_DIR's place is refused the same way
    (root too), through run_repair.sh."""
    prefix, base = other_user
    locked = base / "locked"
    locked.mkdir()
    finished = base / "finished"
    made = settings_check({"OUT_DIR": str(finished)}, record=True)  # a run's record, as its owner's driver wrote it
    assert made.returncode == 0, made.stderr
    (finished / "logs").mkdir()
    (finished / ".state").mkdir()
    (finished / ".state" / "iter1.05_generate.r1.done").write_text("12\n")
    record = (finished / "settings.json").read_bytes()
    lock(locked)
    lock(finished)
    cases = {locked: f"OUT_DIR {locked} is not writable by this user (choose another OUT_DIR)",
             locked / "run": f"OUT_DIR {locked / 'run'} cannot be created: {locked} is not writable by this user "
                             f"(choose another OUT_DIR)",
             finished: f"OUT_DIR {finished} is not writable by this user (choose another OUT_DIR)"}
    for out_dir, expected in cases.items():
        proc = settings_check({"OUT_DIR": str(out_dir), "PROFILE": "demo-tiny"}, prefix, record=True)
        assert one_line(proc) == expected and proc.stdout == ""
    assert sorted(os.listdir(locked)) == []
    assert (finished / "settings.json").read_bytes() == record
    # the same user may still use a folder it can write (the check is not a refusal of every path)
    writable = base / "mine"
    writable.mkdir()
    writable.chmod(0o777)
    assert settings_check({"OUT_DIR": str(writable / "run")}, prefix).returncode == 0
    # a file where the folder goes: no user can make a run there; run_repair.sh stops with its check's line and code
    # (as root here: with setpriv, nobody could not run the interpreter bash looks up)
    afile = base / "afile"
    afile.write_text("x")
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "TRAIN_DATA": str(TINY), "PROFILE": "demo-tiny"}
    for out_dir in (afile, afile / "run"):
        proc = subprocess.run(["bash", str(ROOT / "run_repair.sh")], env={**env, "OUT_DIR": str(out_dir)},
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert one_line(proc) == f"OUT_DIR {out_dir}: {afile} is a file, not a folder (choose another OUT_DIR)"
        assert proc.stdout == ""  # no step started
    assert afile.read_text() == "x"


# ---------------------------------------------------------------------------------------------- a hub id not cached
class HubServer:
    """A Hugging Face endpoint on 127.0.0.1 knowing ``org/real`` (its config.json): 200 for it, 404 for the rest;
    every request is recorded (method, path, Authorization)."""

    def __init__(self):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self):  # noqa: N802 (http.server's name)
                seen.append(("HEAD", self.path, self.headers.get("Authorization")))
                found = self.path == "/org/real/resolve/main/config.json"
                self.send_response(200 if found else 404)
                if not found:
                    self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):  # noqa: N802
                seen.append(("GET", self.path, None))
                self.send_response(404)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub():
    server = HubServer()
    yield server
    server.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_hub_id_outside_the_cache_is_looked_up_once_and_refused_in_seconds(tmp_path, hub):
    """MODEL=org/typo used to pass the check and fail 26 s into the first step (12 lines of retries). Now one HEAD on
    its config.json: 404 -> refused naming the repository; no hub (a closed port) or a hub that never replies ->
    refused within the timeout with the HF_HUB_OFFLINE=1 hint; 200 -> accepted (the token sent, never shown);
    HF_HUB_OFFLINE=1 (the tests' default) asks nothing."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url, "OUT_DIR": str(tmp_path / "run")}
    ok = settings_check({**env, "MODEL": "org/real", "HF_TOKEN": "hf_secret123"})
    assert ok.returncode == 0, ok.stderr
    assert hub.seen == [("HEAD", "/org/real/resolve/main/config.json", "Bearer hf_secret123")]
    assert "hf_secret123" not in ok.stdout + ok.stderr
    hub.seen.clear()
    typo = one_line(settings_check({**env, "MODEL": "org/typo"}))
    assert typo.startswith(f"MODEL not found on the hub ({hub.url}): no repository 'org/typo' (HTTP 404; ")
    assert "HF_HUB_OFFLINE=1" in typo
    assert hub.seen == [("HEAD", "/org/typo/resolve/main/config.json", None)]  # once: no retries
    hub.seen.clear()
    # the generator's model too (GEN_MODEL defaults to MODEL and is then not looked up twice)
    gen = one_line(settings_check({**env, "MODEL": "org/real", "GEN_MODEL": "org/gen-typo"}))
    assert gen.startswith(f"GEN_MODEL not found on the hub ({hub.url}): no repository 'org/gen-typo'")
    assert [path for _, path, _ in hub.seen] == ["/org/real/resolve/main/config.json",
                                                  "/org/gen-typo/resolve/main/config.json"]
    hub.seen.clear()
    from repair.models import HUB_TIMEOUT_S

    port = closed_port()
    started = time.monotonic()
    down = one_line(settings_check({**env, "MODEL": "org/real", "HF_ENDPOINT": f"http://127.0.0.1:{port}"}))
    assert time.monotonic() - started < 20  # the check's own start included; the refusal itself is immediate
    assert down.startswith(f"MODEL: 'org/real' is not in the Hugging Face cache ({tmp_path / 'hf' / 'hub'}) and the "
                           f"hub (http://127.0.0.1:{port}) did not answer within {HUB_TIMEOUT_S:g} s (ConnectionError")
    assert "; without network, set HF_HUB_OFFLINE=1 and use a model in the cache, a local folder or an alias" in down
    # a hub that accepts the connection and never replies: refused once the timeout has passed, not retried
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        started = time.monotonic()
        mute = one_line(settings_check({**env, "MODEL": "org/real",
                                        "HF_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}"}))
        assert HUB_TIMEOUT_S <= time.monotonic() - started < 2 * HUB_TIMEOUT_S + 10
    assert "did not answer within" in mute and "(ReadTimeout" in mute
    # offline: nothing is asked, the id must be cached (the message the tests' HF_HUB_OFFLINE=1 has always given)
    offline = one_line(settings_check({**env, "MODEL": "org/real", "HF_HUB_OFFLINE": "1"}))
    assert offline.startswith("MODEL: 'org/real' is not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE=1 forbids" in offline
    assert hub.seen == []


# ---------------------------------------------------------------------------------------------- pickles holding code
@pytest.fixture(scope="module")
def pickled(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """The tiny model as a full-model folder with ``pytorch_model.bin`` (what ``save_pretrained`` wrote before
    safetensors, or ``torch.save`` of a state dict) — a good one and one holding code — and a LoRA adapter folder on
    it whose ``adapter_model.bin`` holds code."""
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("pickled")
    marker = root / "MARKER"
    state = load_file(tiny_model_dir / "model.safetensors")
    for name in ("good_bin", "evil_bin"):
        shutil.copytree(tiny_model_dir, root / name)
        (root / name / "model.safetensors").unlink()
    torch.save(state, root / "good_bin" / "pytorch_model.bin")
    torch.save({**state, next(iter(state)): WritesMarker(marker)}, root / "evil_bin" / "pytorch_model.bin")
    adapter = root / "evil_adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tiny_model_dir),
                                                             "peft_type": "LORA", "r": 2, "lora_alpha": 4,
                                                             "target_modules": ["q_proj"]}))
    torch.save({"base_model.model.layers.0.self_attn.q_proj.lora_A.weight": WritesMarker(marker)},
               adapter / "adapter_model.bin")
    return {"good": root / "good_bin", "evil": root / "evil_bin", "adapter": adapter, "marker": marker,
            "source": tiny_model_dir}


def refusal(weights: Path) -> str:
    return (f"{weights}: not loadable with torch.load(weights_only=True) (Unsupported global: GLOBAL exec was not an "
            f"allowed global by default): it holds objects other than tensors and plain containers, or is not a "
            f"torch file")


def test_a_full_model_whose_pytorch_model_bin_holds_code_is_refused_in_one_line(tmp_path, pickled):
    """As --model of the evaluation and of the trainer (full fine-tuning), and as the driver's MODEL: exit 2, one line
    naming pytorch_model.bin, the pickle's code never ran. Before: a 35-42 line traceback ending in torch's advice to
    load with weights_only=False (scripts), and the driver's check accepted the folder. A .bin of plain tensors still
    loads (only its pickle is read by the check: the tensors are memory-mapped)."""
    evil, marker = pickled["evil"], pickled["marker"]
    expected = refusal(evil / "pytorch_model.bin")
    t0 = tmp_path / "t0.jsonl"
    t0.write_text("".join(json.dumps({"query": f"q{i}", "positive": f"p{i}"}) + "\n" for i in range(4)))
    cases = [("eval/eval_beir.py", ["--data", str(IR_TINY), "--model", str(evil), "--device", "cpu",
                                    "--cache_dir", "none"]),
             ("training/10_train_lora.py", ["--train_data", str(t0), "--output_dir", str(tmp_path / "out"),
                                            "--model", str(evil), "--full_finetune", "--device", "cpu",
                                            "--max_steps", "1", "--no_progress"])]
    for script, args in cases:
        proc = run(script, *args, env={"REPAIR_CACHE": str(tmp_path / "cache")})
        assert error_line(proc) == f"error: {expected}", script
    check = settings_check({"MODEL": str(evil), "OUT_DIR": str(tmp_path / "run")})
    assert one_line(check) == f"MODEL: {expected}"
    assert not marker.exists() and not (tmp_path / "out" / "config.json").exists() and not (tmp_path / "run").exists()
    from repair.encoding import Retriever
    from repair.models import check_model_name, check_model_weights

    good = pickled["good"]
    check_model_weights(good)
    assert check_model_name(str(good)) is None
    vectors = [Retriever.load(str(folder), device="cpu", max_length=16).encode_queries(["titanium dioxide"])
               for folder in (good, pickled["source"])]
    assert torch.equal(vectors[0], vectors[1])  # the .bin's own weights, the same as the safetensors original


def test_adapter_weights_are_checked_before_the_first_step(tmp_path, pickled):
    """ADAPTER, GEN_ADAPTER and an adapter folder given as MODEL: a pickled adapter_model.bin holding code is refused
    by the driver's check (one line naming the file), not when step 05 or the first evaluation loads it."""
    adapter, marker = pickled["adapter"], pickled["marker"]
    expected = refusal(adapter / "adapter_model.bin")
    env = {"OUT_DIR": str(tmp_path / "run")}
    assert one_line(settings_check({**env, "ADAPTER": str(adapter)})) == f"ADAPTER: {expected}"
    assert one_line(settings_check({**env, "GEN_ADAPTER": str(adapter)})) == f"GEN_ADAPTER: {expected}"
    assert one_line(settings_check({**env, "MODEL": str(adapter)})) == f"MODEL: {expected}"
    assert not marker.exists() and not (tmp_path / "run").exists()
