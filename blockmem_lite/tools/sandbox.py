"""Where a student's notebook runs while it is graded: a sandbox of its own.

A graded notebook is code a student wrote, run with the teacher's rights. Each one runs its
kernel in a fresh sandbox, at the strongest level the machine offers:

- ``bubblewrap`` (Debian/Ubuntu: ``apt install bubblewrap``): new PID, mount, network, IPC,
  UTS and user namespaces and no capabilities. The whole filesystem is read-only, the kit
  included, except a private folder holding the copy of the notebook; the other
  submissions, the grades folder, the solutions and the mutants are hidden under empty
  folders, and ``/tmp`` is empty. ``/proc`` shows the sandbox's own processes only. There
  is no network, and the environment holds only what a notebook needs. When the kernel
  ends, every process it started ends with it (the PID namespace dies with its first
  process), before any grade is written.
- ``process``, the fallback where bubblewrap is missing or refused: the private folder as
  working directory, the minimal environment, a session of its own and the same resource
  limits. After the notebook its session is killed, and so is every process that still
  carries the run's token in its environment. This cannot hide what the teacher's user can
  read or write, nor catch a process that clears its environment and leaves the session:
  grade a class with bubblewrap installed. The grade report names the level used.

Both levels apply the resource limits of ``Limits`` (prlimit): address space, file size,
CPU seconds and open files, and processes for a user that is not root (Linux does not
count processes against root's limit). The wall-clock limits per cell, notebook and
student are the grader's (``tools/grading.py``).

Both are Linux's (namespaces, prlimit, /proc): elsewhere ``require_linux`` refuses at once,
naming where to grade instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

LEVELS = ("auto", "bubblewrap", "process")


class SandboxError(ValueError):
    """No sandbox of the level asked for can be made here (the message says what to do)."""
GiB = 1 << 30
TOKEN_VARIABLE = "BLOCKMEM_GRADE_RUN"


@dataclass(frozen=True)
class Limits:
    """Per-kernel resource limits (each process of the sandbox gets them)."""

    memory_bytes: int = 8 * GiB        # address space (RLIMIT_AS): torch maps far more than it uses
    file_bytes: int = 1 * GiB          # the largest file it may write (RLIMIT_FSIZE)
    cpu_seconds: int = 3600            # CPU time of each process (RLIMIT_CPU)
    open_files: int = 1024             # RLIMIT_NOFILE
    processes: int = 256               # RLIMIT_NPROC, for a user that is not root

    def prlimit(self) -> list[str]:
        """The ``prlimit`` command prefix that applies these limits."""
        args = ["prlimit", f"--as={self.memory_bytes}", f"--fsize={self.file_bytes}",
                f"--cpu={self.cpu_seconds}", f"--nofile={self.open_files}"]
        if os.geteuid() != 0:
            args.append(f"--nproc={self.processes}")
        return [*args, "--"]


def bubblewrap_works() -> bool:
    """bwrap is installed and may create the namespaces it needs here (a container may not)."""
    if shutil.which("bwrap") is None:
        return False
    probe = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
             "--unshare-all", "--die-with-parent", "--cap-drop", "ALL", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def require_linux() -> None:
    """A SandboxError on any platform but Linux, whose sandboxes grading needs."""
    if not sys.platform.startswith("linux"):
        raise SandboxError(f"grading needs Linux (its sandbox is bubblewrap and prlimit) and "
                           f"this is {sys.platform}: grade on a Linux machine, or in a Linux "
                           "container (Docker; on Windows also WSL)")


def choose_level(wanted: str = "auto") -> str:
    """The level to grade at: ``auto`` takes bubblewrap where it works, else ``process``."""
    require_linux()
    if wanted not in LEVELS:
        raise SandboxError(f"--isolation={wanted} is not allowed: expected one of "
                         f"{', '.join(LEVELS)}")
    if shutil.which("prlimit") is None:
        raise SandboxError("grading needs prlimit (util-linux) to limit a notebook's memory, "
                         "file size and CPU time: install util-linux")
    works = wanted != "process" and bubblewrap_works()
    if wanted == "bubblewrap" and not works:
        raise SandboxError("--isolation=bubblewrap is not available here: bwrap is missing or "
                         "may not create namespaces (install bubblewrap; in a container, allow "
                         "user namespaces), or choose --isolation=process")
    return "bubblewrap" if works else "process"


def describe(level: str) -> str:
    """One line for the grade report."""
    if level == "bubblewrap":
        return ("bubblewrap: own PID, mount, network and user namespaces; kit read-only; other "
                "submissions, grades and solutions hidden; minimal environment; prlimit limits")
    return ("process (bubblewrap unavailable): own session, minimal environment, prlimit limits; "
            "files the grader's user can reach are NOT hidden: install bubblewrap for a class")


def minimal_environment(home: Path, token: str) -> dict[str, str]:
    """What a graded kernel sees: the interpreter's folder on PATH, the kit's fast headless
    mode, a private HOME, UTF-8; nothing of the teacher's environment."""
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
           "HOME": str(home), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
           "BLOCKMEM_FAST": "1", "BLOCKMEM_HEADLESS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", "MPLBACKEND": "agg",
           TOKEN_VARIABLE: token}
    for name in ("BLOCKMEM_DATA", "PYTHONPATH"):   # where the teacher put the data, the kit
        if name in os.environ:
            env[name] = os.environ[name]
    return env


