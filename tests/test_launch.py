"""The launch line of the rank-parallel steps (issue 42), built from the environment exactly as documented in
repair/driver/launch.py and run_repair.sh --help: one process, torchrun on one node, srun + torchrun's c10d
rendezvous on the first node of a Slurm allocation (found through a fake ``scontrol`` on PATH), and the same settings
by hand outside Slurm; bad settings stop the driver in a second with the setting named."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def fake_scontrol(tmp_path):
    """``scontrol show hostnames node[07-08]`` -> node07, node08 (one per line), as Slurm prints them; every call
    is recorded in calls.txt."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(calls))}\n'
                      'if [ "$1 $2 $3" = "show hostnames node[07-08]" ]; then printf "node07\\nnode08\\n"; exit 0; fi\n'
                      'echo "scontrol: error: bad node list" >&2; exit 1\n')
    script.chmod(0o755)
    return bin_dir, calls


def prefix(env: dict, *extra: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("SLURM_") and k not in ("NNODES", "NPROC", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run([sys.executable, "-m", "repair.driver.launch", "prefix", "--python", "py", *extra],
                          env={**clean, **env}, capture_output=True, text=True, timeout=60)


def slurm_env(bin_dir: Path, **over: str) -> dict:
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242017", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "node[07-08]", "SLURM_NODEID": "0", "SLURM_CPUS_PER_TASK": "8", "NPROC": "4"}
    return {**env, **over}


def test_inside_slurm_srun_starts_one_torchrun_per_node_meeting_at_the_first_node(fake_scontrol):
    bin_dir, calls = fake_scontrol
    proc = prefix(slurm_env(bin_dir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--cpus-per-task=8",
        "py", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "4", "--rdzv_backend", "c10d",
        "--rdzv_endpoint", "node07:29517", "--rdzv_id", "repair-4242017"]  # port 29500 + 4242017 % 1000
    assert calls.read_text().split("\n")[0] == "show hostnames node[07-08]"
    # the user's settings win over Slurm's; NNODES=1 in a 2-node allocation is one node's torchrun
    proc = prefix(slurm_env(bin_dir, MASTER_ADDR="login-is-wrong-but-given", MASTER_PORT="31000"))
    assert "--rdzv_endpoint login-is-wrong-but-given:31000" in proc.stdout
    assert prefix(slurm_env(bin_dir, NNODES="1")).stdout.split() == [
        "py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4"]


def test_one_node_lines_are_unchanged():
    assert prefix({}).stdout.split() == ["py"]
    assert prefix({"NPROC": "2"}).stdout.split() == ["py", "-m", "torch.distributed.run", "--standalone",
                                                     "--nproc_per_node", "2"]


def test_by_hand_outside_slurm_node_0_hosts_the_rendezvous():
    env = {"NNODES": "2", "NPROC": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29999"}
    common = ["py", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend",
              "c10d", "--rdzv_endpoint", "10.1.2.3:29999", "--rdzv_id", "repair", "--rdzv_conf"]
    assert prefix(env).stdout.split() == [*common, "is_host=true"]
    assert prefix(env, "--peer").stdout.split() == [*common, "is_host=false"]
    assert prefix({**env, "NODE_RANK": "1"}).stdout.split() == [*common, "is_host=false"]


@pytest.mark.parametrize("env, message", [
    ({"NNODES": "2"}, "NNODES=2 outside Slurm needs MASTER_ADDR"),
    ({"NNODES": "2", "MASTER_ADDR": "h", "NODE_RANK": "2"}, "NODE_RANK must be between 0 and 1, got 2"),
    ({"NNODES": "two"}, "NNODES must be an integer, got 'two'"),
    ({"NNODES": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT must be between 1 and 65535"),
])
def test_bad_settings_are_named(env, message):
    proc = prefix(env)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_slurm_errors_name_the_fix(fake_scontrol):
    bin_dir, _ = fake_scontrol
    proc = prefix(slurm_env(bin_dir, NNODES="3"))
    assert proc.returncode == 2 and "NNODES=3 but the Slurm allocation has 2 node(s)" in proc.stderr
    proc = prefix(slurm_env(bin_dir, SLURM_JOB_NODELIST="weird[1-"))
    assert proc.returncode == 2 and "set MASTER_ADDR to the first node" in proc.stderr


def test_driver_refuses_bad_launch_settings_before_any_work(tmp_path):
    """run_repair.sh takes its launch line from repair.driver.launch: NNODES=2 without a rendezvous host, and a
    driver started on node 1, stop with exit 2 and the reason, and nothing is run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHON=sys.executable, OUT_DIR=str(tmp_path / "run"), PROFILE="demo-tiny")
    proc = subprocess.run(["bash", str(ROOT / "run_repair.sh")], env={**env, "NNODES": "2"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "NNODES=2 outside Slurm needs MASTER_ADDR" in proc.stderr
    proc = subprocess.run(["bash", str(ROOT / "run_repair.sh")],
                          env={**env, "NNODES": "2", "MASTER_ADDR": "127.0.0.1", "NODE_RANK": "1"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "runs on node 0 only (NODE_RANK=1)" in proc.stderr
    assert not list((tmp_path / "run").glob("logs/*.log"))
