"""The launch line of the driver's rank-parallel steps (10's training, 07's encoding): one process, torchrun on one
node, or torchrun on several nodes through Slurm's ``srun`` or by hand (issue 42).

Why one function: the line depends on six settings and on Slurm's environment, and a wrong one fails minutes into a
run on a cluster (a rendezvous host outside the allocation, one launcher per GPU instead of per node). Here it is
built from an environment mapping and tested with fake ``SLURM_*`` variables and a fake ``scontrol``;
``run_repair.sh`` takes it from ``python -m repair.driver.launch shell``.

The engines are torch's and Slurm's: ``torchrun``'s c10d rendezvous (every node's launcher meets at
``MASTER_ADDR:MASTER_PORT``; the launchers number the nodes and ranks themselves) and ``srun --ntasks-per-node=1``
(one launcher per node of the allocation). Global rank 0 is the one process that writes shared outputs (the trainer's
checkpoints and adapter, 07's embedding dir); every rank of every node reads and writes the run folder, so
``OUT_DIR`` must be on a filesystem all nodes share (the usual home or project space of a cluster).

Settings (environment variables, defaults in brackets):

- ``NNODES`` [``$SLURM_NNODES``, else 1]: nodes of a rank-parallel step.
- ``NPROC`` [1]: processes (GPUs) per node.
- ``NODE_RANK`` [``$SLURM_NODEID``, else 0]: this node's number; outside Slurm node 0 hosts the rendezvous store
  (``--rdzv_conf is_host=...``), and only node 0 runs the driver.
- ``MASTER_ADDR`` [inside Slurm: the first name of ``scontrol show hostnames "$SLURM_JOB_NODELIST"``, a node of the
  allocation and the one the batch script runs on; outside Slurm: required when NNODES > 1]: the rendezvous host.
- ``MASTER_PORT`` [inside Slurm: 29500 + the job id modulo 1000, so two jobs that share a node do not meet at one
  port; else 29500]: the rendezvous port.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

DEFAULT_PORT = 29500


class LaunchError(ValueError):
    """A launch setting is wrong; the message names it."""


@dataclass(frozen=True)
class Launch:
    """Where and how many: the resolved launch settings."""

    nnodes: int
    nproc: int
    node_rank: int
    master_addr: str
    master_port: int
    slurm: bool  # inside a Slurm allocation (SLURM_JOB_ID set): srun starts the launchers
    job_id: str
    # srun no longer inherits sbatch's --cpus-per-task (Slurm >= 22.05): each launcher gets the job's CPUs per task
    srun_extra: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    def rdzv_id(self) -> str:
        """One id per job: launchers of another job meeting at the same port are refused by torchrun."""
        return f"repair-{self.job_id}" if self.job_id else "repair"


def slurm_first_host(nodelist: str, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:
    """The first host name of a Slurm node list (``node[01-04]`` -> ``node01``), through ``scontrol show hostnames``
    (Slurm's own expansion: its bracket syntax is not worth re-implementing)."""
    try:
        proc = run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise LaunchError(f"SLURM_JOB_NODELIST={nodelist!r} but scontrol is not on PATH: set MASTER_ADDR to the "
                          f"first node of the allocation") from None
    names = proc.stdout.split() if proc.returncode == 0 else []
    if not names:
        raise LaunchError(f"scontrol show hostnames {nodelist!r} failed ({proc.stderr.strip()[:200]}): set "
                          f"MASTER_ADDR to the first node of the allocation")
    return names[0]


def _int(environ: Mapping[str, str], name: str, default: str, low: int, high: int | None = None) -> int:
    raw = environ.get(name, "") or default
    try:
        value = int(raw)
    except ValueError:
        raise LaunchError(f"{name} must be an integer, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        limit = f"between {low} and {high}" if high is not None else f">= {low}"
        raise LaunchError(f"{name} must be {limit}, got {value}")
    return value


def resolve_launch(environ: Mapping[str, str],
                   run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Launch:
    """The launch settings from the environment: the user's variables first, then Slurm's, then the defaults."""
    slurm = bool(environ.get("SLURM_JOB_ID"))
    job_id = environ.get("SLURM_JOB_ID", "")
    nnodes = _int(environ, "NNODES", environ.get("SLURM_NNODES", "") or "1", 1)
    nproc = _int(environ, "NPROC", "1", 1)
    node_rank = _int(environ, "NODE_RANK", environ.get("SLURM_NODEID", "") or "0", 0, nnodes - 1)
    port_default = str(DEFAULT_PORT + (int(job_id) % 1000 if job_id.isdigit() else 0))
    port = _int(environ, "MASTER_PORT", port_default, 1, 65535)
    addr = environ.get("MASTER_ADDR", "")
    if not addr and nnodes > 1:
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "")
        if not nodelist:
            raise LaunchError(f"NNODES={nnodes} outside Slurm needs MASTER_ADDR: the host name of node 0, where the "
                              f"driver runs (every node must reach it at MASTER_PORT={port})")
        addr = slurm_first_host(nodelist, run)
    if slurm and nnodes > 1:
        allocated = _int(environ, "SLURM_NNODES", str(nnodes), 1)
        if nnodes > allocated:
            raise LaunchError(f"NNODES={nnodes} but the Slurm allocation has {allocated} node(s) "
                              f"(sbatch --nodes={nnodes})")
    cpus = environ.get("SLURM_CPUS_PER_TASK", "")
    srun_extra = (f"--cpus-per-task={cpus}",) if cpus.isdigit() else ()
    return Launch(nnodes, nproc, node_rank, addr or "127.0.0.1", port, slurm, job_id, srun_extra)


def launch_prefix(launch: Launch, python: str, *, peer: bool = False) -> list[str]:
    """The words before a rank-parallel script's path.

    One node: ``python`` (one process) or ``python -m torch.distributed.run --standalone --nproc_per_node N``.
    Several nodes inside Slurm: ``srun`` starts one torchrun launcher per node (``--ntasks-per-node=1``), all
    meeting at ``MASTER_ADDR:MASTER_PORT`` through the c10d rendezvous. Several nodes outside Slurm: this node's
    launcher (``peer=True``: the line for the other nodes, which the user starts by hand); node 0 hosts the
    rendezvous store.
    """
    torchrun = [python, "-m", "torch.distributed.run"]
    if launch.nnodes == 1:
        if launch.nproc == 1:
            return [python]
        return [*torchrun, "--standalone", "--nproc_per_node", str(launch.nproc)]
    multi = [*torchrun, "--nnodes", str(launch.nnodes), "--nproc_per_node", str(launch.nproc),
             "--rdzv_backend", "c10d", "--rdzv_endpoint", f"{launch.master_addr}:{launch.master_port}",
             "--rdzv_id", launch.rdzv_id()]
    if launch.slurm:
        # every launcher runs the same line; the one on MASTER_ADDR hosts the store (torchrun matches host names)
        return ["srun", f"--nodes={launch.nnodes}", f"--ntasks={launch.nnodes}", "--ntasks-per-node=1",
                "--kill-on-bad-exit=1", *launch.srun_extra, *multi]
    host = not peer and launch.node_rank == 0
    return [*multi, "--rdzv_conf", f"is_host={'true' if host else 'false'}"]


def describe(launch: Launch) -> str:
    """One line for the driver's banner."""
    if launch.world_size == 1:
        return "one process"
    if launch.nnodes == 1:
        return f"torchrun, {launch.nproc} processes on this node"
    how = "srun, one launcher per node" if launch.slurm else "by hand: start each step's .peer.cmd on the other nodes"
    return (f"torchrun on {launch.nnodes} nodes x {launch.nproc} processes = {launch.world_size} ranks, rendezvous "
            f"{launch.master_addr}:{launch.master_port} ({how})")


def shell_assignments(launch: Launch, python: str) -> str:
    """Bash lines for ``run_repair.sh``: the LAUNCH and LAUNCH_PEER arrays and the resolved settings."""
    def array(words: Sequence[str]) -> str:
        return "(" + " ".join(shlex.quote(w) for w in words) + ")"

    peer = launch_prefix(launch, python, peer=True) if launch.nnodes > 1 and not launch.slurm else []
    return (f"LAUNCH={array(launch_prefix(launch, python))}\nLAUNCH_PEER={array(peer)}\n"
            f"NNODES={launch.nnodes}\nNODE_RANK={launch.node_rank}\nMASTER_ADDR={shlex.quote(launch.master_addr)}\n"
            f"MASTER_PORT={launch.master_port}\nLAUNCH_TEXT={shlex.quote(describe(launch))}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m repair.driver.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("shell", "prefix"),
                   help="shell: bash assignments for run_repair.sh; prefix: the launch words, one line")
    p.add_argument("--python", default=sys.executable, help="interpreter of the launched scripts")
    p.add_argument("--peer", action="store_true", help="prefix: the line for the other nodes (outside Slurm)")
    args = p.parse_args(argv)
    try:
        launch = resolve_launch(os.environ)
    except LaunchError as exc:
        print(f"launch settings: {exc}", file=sys.stderr)
        return 2
    if args.action == "shell":
        sys.stdout.write(shell_assignments(launch, args.python))
    else:
        print(shlex.join(launch_prefix(launch, args.python, peer=args.peer)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
