"""The driver's Stage II: 05 -> 06 rounds until the run has its valid tuples or runs out of rounds.

Round ``r`` asks 05 for ``r x gen_round`` queries in all (the file grows by one round's worth, ids stable) and 06
verifies the new ones (``--resume``), until :func:`repair.expansion.verification.count_valid` reaches ``target_valid``
(VALID_FACTOR x |T0|) or ``max_rounds`` rounds have run. Each 05 and each 06 is a driver step
(:class:`repair.driver.steps.StepRunner`: ``iter{k}.05_generate.r{r}``, ``iter{k}.06_verify.r{r}``, their ``.cmd``
files, logs and markers), so a killed run resumes the unfinished round and a finished one is skipped; the whole
stage's marker ``iter{k}.expansion.done`` holds the number of valid tuples.

The driver's settings map to the steps' flags here, not in shell: SOURCE (local | semantic_scholar | elsevier,
with LOCAL_CORPUS, or LITERATURE_INDEX (issue 41: an on-disk index) in its place, or the key files), QUERY_FORM (``generated`` -> 06 ``--query_form generated``; ``t0`` is a step
after this one), EXPANSION=0 (skip), FORCE=1 (start the stage over), JUDGE=1 (issue 30: after each 06, step
``iter{k}.06d_judge.r{r}`` judges the whole expansion file into ``judged_jsonl``, its judgments cached so each round
computes only the new tuples', and the rounds count the judged tuples that were kept), HARD_TUPLES=1 (issue 43: after
each 06 (and 06d), step ``iter{k}.06e_hard.r{r}`` scores the whole file with the current retriever into ``hard_jsonl``,
the embedding cache making each round forward only the new texts; with HARD_TARGET > 0 the rounds go on until that
many hard tuples, else until TARGET_VALID verified ones as without it). Each round's counts (generated, verified,
hard) are appended to ``<out_jsonl>.funnel.jsonl``. Separate from 05 and 06 themselves
(:mod:`repair.expansion.query_generation`, :mod:`repair.expansion.verification`): this module only decides what runs next.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from repair.data import iter_jsonl, write_jsonl
from repair.driver.steps import StepRunner, say, step_outputs, write_outputs
from repair.expansion.verification import count_valid

SOURCES = ("local", "semantic_scholar", "elsevier")
GENERATE_SCRIPT = "05_query_generation.py"
JUDGE_SCRIPT = "06d_judge_relevance.py"
HARD_SCRIPT = Path("differentiation") / "06e_hard_tuples.py"  # a Stage III idea on Stage II's output: its folder
SOURCE_SCRIPTS = {"local": "06_local_corpus.py", "semantic_scholar": "06_semantic_scholar.py",
                  "elsevier": "06_elsevier.py"}


@dataclass
class ExpansionRounds:
    """One iteration's Stage II, as the driver configures it (paths and settings, no defaults of its own)."""

    iteration: str  # "iter1": the prefix of the step names and of the stage marker
    concept_txt: Path
    generated_jsonl: Path
    out_jsonl: Path
    gen_round: int
    max_rounds: int
    target_valid: int
    target_k: int
    seed: int
    grounding: str
    query_form: str  # the driver's QUERY_FORM: title | generated | t0
    source: str  # the driver's SOURCE
    local_corpus: str = ""
    literature_index: str = ""  # LITERATURE_INDEX: 06 searches this built index instead of local_corpus
    s2_key_file: str = ""
    elsevier_key_file: str = ""
    generator_flags: list[str] = field(default_factory=list)  # 05's --backend/--model/--adapter/--openai_url
    device: str = ""
    judged_jsonl: Path | None = None  # JUDGE=1: 06d's output (the tuples Stage III reads); None = no judge
    judge_args: str = ""  # 06d's flags (shell words): backend, model, threshold, judge_k, cache
    hard_jsonl: Path | None = None  # HARD_TUPLES=1: 06e's output (the tuples Stage III reads); None = no selection
    hard_args: str = ""  # 06e's flags (shell words): retriever, margin, budget, guards, cache
    hard_target: int = 0  # HARD_TARGET: hard tuples the rounds go on for (0: count verified ones, target_valid)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"SOURCE must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.max_rounds < 1 or self.gen_round < 1:
            raise ValueError(f"MAX_ROUNDS and GEN_ROUND must be at least 1, got {self.max_rounds} and {self.gen_round}")

    def generate_command(self, python: str, scripts: Path, round_no: int) -> list[str]:
        """05 for round ``round_no`` (1-based): ``round_no x gen_round`` queries in the file, resumed when it exists."""
        cmd = [python, str(scripts / GENERATE_SCRIPT), "--concept_txt", str(self.concept_txt), "--out_jsonl",
               str(self.generated_jsonl), "--num_queries", str(round_no * self.gen_round), "--seed", str(self.seed),
               "--grounding", self.grounding, *self.generator_flags]
        if self.generated_jsonl.exists():
            cmd.append("--resume")
        if self.device:
            cmd += ["--device", self.device]
        return cmd

    def verify_command(self, python: str, scripts: Path) -> list[str]:
        """06 through SOURCE (its corpus or key file), on everything 05 wrote so far, resumed when it exists."""
        cmd = [python, str(scripts / SOURCE_SCRIPTS[self.source])]
        if self.source == "local":
            cmd += ["--corpus", self.literature_index or self.local_corpus]
        key_file = {"semantic_scholar": self.s2_key_file, "elsevier": self.elsevier_key_file}.get(self.source)
        if key_file:
            cmd += ["--key_file", key_file]
        cmd += ["--generated_jsonl", str(self.generated_jsonl), "--out_jsonl", str(self.out_jsonl), "--target_k",
                str(self.target_k), "--target_valid", str(self.target_valid)]
        if self.out_jsonl.exists():
            cmd.append("--resume")
        if self.query_form == "generated":
            cmd += ["--query_form", "generated"]
        if self.hard_jsonl:  # 06e's lexical-tie guard compares the source's scores of d+ and the preferred hit
            cmd.append("--candidate_scores")
        return cmd

    def judge_command(self, python: str, scripts: Path) -> list[str]:
        """06d on everything 06 verified so far (earlier rounds' judgments come from its cache)."""
        cmd = [python, str(scripts / JUDGE_SCRIPT), "--input_jsonl", str(self.out_jsonl), "--out_jsonl",
               str(self.judged_jsonl), *shlex.split(self.judge_args)]
        if self.device:
            cmd += ["--device", self.device]
        return cmd

    def hard_command(self, python: str, scripts: Path) -> list[str]:
        """06e on everything verified (and judged) so far: the retriever's hard tuples of the whole file."""
        return [python, str(scripts.parent / HARD_SCRIPT), "--input_jsonl", str(self.judged_jsonl or self.out_jsonl),
                "--output_jsonl", str(self.hard_jsonl), *shlex.split(self.hard_args)]

    def counted_jsonl(self) -> Path:
        """The file whose tuples count towards the target: 06e's with HARD_TARGET, 06d's when judging, else 06's."""
        if self.hard_jsonl and self.hard_target:
            return self.hard_jsonl
        return self.judged_jsonl or self.out_jsonl

    def target(self) -> int:
        return self.hard_target if self.hard_jsonl and self.hard_target else self.target_valid

    def funnel_jsonl(self) -> Path:
        """One line per round: what it generated, verified, judged and found hard (issue 43's funnel)."""
        return self.out_jsonl.with_name(self.out_jsonl.name + ".funnel.jsonl")

    def outputs(self) -> list[Path]:
        """The stage's files (05's and 06's, with their rounds and status files), what FORCE=1 removes."""
        found: list[Path] = []
        for path in (self.generated_jsonl, self.out_jsonl, *([self.judged_jsonl] if self.judged_jsonl else []),
                     *([self.hard_jsonl] if self.hard_jsonl else [])):
            found += sorted(path.parent.glob(f"{_glob_escape(path.name)}*"))
        return found


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def run_expansion_rounds(stage: ExpansionRounds, runner: StepRunner, *, python: str, scripts: Path,
                         enabled: bool = True) -> int | None:
    """Run (or skip) the stage; return the valid tuples it ended with, None when ``enabled`` is false.

    Raises :class:`repair.driver.steps.StepFailed` when a step fails (the driver stops; a rerun resumes there).
    """
    if not enabled:
        say(f"skip  {stage.iteration}.expansion (EXPANSION=0)")
        return None
    marker = runner.marker(f"{stage.iteration}.expansion")
    if marker.exists() and not runner.force:
        valid_text = marker.read_text().strip()
        say(f"skip  {stage.iteration}.expansion (done: {valid_text} valid tuples)")
        return int(valid_text)
    if runner.force:  # also after a killed attempt (no marker): FORCE never resumes its files (issue 44)
        for path in stage.outputs():
            if path.is_file():
                path.unlink()
    valid = round_no = 0
    for round_no in range(1, stage.max_rounds + 1):
        runner.run(f"{stage.iteration}.05_generate.r{round_no}", stage.generate_command(python, scripts, round_no))
        runner.run(f"{stage.iteration}.06_verify.r{round_no}", stage.verify_command(python, scripts))
        if stage.judged_jsonl:
            runner.run(f"{stage.iteration}.06d_judge.r{round_no}", stage.judge_command(python, scripts))
        if stage.hard_jsonl:
            runner.run(f"{stage.iteration}.06e_hard.r{round_no}", stage.hard_command(python, scripts))
        # the counts the round had when its steps ran (a resumed run's skipped rounds say what they said then)
        funnel = round_funnel(stage, round_no)
        what = "hard" if stage.counted_jsonl() == stage.hard_jsonl else "valid"
        valid = funnel["hard" if what == "hard" else "judged_kept" if stage.judged_jsonl else "verified"]
        say(f"expansion round {round_no}: {valid} / {stage.target()} {what} tuples"
            + (f" ({funnel['verified']} verified, {funnel['hard']} hard)" if stage.hard_jsonl else ""))
        if valid >= stage.target():
            break
    if valid < stage.target():
        say(f"expansion stopped at the round limit ({stage.max_rounds}): {valid} / {stage.target()} {what} tuples; "
            "the run goes on with")
        say("  these (more: raise MAX_ROUNDS or GEN_ROUND, or use a stronger generator; see docs/expansion.md)")
    # the stage's record (repair.driver.steps): the union of its rounds' step records, as a reused stage takes them
    # all, and the funnel, which the driver (not a step) writes between rounds
    steps = ("05_generate", "06_verify", *(("06d_judge",) if stage.judged_jsonl else ()),
             *(("06e_hard",) if stage.hard_jsonl else ()))
    rounds = [f"{stage.iteration}.{step}.r{r}" for r in range(1, round_no + 1) for step in steps]
    recorded = {f for name in rounds for f in (step_outputs(runner.state_dir, name) or [])}
    funnel = stage.funnel_jsonl().resolve()
    run_dir = Path(runner.state_dir).resolve().parent
    if funnel.exists() and funnel.is_relative_to(run_dir):
        recorded.add(str(funnel.relative_to(run_dir)))
    write_outputs(runner.state_dir, f"{stage.iteration}.expansion", sorted(recorded))
    marker.write_text(f"{valid}\n")
    return valid


def round_funnel(stage: ExpansionRounds, round_no: int) -> dict:
    """Round ``round_no``'s counts, appended to the funnel file after its last step; a rerun that skipped the round's
    steps keeps the line written when they ran (the files have grown since), so each line says what its round had."""
    path = stage.funnel_jsonl()
    earlier = list(iter_jsonl(path)) if path.exists() else []
    recorded = next((r for r in earlier if r.get("round") == round_no), None)
    if recorded is not None:
        return recorded
    generated = sum(1 for _ in iter_jsonl(stage.generated_jsonl)) if stage.generated_jsonl.exists() else 0
    line = {"round": round_no, "generated": generated, "verified": count_valid(stage.out_jsonl)}
    if stage.judged_jsonl:
        line["judged_kept"] = count_valid(stage.judged_jsonl)
    if stage.hard_jsonl:
        line["hard"] = count_valid(stage.hard_jsonl)
    write_jsonl(path, [*earlier, line])
    return line
