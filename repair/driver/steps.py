"""A step of ``run_repair.sh`` run from Python, with the shell's ``step()`` contract: marker, ``.cmd``, log, console.

A step named ``N`` is skipped when ``$STATE/N.done`` exists (unless ``FORCE=1``); otherwise its command line goes
to ``$LOGS/N.cmd`` (so a user can rerun it by hand), every output line to ``$LOGS/N.log``, and the console shows
the same lines, a stage's one-line JSON summary shortened by :func:`repair.evaluation.report.relay_step_output`. A finished
step writes its seconds into the marker; a failed one prints where its log and command are and stops the caller
(:class:`StepFailed`). A killed step leaves no marker, so the next run redoes it.

Each finished step also leaves ``$STATE/N.outputs``: the files under ``$OUT_DIR`` it wrote (one path per line,
relative to ``$OUT_DIR``), found as the files changed since the step first started (``$STATE/N.started``, kept
across a killed attempt so a resumed step lists what the first attempt wrote too). A tool that reuses a run's
steps (the quality study) copies exactly those files with the marker, without knowing where each stage writes.

``FORCE=1`` starts the run folder over before its first step (:func:`clear_run`, issue 44): every marker and every
step output goes, so no step resumes or skips on what a run with other settings left, and a FORCE run killed midway
resumes (without FORCE) from its own outputs only. The settings record, the logs and the content-keyed caches stay.

Separate from the stages it runs: this is driver bookkeeping, shared by every part of the driver written in
Python (the Stage II rounds, :mod:`repair.driver.expansion_rounds`), so the console and ``$OUT_DIR/logs`` read the same
whichever language started the step.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from repair.evaluation.report import relay_step_output

# $OUT_DIR's folders no step output lives in: the markers, the logs, and the shared embedding cache
NOT_OUTPUTS = (".state", "logs", "cache")
# what FORCE=1 removes from $OUT_DIR (every folder or file a step or the report writes): iteration folders are
# matched by RUN_ITERATION, the rest by name. Not removed: settings.json (already the new record), logs/ (history)
# and cache/ (keyed by content: an embedding by the adapter's bytes, a judgment by the judge model and prompt)
RUN_ITERATION = re.compile(r"iter\d+")
RUN_OUTPUTS = ("t0_negatives", "report.md", "report.json", "margins.png", "triplet_scores.png", "train_loss.png")


class StepFailed(RuntimeError):
    """A step's command exited non-zero; its log and command were already printed."""


def say(message: str) -> None:
    """One console line as the driver writes it: ``[repair HH:MM:SS] message``."""
    print(f"[repair {time.strftime('%H:%M:%S')}] {message}", flush=True)


def command_line(cmd: Sequence[str]) -> str:
    """The ``.cmd`` file's text: each word shell-quoted and followed by a space, then a newline (bash's
    ``printf '%q '`` for the words a driver passes: paths, numbers, flags)."""
    return "".join(shlex.quote(str(word)) + " " for word in cmd) + "\n"


@dataclass
class StepRunner:
    """Runs steps the way ``run_repair.sh``'s ``step()`` does."""

    state_dir: Path
    logs_dir: Path
    force: bool = False

    def marker(self, name: str) -> Path:
        return Path(self.state_dir) / f"{name}.done"

    def run(self, name: str, cmd: Sequence[str]) -> None:
        """Run ``cmd`` as step ``name`` (skipped when done); raise :class:`StepFailed` when it fails."""
        marker, log = self.marker(name), Path(self.logs_dir) / f"{name}.log"
        if marker.exists() and not self.force:
            say(f"skip  {name} (done)")
            return
        marker.unlink(missing_ok=True)
        begin_outputs(self.state_dir, name, fresh=self.force)
        cmd_file = Path(self.logs_dir) / f"{name}.cmd"
        cmd_file.write_text(command_line(cmd))
        say(f"start {name}  (log: {log})")
        start = time.monotonic()
        if _run_logged(name, [str(word) for word in cmd], log) != 0:
            say(f"FAILED step '{name}'")
            say(f"  log:   {log}")
            say(f"  rerun: {cmd_file.read_text().rstrip(chr(10))}")
            say("  (or rerun the driver: finished steps are skipped, this one resumes)")
            raise StepFailed(name)
        seconds = int(time.monotonic() - start)
        record_outputs(self.state_dir, name)  # before the marker: a done step always has its record
        marker.write_text(f"{seconds}\n")
        say(f"done  {name} in {seconds} s")


