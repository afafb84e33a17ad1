"""A step of ``run_repair.sh`` run from Python, with the shell's ``step()`` contract: marker, ``.cmd``, log, console.

A step named ``N`` is skipped when ``$STATE/N.done`` exists (unless ``FORCE=1``); otherwise its command line goes
to ``$LOGS/N.cmd`` (so a user can rerun it by hand), every output line to ``$LOGS/N.log``, and the console shows
the same lines, a stage's one-line JSON summary shortened by :func:`repair.report.relay_step_output`. A finished
step writes its seconds into the marker; a failed one prints where its log and command are and stops the caller
(:class:`StepFailed`). A killed step leaves no marker, so the next run redoes it.

Separate from the stages it runs: this is driver bookkeeping, shared by every part of the driver written in
Python (the Stage II rounds, :mod:`repair.expansion_rounds`), so the console and ``$OUT_DIR/logs`` read the same
whichever language started the step.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .report import relay_step_output


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
