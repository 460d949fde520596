"""Plans of shell commands (gcloud, kubectl) that a reader can read, dry-run, run and resume.

    plan = [Step("Create the repository", ("gcloud", "artifacts", "repositories", "create", ...),
                 exists=("gcloud", "artifacts", "repositories", "describe", ...)), ...]
    dry_run(plan)                 # prints every command exactly as it would run
    run_plan(plan)                # runs them in order; a step whose `exists` command succeeds
                                  # is skipped, so running a plan twice creates nothing twice
    run_plan(plan, start=7)       # resume at the step that failed (StepFailed.number says which)

A step is an argv list, never a shell string: nothing is re-parsed by a shell, so a name cannot
become a command. A `check` step runs a read-only command and judges its output; a problem
stops the plan before anything that depends on it is created.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

STEP_TIMEOUT_S = 3 * 3600  # the longest step (a cluster or an image build) takes ~30 min
RETRY_EVERY_S = 15.0  # a check step with retry_s asks again this often


@dataclass(frozen=True)
class Owner:
    """A read-only command that prints the label the plan puts on what it creates, and the
    value that means "this plan made it". A same-named thing with another value (or none) was
    there before: create stops rather than adopt it, teardown keeps it."""

    argv: tuple[str, ...]
    value: str
    # What to do where the plan itself may have left it unlabelled (empty: nothing to add).
    unlabelled: str = ""


@dataclass(frozen=True)
class Step:
    """One command of a plan.

    teardown: the command that undoes what it creates (None: nothing to undo).
    exists: a read-only command that succeeds and prints something when what this step
    creates is there already; the step is then skipped (describe before create).
    check: for read-only steps, a function from the command's output to a list of problems,
    each naming its fix; any problem stops the plan.
    retry_s: for a check of something that appears by itself (an add-on still rolling out
    after the cluster's create returned), how long to keep asking before judging.
    owner: whether what `exists` found, or what the teardown would delete, is this plan's.
    needs: teardown only: a command run first (fetching the cluster's credentials); when what
    it names is gone, this undo is done (what it deletes went with it).
    leftovers: teardown only, after every undo: a command listing what this step's resources
    leave behind that bills (one per line), and a function from a line to the delete of it.
    each: the teardown's own steps: run for every line `argv` printed (from `leftovers`).
    matches: create only, when `exists` found this plan's own: a read-only command describing
    it, and a function from that output to how it differs from this step (each naming the
    command that replaces it); any difference stops the plan instead of the skip (a rerun
    with another shape, or what a failed create left behind).
    """

    title: str
    argv: tuple[str, ...]
    why: str = ""
    teardown: tuple[str, ...] | None = None
    exists: tuple[str, ...] | None = None
    check: Callable[[str], list[str]] | None = None
    retry_s: float = 0.0  # a check step: asked again every RETRY_EVERY_S for this long
    owner: Owner | None = None
    needs: tuple[str, ...] | None = None
    leftovers: tuple[tuple[str, ...], Callable[[str], tuple[str, ...]]] | None = None
    each: Callable[[str], tuple[str, ...]] | None = None
    matches: tuple[tuple[str, ...], Callable[[str], list[str]]] | None = None

    def __str__(self) -> str:
        return shlex.join(self.argv)


def dry_run(plan: Sequence[Step], out: Callable[[str], None] = print, explain: bool = True,
            start: int = 1, checks: bool = True) -> None:
    """Print every step's command exactly as run_plan would run it (copy-pasteable), numbered
    as in the whole plan; with explain, why; with checks, what it runs first (the describe
    that skips it, the owner check) and after (a command per line a step prints)."""
    for i, step in enumerate(plan[start - 1:], start):
        out(f"# {i}. {step.title}")
        if explain and step.why:
            out(f"#    {step.why}")
        if not checks:
            out(str(step))
            continue
        if step.exists:
            out(f"#    skipped when this prints something: {shlex.join(step.exists)}")
        if step.needs:
            out(f"#    first: {shlex.join(step.needs)} (if what it names is gone, this undo is done)")
        if step.owner:
            out(f"#    only if this prints {step.owner.value}: {shlex.join(step.owner.argv)}")
        if step.matches:
            out(f"#    when found, compared with this plan (a pool of another shape or state "
                f"stops the plan): {shlex.join(step.matches[0])}")
        out(str(step))
        if step.each:
            out(f"#    then for each line it prints: {shlex.join(step.each('NAME ZONE'))}")


class StepFailed(RuntimeError):
    """A command of the plan failed, or a check found problems; later steps did not run.

    number: the step's 1-based position in the plan, where `run_plan(plan, start=number)`
    resumes once the cause is fixed."""

    def __init__(self, step: Step, number: int, returncode: int, stderr: str,
                 problems: Sequence[str] = ()):
        self.step, self.number, self.returncode, self.stderr = step, number, returncode, stderr
        self.problems = list(problems)
        if self.problems:
            what = "found problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        else:
            what = f"failed with exit code {returncode}\nstderr:\n{stderr.strip() or '(empty)'}"
        super().__init__(f"step {number} {step.title!r} {what}\ncommand: {step}\n"
                         f"Fix the cause, then resume at this step: run_plan(plan, "
                         f"start={number}) (steps that created something are skipped anyway)")


def run_plan(plan: Sequence[Step], out: Callable[[str], None] = print, start: int = 1,
             timeout_s: float = STEP_TIMEOUT_S) -> None:
    """Run the steps from `start` (1-based) in order, streaming their output; skip a step
    whose `exists` command succeeds with output; stop at the first failure (StepFailed)."""
    if not (isinstance(start, int) and 1 <= start <= max(len(plan), 1)):
        raise ValueError(f"start={start!r}: expected a step number from 1 to {len(plan)}")
    for i, step in enumerate(plan[start - 1:], start):
        out(f"# {i}/{len(plan)}. {step.title}")
        if step.exists and _found(step.exists, timeout_s):
            if step.owner and (problem := _not_ours(step.owner, timeout_s)):
                raise StepFailed(step, i, 0, "", [
                    f"{problem}: it was there before this plan. Delete it, or choose another "
                    "prefix (GkeSettings.prefix), so that neither create nor teardown touches it"
                    + (f". {step.owner.unlabelled}" if step.owner.unlabelled else "")])
            if step.matches:
                code, described, err = capture_all(step.matches[0], timeout_s)
                differs = (step.matches[1](described) if code == 0 else
                           [f"`{shlex.join(step.matches[0])}` failed: {err.strip()[-300:]}"])
                if differs:
                    raise StepFailed(step, i, 0, "", differs)
            out(f"already there ({shlex.join(step.exists)} found it): skipped")
            continue
        out(f"$ {step}")
        deadline = time.monotonic() + step.retry_s
        while True:
            returncode, stdout, stderr = _stream(step.argv, out, timeout_s)
            problems = [] if returncode != 0 or step.check is None else step.check(stdout)
            if (returncode == 0 and not problems) or time.monotonic() >= deadline:
                break
            out(f"not yet ({problems[0] if problems else f'exit code {returncode}'}); asking "
                f"again in {RETRY_EVERY_S:g} s, for up to {deadline - time.monotonic():.0f} s")
            time.sleep(min(RETRY_EVERY_S, max(0.0, deadline - time.monotonic())))
        if returncode != 0:
            raise StepFailed(step, i, returncode, stderr)
        if problems:
            raise StepFailed(step, i, 0, stderr, problems)
        if step.check is not None:
            out("check passed")


class TeardownIncomplete(RuntimeError):
    """Some undo steps failed (not because what they delete was already gone); every other
    step ran. failures: (step, exit code, stderr) of each."""

    def __init__(self, failures: Sequence[tuple[Step, int, str]]):
        self.failures = list(failures)
        lines = [f"  - {step.title}: exit code {code}: {(err.strip().splitlines() or ['?'])[-1]}"
                 f"\n    command: {step}" for step, code, err in self.failures]
        super().__init__(f"{len(self.failures)} undo step(s) failed; everything else was "
                         "deleted or already gone. Fix the cause and run the teardown again "
                         "(what is gone counts as done):\n" + "\n".join(lines))


# What gcloud and kubectl say when what a delete names is not there: the undo is done already.
# gcloud: "NOT_FOUND" (API status), "was not found", "not found" (e.g. remove-iam-policy-binding:
# "Policy binding with the specified principal, role, and condition not found!"); kubectl:
# "(NotFound)".
ALREADY_GONE = re.compile(r"NOT_FOUND|NotFound|not found", re.IGNORECASE)
# ... but not a tool that is missing: "gke-gcloud-auth-plugin not found" (kubectl without its
# credential plugin), "command not found", Go's "executable file not found in $PATH". The undo
# did not run, and what it deletes may still bill.
TOOL_MISSING = re.compile(r"gcloud-auth-plugin|command not found|executable file not found",
                          re.IGNORECASE)


def already_gone(*texts: str) -> bool:
    """Whether a command's output says that what it names is not there (not that a tool is)."""
    return any(ALREADY_GONE.search(t) and not TOOL_MISSING.search(t) for t in texts)


def run_teardown(plan: Sequence[Step], out: Callable[[str], None] = print,
                 timeout_s: float = STEP_TIMEOUT_S) -> None:
    """Run every step of a teardown plan (teardown_plan()), whatever the ones before did: a
    step whose target is already gone counts as done, any other failure is reported at the
    end (TeardownIncomplete), after the later steps have run. A partial create leaves the
    most expensive things (the cluster, the GPU pool) for the last steps, which must run."""
    failures, kept = [], []
    for i, step in enumerate(plan, 1):
        out(f"# {i}/{len(plan)}. {step.title}")
        if step.needs:
            code, _, err = capture_all(step.needs, timeout_s)
            if code != 0:
                if already_gone(err):
                    out(f"gone with what {shlex.join(step.needs)} names: done")
                else:
                    failures.append((step, code, f"{shlex.join(step.needs)}: {err.strip()}"))
                continue
            if shutil.which(step.argv[0]) is None:
                out(f"{step.argv[0]} is not on PATH: skipped; what it would delete is inside "
                    "the cluster, which a later step deletes")
                continue
        if step.owner:
            code, value, err = capture_all(step.owner.argv, timeout_s)
            if code != 0 and already_gone(err):
                out("already gone: done")
                continue
            if code != 0:
                failures.append((step, code, f"{shlex.join(step.owner.argv)}: {err.strip()}"))
                continue
            if value.strip() != step.owner.value:
                out(f"kept: its label says {value.strip() or 'nothing'}, not "
                    f"{step.owner.value}: this plan did not make it")
                kept.append(step)
                continue
        out(f"$ {step}")
        returncode, stdout, stderr = _stream(step.argv, out, timeout_s)
        listed = [line for line in stdout.splitlines() if line.strip()]
        for line in listed if returncode == 0 and step.each else ():
            argv = step.each(line)
            out(f"$ {shlex.join(argv)}")
            code, _, err = _stream(argv, out, timeout_s)
            if code != 0 and not already_gone(err):
                failures.append((dataclasses.replace(step, argv=argv), code, err.strip()))
        if returncode == 0:
            continue
        if already_gone(stderr, stdout):
            out("already gone: done")
            continue
        out(f"failed (exit code {returncode}); going on with the rest")
        failures.append((step, returncode, stderr.strip() or stdout))
    if kept:
        out(f"kept {len(kept)} thing(s) of the same name that this plan did not make: "
            + "; ".join(step.title.removeprefix("Undo: ") for step in kept))
    if failures:
        raise TeardownIncomplete(failures)


def _not_ours(owner: Owner, timeout_s: float) -> str | None:
    """Why what owner.argv describes is not this plan's (None: it is)."""
    code, value, err = capture_all(owner.argv, timeout_s)
    if code == 0 and value.strip() == owner.value:
        return None
    said = value.strip() if code == 0 else f"exit code {code}: {err.strip()[-200:]}"
    return (f"its label, read by `{shlex.join(owner.argv)}`, is {said or 'empty'}, not "
            f"{owner.value}")


def capture(argv: Sequence[str], timeout_s: float = 120.0) -> tuple[int, str]:
    """(exit code, stdout) of a read-only command; 127 when it is not on PATH, 124 on timeout."""
    code, stdout, _ = capture_all(argv, timeout_s)
    return code, stdout


def capture_all(argv: Sequence[str], timeout_s: float = 120.0) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a read-only command; 127 when it is not on PATH, 124 on
    timeout."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: command not found on PATH"
    except subprocess.TimeoutExpired:
        return 124, "", f"no answer in {timeout_s:.0f} s"
    return proc.returncode, proc.stdout, proc.stderr


def _found(argv: Sequence[str], timeout_s: float) -> bool:
    """Whether a describe finds it: it succeeds and prints something (a describe whose format
    names a field inside a resource prints nothing when only the field is missing)."""
    code, stdout = capture(argv, timeout_s)
    return code == 0 and bool(stdout.strip())


def _stream(argv: Sequence[str], out: Callable[[str], None],
            timeout_s: float) -> tuple[int, str, str]:
    """Run argv, passing each output line to `out` as it comes; returns (code, stdout, stderr)."""
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, bufsize=1)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: command not found on PATH"
    out_lines: list[str] = []
    err_lines: list[str] = []

    def pump_stderr():
        for line in proc.stderr:
            err_lines.append(line)
            out(line.rstrip("\n"))

    pump = threading.Thread(target=pump_stderr, daemon=True)
    pump.start()
    timer = threading.Timer(timeout_s, proc.kill)  # nothing waits forever
    timer.start()
    try:
        for line in proc.stdout:
            out_lines.append(line)
            out(line.rstrip("\n"))
        code = proc.wait()
    finally:
        timer.cancel()
    pump.join(10)
    if code < 0 and not err_lines:
        err_lines.append(f"killed after {timeout_s:.0f} s (the step's time limit)\n")
    return code, "".join(out_lines), "".join(err_lines)