def _run_logged(name: str, cmd: list[str], log: Path) -> int:
    """``cmd 2>&1 | tee -a log | console relay``; non-zero when the command or tee failed (bash's pipefail)."""
    sys.stdout.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    tee = subprocess.Popen(["tee", "-a", str(log)], stdin=proc.stdout, stdout=subprocess.PIPE)
    assert proc.stdout is not None and tee.stdout is not None
    proc.stdout.close()  # tee holds the pipe now: the command gets SIGPIPE if tee dies
    try:
        relay_step_output(name, tee.stdout, sys.stdout.buffer)
    finally:
        tee.stdout.close()
        status, tee_status = proc.wait(), tee.wait()
    return status or tee_status


def clear_run(out_dir: str | os.PathLike) -> list[str]:
    """FORCE=1: remove the markers (``.state``) and every step output of the run folder ``out_dir``; returns the
    names removed. Why all at once, before any step: a step cleared only when the run reaches it leaves the later
    steps' markers and files of the old settings, which a FORCE run killed midway and then rerun plainly would skip
    or resume (a trained adapter with the old learning rate under a settings.json with the new one)."""
    out_dir = Path(out_dir)
    removed = []
    for path in sorted(out_dir.iterdir()) if out_dir.is_dir() else []:
        if path.name == ".state" or path.name in RUN_OUTPUTS or (path.is_dir() and RUN_ITERATION.fullmatch(path.name)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path.name)
    (out_dir / ".state").mkdir(parents=True, exist_ok=True)
    return removed


def begin_outputs(state_dir: str | Path, name: str, fresh: bool = False) -> None:
    """Stamp the first start of step ``name`` (kept when a killed attempt left it, unless ``fresh``: FORCE=1)."""
    stamp = Path(state_dir) / f"{name}.started"
    if fresh or not stamp.exists():
        stamp.write_text("")


def record_outputs(state_dir: str | Path, name: str) -> list[str]:
    """Write ``<name>.outputs``: the files under the run folder (``state_dir``'s parent) changed since the step's
    start stamp, outside :data:`NOT_OUTPUTS` and the folder's own top-level files (the driver's settings and
    report). Returns the relative paths. A step that wrote nothing new (its outputs already complete) lists nothing.
    Steps run one at a time in a run folder, so a file changed in the window is the step's.

    Strictly after the stamp: file times come from the kernel's coarse clock (a few ms per tick), so a file the
    driver wrote just before stamping (a Stage II round's funnel line) can carry the stamp's very time; counting it
    made the record depend on where a tick fell. The step's own command starts a process before it writes, so
    nothing of its own lands in the stamp's tick."""
    state_dir = Path(state_dir)
    root, stamp = state_dir.parent, state_dir / f"{name}.started"
    since = stamp.stat().st_mtime_ns if stamp.exists() else -1
    written = sorted(str(path.relative_to(root)) for path in root.rglob("*")
                     if path.is_file() and path.parent != root and path.relative_to(root).parts[0] not in NOT_OUTPUTS
                     and path.stat().st_mtime_ns > since)
    write_outputs(state_dir, name, written)
    stamp.unlink(missing_ok=True)
    return written


def write_outputs(state_dir: str | Path, name: str, paths: Sequence[str]) -> None:
    """The record itself (also for a step a tool fills in by copying, e.g. a reused evaluation)."""
    (Path(state_dir) / f"{name}.outputs").write_text("".join(f"{p}\n" for p in paths))


def step_outputs(state_dir: str | Path, name: str) -> list[str] | None:
    """The files step ``name`` wrote (relative to the run folder); None for a step run before records existed."""
    record = Path(state_dir) / f"{name}.outputs"
    return record.read_text().splitlines() if record.exists() else None


def _main(argv: list[str]) -> int:
    """``python -m repair.driver.steps begin|record STATE_DIR NAME [--fresh]`` (run_repair.sh's step() calls) and
    ``python -m repair.driver.steps clear OUT_DIR`` (FORCE=1)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m repair.driver.steps", description=_main.__doc__)
    p.add_argument("action", choices=("begin", "record", "clear"),
                   help="begin: stamp the step's start; record: list its files; clear: FORCE=1's start over")
    p.add_argument("state_dir", help="the driver's marker folder ($OUT_DIR/.state); clear: the run folder $OUT_DIR")
    p.add_argument("name", nargs="?", help="the step's name (iter1.08_hardneg); not for clear")
    p.add_argument("--fresh", action="store_true", help="begin: restamp even if a killed attempt left a stamp")
    args = p.parse_args(argv)
    if args.action == "clear":
        removed = clear_run(args.state_dir)
        say(f"FORCE=1: removed the earlier run's markers and outputs ({', '.join(removed) or 'none'})")
        return 0
    if not args.name:
        p.error(f"{args.action} needs the step's name")
    if args.action == "begin":
        begin_outputs(args.state_dir, args.name, fresh=args.fresh)
    else:
        record_outputs(args.state_dir, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
