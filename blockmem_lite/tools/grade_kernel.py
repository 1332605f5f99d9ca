"""Running one submitted notebook for the grader: cells in a sandboxed kernel, checks here.

``run_notebook`` runs the student's code cells one by one in a fresh kernel inside a
``Sandbox`` (tools/sandbox.py). At each check cell it runs nothing of the student's: the
check registered for that ``grade_id`` (``blockmem_lite.exercise_checks``) runs in this
process, with the grader's own kit and RNG, and reaches the student's answers through a
``KernelLink``: each call is a silent request to the kernel whose reply, data only
(``exercise_checks.wire``), is read back from a file of the sandbox's working folder. So
whatever a student's cell did to the kernel (IPython, builtins, torch, the import system),
the comparison, the expected values and the verdict are the grader's.

Each cell and check has its own time limit (``Timing``: by default measured on the teacher's
solution, with a margin). A cell or check that runs past it fails with the solution's time
beside its limit; its kernel is killed, a fresh sandbox runs the notebook's earlier cells
again (the cell that hung left out) and grading goes on with the next exercise.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from blockmem_lite import exercise_checks
from blockmem_lite.exercise_checks import wire
from blockmem_lite.exercise_checks.trial import AnswerFailed, GradedTrial
from blockmem_lite.tools.grade_report import shorten
from blockmem_lite.tools.sandbox import Limits, Sandbox

ERROR_CHARS = 300      # the most characters of what a student's code raised, in a message
MAX_REPLY_BYTES = 256 << 20
FLOOR_S, MARGIN = 30, 10  # a limit is FLOOR_S + MARGIN x the solution's time
PING_S = 15               # an idle kernel answers a ping at once; one that does not is broken


class Hung(Exception):
    """A cell or check ran past its time limit (its kernel is then killed)."""

    def __init__(self, limit: int):
        super().__init__(limit)
        self.limit = limit


class KernelDied(Exception):
    """The kernel died (a crash, ``os._exit``, out of memory), or stopped answering."""

    def __init__(self, message: str = "the kernel died (a crash, os._exit or out of memory?)"):
        super().__init__(message)


def one_line(text: str) -> str:
    return "; ".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


def cell_error(cell) -> str | None:
    """``Name: message`` of the error a code cell raised, None if it raised none."""
    for out in cell.get("outputs", []):
        if out.output_type == "error":
            return shorten(one_line(f"{out.ename}: {out.evalue}"), ERROR_CHARS)
    return None


def failed_reply(content: dict | None) -> str | None:
    """``Name: message`` when the kernel replied that the cell failed (an error whose
    output a handler hid, say); None when it replied ok."""
    if not content or content.get("status") == "ok":
        return None
    name, value = content.get("ename", "Error"), content.get("evalue", "")
    return shorten(one_line(f"{name}: {value}"), ERROR_CHARS) + \
        " (the kernel reported an error that showed no output)"


@dataclass(frozen=True)
class Timing:
    """Time limits in seconds: ``fixed`` for every cell when given (``--cell-timeout``),
    else from ``measured`` (cell id or grade_id -> the solution's seconds)."""

    fixed: int | None = None
    measured: dict[str, float] = field(default_factory=dict)

    def limit(self, key: str | None) -> int:
        if self.fixed is not None:
            return self.fixed
        seconds = self.measured.get(key) if key else None
        if seconds is None:          # a cell of the student's own: the longest the notebook has
            seconds = max(self.measured.values(), default=0.0)
        return math.ceil(FLOOR_S + MARGIN * seconds)

    def said(self, key: str | None, limit: int) -> str:
        """``timed out after 40 s (the solution took 1.0 s)``: a hang told from a slow answer."""
        took = self.measured.get(key) if key else None
        return f"timed out after {limit} s" + (
            f" (the teacher's solution took {took:.1f} s here)" if took is not None else "")


class KernelLink:
    """Requests to the graded kernel: ``send(request) -> value`` (``AnswerFailed`` for an
    error reply or a reply that is not data; ``Hung`` once all the requests of the check
    together take more than ``limit`` seconds)."""

    def __init__(self, client, work: Path, limit: int):
        self.client, self.work, self.limit, self.count = client, work, limit, 0
        self.deadline = time.monotonic() + limit       # for all the requests of one check

    def ping(self) -> None:
        """``KernelDied`` unless the kernel still runs requests: a student's cell may have
        broken its execute path, and then every check would wait out its whole limit."""
        try:
            answered = self.send({"kind": "ping"}, wait=min(PING_S, self.limit)) == "pong"
        except (Hung, AnswerFailed):
            answered = False
        if not answered:
            raise KernelDied("the kernel no longer runs requests (was its execute path "
                             "changed?); the checks from here on are not run")

    def send(self, request: dict, wait: int | None = None):
        left = math.ceil(self.deadline - time.monotonic())
        left = left if wait is None else min(left, wait)
        if left < 1:
            raise Hung(self.limit)
        self.count += 1
        reply = self.work / f".check-reply-{self.count}.json"
        code = ("__import__('blockmem_lite.exercise_checks.student_side', fromlist=['serve'])"
                f".serve({wire.encode(request)!r}, {str(reply)!r})")
        msg_id = self.client.kc.execute(code, silent=True, store_history=False)
        _wait(self.client, msg_id, left, self.limit)
        try:
            value = wire.decode(_read_reply(reply))
        except wire.WireError as err:
            raise AnswerFailed(shorten(f"the kernel's reply is not data: {err}", ERROR_CHARS)) \
                from None
        if not isinstance(value, dict) or not ({"ok", "error"} & set(value)):
            raise AnswerFailed("the kernel's reply is not one a check sends")
        if "error" in value:
            text = one_line(str(value["error"]))
            kind = text.split(":", 1)[0]
            raise AnswerFailed(shorten(text, ERROR_CHARS),
                               kind if kind.isidentifier() else "AnswerFailed")
        return value["ok"]


def _read_reply(path: Path) -> str:
    """The reply file's text: a regular file, never followed through a link, size-limited."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise AnswerFailed("the kernel wrote no reply (its answer never ran?)") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_REPLY_BYTES:
            raise AnswerFailed("the kernel's reply is not a regular file of a reply's size")
        data = file.read(MAX_REPLY_BYTES + 1)
    path.unlink(missing_ok=True)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AnswerFailed("the kernel's reply is not text") from None


def _wait(client, msg_id: str, seconds: int, limit: int) -> dict:
    """The shell reply to ``msg_id``; ``Hung`` (the check's ``limit``) after ``seconds``,
    ``KernelDied`` if the kernel dies."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    client.timeout = seconds
    try:
        reply = client.wait_for_reply(msg_id, nbformat.v4.new_code_cell("(a check)"))
    except CellTimeoutError:
        raise Hung(limit) from None
    except DeadKernelError:
        raise KernelDied() from None
    return reply or {}


def check_seed(class_seed: int, student: str, grade_id: str) -> int:
    """The seed of one check for one student: the same whenever the class seed is."""
    import hashlib

    text = f"{class_seed}/{student}/{grade_id}".encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


def run_graded_check(check, link: KernelLink, seed: int) -> tuple[str, str] | None:
    """Run ``check`` here against the kernel's answers: None when it passes, else (the kind
    of failure: CheckFailed, or what the answer raised, ..., the message). What the check
    prints (its OK lines) is not shown."""
    import torch

    trial = GradedTrial(check, link.send, seed)
    with contextlib.redirect_stdout(io.StringIO()), torch.random.fork_rng():
        torch.manual_seed(seed)
        try:
            check.body(trial)
        except (Hung, KernelDied):
            raise
        except Exception as err:  # noqa: BLE001  a check's failure, or the answer's error
            if isinstance(err, AnswerFailed):       # the message names the call and its error
                return err.kind, shorten(one_line(str(err)), ERROR_CHARS)
            return type(err).__name__, shorten(one_line(f"{type(err).__name__}: {err}"),
                                               ERROR_CHARS)
    return None


@dataclass
class Graded:
    """What running one notebook gave: errors by cell index (check cells hold the check's
    verdict), where it stopped for good (None: it ran to the end), seconds per cell run."""

    errors: dict[int, str] = field(default_factory=dict)
    stopped: int | None = None
    seconds: dict[int, float] = field(default_factory=dict)


@dataclass
class NotebookJob:
    """One notebook to run: its cells, its check cells (index -> grade_id), its limits."""

    nb: object
    checks: dict[int, str]
    timing: Timing
    deadline: float                       # time.monotonic() by which it must be done
    seed: int = 0                         # the class seed (``check_seed``)
    student: str = ""
    level: str = "process"
    limits: Limits = field(default_factory=Limits)
    hidden: tuple[Path, ...] = ()
    name: str = "notebook.ipynb"

    def exercise_end(self, index: int) -> int:
        """The check cell closing the exercise that holds cell ``index`` (or the last cell)."""
        return min((c for c in self.checks if c >= index), default=len(self.nb.cells) - 1)


def run_notebook(job: NotebookJob, legacy_check=None) -> Graded:
    """Run ``job``'s notebook, restarting in a fresh sandbox after a hang (see the module
    docstring). ``legacy_check(client, index, cell)`` runs a check cell that has no
    registered check (an old notebook): it returns the error or None."""
    graded, start, hung = Graded(), 0, set()
    while start is not None:
        replay = [i for i in range(start) if i not in job.checks and i not in hung]
        start = _run_from(job, start, replay, graded, hung, legacy_check)
    return graded


def _run_from(job: NotebookJob, start: int, replay: list[int], graded: Graded, hung: set,
              legacy_check) -> int | None:
    """One sandbox: run the ``replay`` cells silently, then the cells from ``start`` on.
    Returns where to go on after a hang, None when the notebook is done."""
    from nbclient import NotebookClient

    with Sandbox(job.level, job.limits, job.hidden) as sandbox:
        nbformat.write(job.nb, sandbox.work / job.name)
        client = NotebookClient(job.nb, km=sandbox.kernel_manager(), allow_errors=True,
                                shutdown_kernel="immediate", timeout=job.timing.limit(None),
                                resources={"metadata": {"path": str(sandbox.work)}})
        replies = {}
        client.on_cell_executed = lambda cell, cell_index, execute_reply: replies.__setitem__(
            cell_index, execute_reply.get("content", {}))
        log = sandbox.log.open("wb")
        with log, client.setup_kernel(env=sandbox.env, stdout=log, stderr=log):
            i = start
            try:
                for i in replay:
                    if _run_cell(job, client, i, replies, graded, legacy_check, replaying=True):
                        return None                 # the notebook's time ran out
                for i in range(start, len(job.nb.cells)):
                    if _run_cell(job, client, i, replies, graded, legacy_check):
                        return None
            except Hung as err:
                if i < start:                       # an earlier cell hung when run again
                    graded.errors[start] = (f"not run: cell {i}, run again in a fresh sandbox "
                                            "after a hang, ran past its limit")
                    graded.stopped = start
                    return None
                key = job.checks.get(i) or job.nb.cells[i].get("id")
                graded.errors[i] = job.timing.said(key, err.limit) + "; the kernel was killed"
                hung.add(i)
                end = job.exercise_end(i)
                return end + 1 if end + 1 < len(job.nb.cells) else None
            except KernelDied as err:
                graded.errors[max(i, start)] = str(err)
                graded.stopped = max(i, start)
                return None
    return None


def _run_code_or_check(job: NotebookJob, client, i: int, limit: int, replies: dict,
                       legacy_check) -> str | None:
    """The error of cell ``i`` (a check cell: its check's failure), None if it passed."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    cell = job.nb.cells[i]
    if i in job.checks and (check := exercise_checks.find(job.checks[i])) is not None:
        link = KernelLink(client, Path(client.resources["metadata"]["path"]), limit)
        link.ping()
        failed = run_graded_check(check, link, check_seed(job.seed, job.student, check.grade_id))
        return None if failed is None else failed[1]
    client.timeout = limit
    if i in job.checks and legacy_check is not None:
        return legacy_check(client, i, cell)
    try:
        client.execute_cell(cell, i)
    except CellTimeoutError:
        raise Hung(limit) from None
    except DeadKernelError:
        raise KernelDied() from None
    return cell_error(cell) or failed_reply(replies.get(i))


def _run_cell(job: NotebookJob, client, i: int, replies: dict, graded: Graded, legacy_check,
              replaying: bool = False) -> bool:
    """Run cell ``i`` (a check cell: its check); record its error. True when the time allowed
    for the notebook ran out (the rest is then not run)."""
    cell = job.nb.cells[i]
    if cell.cell_type != "code":
        return False
    left = job.deadline - time.monotonic()
    if left < 1:
        graded.errors[i] = "not run: the time allowed for this notebook (or student) ran out"
        graded.stopped = i
        return True
    key = job.checks.get(i) or cell.get("id")
    limit = max(1, min(job.timing.limit(key), int(left)))
    began = time.monotonic()
    try:
        error = _run_code_or_check(job, client, i, limit, replies, legacy_check)
    except Hung:
        if limit == job.timing.limit(key):
            raise
        graded.errors[i] = (f"timed out after {limit} s, the time left for this notebook or "
                            "student; the kernel was killed")
        graded.stopped = i
        return True
    graded.seconds[i] = time.monotonic() - began
    if error is not None and not replaying:
        graded.errors[i] = error
    return False