@dataclass
class Sandbox:
    """One notebook's sandbox: a private folder (``work``) and a kernel command wrapper.

    ``hidden``: folders (other submissions, the grades folder, the solutions) a bubblewrap
    kernel sees as empty. Use as a context manager: on exit every process of the run is
    killed and the private folder removed.
    """

    level: str
    limits: Limits = field(default_factory=Limits)
    hidden: tuple[Path, ...] = ()

    def __post_init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="blockmem-grade-"))
        self.work = self.root / "work"                # the notebook's copy and its cwd
        self.connection = self.root / "kernel"        # connection file and IPC sockets
        self.log = self.root / "kernel.log"           # what the kernel prints to its console
        self.work.mkdir()
        self.connection.mkdir()
        self.token = self.root.name
        self.env = minimal_environment(self.work, self.token)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.end_every_process()
        shutil.rmtree(self.root, ignore_errors=True)

    def wrap(self, kernel_cmd: list[str]) -> list[str]:
        """The kernel's command line, run inside this sandbox."""
        limited = [*self.limits.prlimit(), *kernel_cmd]
        if self.level != "bubblewrap":
            return limited
        args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--tmpfs", "/tmp"]
        for needed in _interpreter_and_kit():      # read-only again where /tmp held them
            args += ["--ro-bind", str(needed), str(needed)]
        args += ["--bind", str(self.root), str(self.root)]
        for folder in self.hidden:
            if Path(folder).is_dir() and not self.root.is_relative_to(folder):
                args += ["--tmpfs", str(Path(folder).resolve())]
        args += ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                 "--clearenv"]
        for key, value in self.env.items():
            args += ["--setenv", key, value]
        return [*args, "--chdir", str(self.work), *limited]

    def kernel_manager(self):
        """A jupyter kernel manager whose kernel starts inside this sandbox (IPC sockets in
        the private folder, so no network is needed between the grader and the kernel)."""
        from jupyter_client.manager import AsyncKernelManager

        sandbox = self

        class SandboxedKernelManager(AsyncKernelManager):
            def format_kernel_cmd(self, extra_arguments=None):
                return sandbox.wrap(super().format_kernel_cmd(extra_arguments))

        return SandboxedKernelManager(kernel_name="python3", transport="ipc",
                                      ip=str(self.connection / "socket"),
                                      connection_file=str(self.connection / "kernel.json"))

    def end_every_process(self, rounds: int = 5, wait_seconds: float = 5.0) -> None:
        """Kill what is left of the run and wait until it has exited: under bubblewrap the
        namespace is already gone with its kernel; otherwise every process carrying the
        run's token. The search is repeated (up to ``rounds`` times) so a process started
        while the others were killed is found too; a killed process counts as gone once it
        has exited (a zombie), since SIGKILL ends it only after the kernel tears it down."""
        for _ in range(rounds):
            found = _processes_with(TOKEN_VARIABLE, self.token)
            if not found:
                return
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            _wait_until_exited(found, wait_seconds)


def _interpreter_and_kit() -> list[Path]:
    """The folders under /tmp a kernel needs (the kit, the virtual environment, the
    interpreter's installation): the sandbox's empty /tmp would hide them."""
    kit = Path(__file__).resolve().parents[2]          # the repository (or site-packages)
    places = {kit, Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix),
              Path(sys.executable).resolve().parent,
              *(Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)}
    tmp = Path("/tmp").resolve()
    inside = sorted(p.resolve() for p in places
                    if p.resolve().is_relative_to(tmp) and p.resolve().exists())
    return [p for p in inside if not any(p != q and p.is_relative_to(q) for q in inside)]


def _wait_until_exited(pids: list[int], timeout: float) -> None:
    """Poll /proc until every one of ``pids`` is gone or a zombie, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if _running(pid)]
        if left:
            time.sleep(0.01)


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (state Z/X: exited, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _processes_with(variable: str, value: str) -> list[int]:
    """PIDs of the processes whose environment holds ``variable=value`` (Linux /proc)."""
    wanted, found = f"{variable}={value}".encode(), []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found
