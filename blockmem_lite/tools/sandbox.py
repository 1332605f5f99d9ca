"""Where a student's notebook runs while it is graded: a sandbox of its own.

A graded notebook is code a student wrote. Each one runs its kernel in a fresh sandbox, at
the strongest level the machine offers:

- ``bubblewrap`` (Debian/Ubuntu: ``apt install bubblewrap``): new PID, mount, network, IPC
  and UTS namespaces, no capabilities, and an allow-list of files. The kernel sees only
  ``/usr`` (``/bin``, ``/lib``... as on the machine), the few ``/etc`` files the loader
  needs (``ETC_FILES``) and a ``passwd``/``group`` of the sandbox's own, the Python
  environment read-only (at its real paths, and through the symlinks it was reached by),
  the student edition of the kit read-only and first on ``PYTHONPATH``
  (``tools/student_kit.py``), ``BLOCKMEM_DATA`` read-only where it is set, its private
  folder (read-only but for ``work/``, the notebook's copy, and the kernel's connection
  folder), a minimal ``/dev``, its own ``/proc`` and an empty ``/tmp``. The kit's
  repository and its ``.git``, the solutions, the mutants, the submissions, the grades,
  the home folders and the rest of the disk are simply absent. When the grader is root the
  kernel runs as uid and gid 65534 (nobody): bwrap starts without a user namespace (one
  would map uid 0 alone), keeping only the capabilities ``setpriv`` needs to drop to
  65534, which it does first, with no capabilities, groups or new privileges left. Else it
  runs as the grader's user in a user namespace. There is no network, and the environment
  holds only what a notebook needs. When the kernel ends, every process it started ends
  with it (the PID namespace dies with its first process), before any grade is written.
- ``process``, the fallback where bubblewrap is missing or refused: the private folder as
  working directory, the minimal environment (the student kit first on ``PYTHONPATH``), a
  session of its own and the same resource limits; as uid 65534 when the grader is root and
  that user may run the interpreter (else as root, and the report says so). After the
  notebook its session is killed, and so is every process that still carries the run's
  token in its environment. This cannot hide what the kernel's user can read or write, nor
  catch a process that clears its environment and leaves the session: grade a class with
  bubblewrap installed. The grade report names the level used and the kernel's user.

Both levels apply the resource limits of ``Limits`` (prlimit): address space, file size,
CPU seconds and open files, and processes for a kernel that is not root (Linux does not
count processes against root's limit). The wall-clock limits per cell, notebook and
student are the grader's (``tools/grading.py``).

Both are Linux's (namespaces, prlimit, setpriv, /proc): elsewhere ``require_linux`` refuses
at once, naming where to grade instead.
"""

from __future__ import annotations

import functools
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
NOBODY = 65534                       # the kernel's uid and gid when the grader is root
DROP_TO_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                  "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs")
# What of the machine a bubblewrap kernel sees besides the Python environment and the kit.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf")
BASE_MOUNTS = ("--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm", "--proc", "/proc",
               "--perms", "1777", "--tmpfs", "/tmp")
REPOSITORY = Path(__file__).resolve().parents[2]   # the checkout (or site-packages)


@dataclass(frozen=True)
class Limits:
    """Per-kernel resource limits (each process of the sandbox gets them)."""

    memory_bytes: int = 8 * GiB        # address space (RLIMIT_AS): torch maps far more than it uses
    file_bytes: int = 1 * GiB          # the largest file it may write (RLIMIT_FSIZE)
    cpu_seconds: int = 3600            # CPU time of each process (RLIMIT_CPU)
    open_files: int = 1024             # RLIMIT_NOFILE
    processes: int = 256               # RLIMIT_NPROC, for a kernel that is not root

    def prlimit(self, uid: int) -> list[str]:
        """The ``prlimit`` command prefix that applies these limits to a kernel run as ``uid``."""
        args = ["prlimit", f"--as={self.memory_bytes}", f"--fsize={self.file_bytes}",
                f"--cpu={self.cpu_seconds}", f"--nofile={self.open_files}"]
        if uid != 0:
            args.append(f"--nproc={self.processes}")
        return [*args, "--"]


def _namespaces() -> list[str]:
    """bwrap's namespaces and capabilities. As root, no user namespace (it would map uid 0
    alone), and only the capabilities bwrap needs to enter ``work`` (which is ``NOBODY``'s)
    and ``setpriv`` to drop to ``NOBODY``, which drops them all."""
    common = ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if os.geteuid() != 0:
        return ["--unshare-all", *common]
    return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", *common, "--cap-add", "CAP_DAC_READ_SEARCH",
            "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]


def bubblewrap_works() -> bool:
    """bwrap is installed and may create the namespaces it needs here (a container may not);
    as root, setpriv drops to ``NOBODY`` inside it."""
    if shutil.which("bwrap") is None or (os.geteuid() == 0 and shutil.which("setpriv") is None):
        return False
    switch = list(DROP_TO_NOBODY) if os.geteuid() == 0 else []
    probe = ["bwrap", *_namespaces(), "--ro-bind", "/", "/", *BASE_MOUNTS, *switch, "true"]
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
        raise SandboxError("--isolation=bubblewrap is not available here: bwrap is missing, "
                         "too old (it needs --perms for a tmpfs, bubblewrap 0.6) or may not "
                         "create namespaces, or setpriv (util-linux) is missing where the "
                         "grader is root (install bubblewrap and util-linux; in a container, "
                         "allow user namespaces), or choose --isolation=process")
    return "bubblewrap" if works else "process"


def kernel_ids(level: str) -> tuple[int, int]:
    """(uid, gid) a kernel runs as at ``level``: ``NOBODY`` when the grader is root (at the
    process level only where that user may run the interpreter), else the grader's."""
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    if level == "bubblewrap" or _nobody_may_run_python():
        return NOBODY, NOBODY
    return 0, 0


@functools.lru_cache(maxsize=1)
def _nobody_may_run_python() -> bool:
    """Whether uid ``NOBODY`` may start this interpreter, in this environment, and import
    ipykernel (not where the environment lies in a folder closed to other users, /root)."""
    if shutil.which("setpriv") is None:
        return False
    same = f"import sys, ipykernel; sys.exit((sys.prefix, sys.base_prefix) != {(sys.prefix, sys.base_prefix)!r})"
    try:
        return subprocess.run([*DROP_TO_NOBODY, "prlimit", "--", sys.executable, "-c", same],
                              capture_output=True, timeout=120, cwd="/").returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _who(level: str) -> str:
    """The kernel's user, in words."""
    uid, _ = kernel_ids(level)
    if uid == 0:
        return (f"root (uid {NOBODY} may not run {sys.executable}: its environment lies "
                "in a folder closed to other users)")
    if os.geteuid() == 0:
        return f"uid {NOBODY} (nobody), no capabilities"
    return f"the grader's user (uid {uid})" + (" in a user namespace, no capabilities"
                                              if level == "bubblewrap" else "")


def describe(level: str) -> str:
    """One line for the grade report."""
    if level == "bubblewrap":
        return (f"bubblewrap: own PID, mount, network and IPC namespaces; runs as {_who(level)}; "
                "sees only /usr, the Python environment and the student kit (read-only) and "
                "its own folder: no repository, solutions, submissions, grades or home "
                "folders; minimal environment; prlimit limits")
    return (f"process (bubblewrap unavailable): own session, minimal environment, prlimit "
            f"limits, runs as {_who(level)}; files that user can reach are NOT hidden: "
            "install bubblewrap for a class")


def minimal_environment(home: Path, token: str, kit: Path | None = None) -> dict[str, str]:
    """What a graded kernel sees: the interpreter's folder on PATH, the student ``kit``
    first on PYTHONPATH, the kit's fast headless mode, a private HOME, UTF-8; nothing of the
    teacher's environment but BLOCKMEM_DATA and PYTHONPATH (whose folders a bubblewrap
    kernel does not see)."""
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
           "HOME": str(home), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
           "BLOCKMEM_FAST": "1", "BLOCKMEM_HEADLESS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", "MPLBACKEND": "agg",
           TOKEN_VARIABLE: token}
    if "BLOCKMEM_DATA" in os.environ:                  # where the teacher put the data
        env["BLOCKMEM_DATA"] = os.environ["BLOCKMEM_DATA"]
    path = [str(kit)] if kit else []
    path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    return env


@dataclass
class Sandbox:
    """One notebook's sandbox: a private folder (``work``), a kernel command wrapper and the
    student ``kit`` it imports (a folder holding a staged ``blockmem_lite``; None stages one
    into the private folder). ``hidden`` is accepted for compatibility and needed by no
    level: bubblewrap shows an allow-list, and the process level can hide nothing. Use as a
    context manager: on exit every process of the run is killed and the private folder
    removed."""

    level: str
    limits: Limits = field(default_factory=Limits)
    hidden: tuple[Path, ...] = ()
    kit: Path | None = None

    def __post_init__(self):
        if self.level not in LEVELS[1:]:
            raise SandboxError(f"level={self.level!r} is not allowed: expected one of "
                               f"{', '.join(LEVELS[1:])} (choose_level picks one)")
        self.root = Path(tempfile.mkdtemp(prefix="blockmem-grade-")).resolve()
        self.work = self.root / "work"                # the notebook's copy and its cwd
        self.connection = self.root / "kernel"        # connection file and IPC sockets
        self.log = self.root / "kernel.log"           # what the kernel prints to its console
        self.uid, self.gid = kernel_ids(self.level)
        try:
            self.work.mkdir()
            self.connection.mkdir()
            self.kit = self._student_kit()
            if self.level == "bubblewrap":
                self._write_accounts()
            self.hand_over(self.root, self.work, self.connection)
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        self.token = self.root.name
        self.env = minimal_environment(self.work, self.token, self.kit)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.end_every_process()
        shutil.rmtree(self.root, ignore_errors=True)

    def _student_kit(self) -> Path:
        """The kit folder given (checked), or one staged into the private folder."""
        if self.kit is None:
            from blockmem_lite.tools.student_kit import stage_student_kit
            return stage_student_kit(self.root / "kit")
        kit = Path(self.kit).resolve()
        if not (kit / "blockmem_lite" / "__init__.py").is_file():
            raise SandboxError(f"kit={str(self.kit)!r} is not allowed: expected a folder "
                               "holding a staged blockmem_lite package (see "
                               "tools/student_kit.py, stage_student_kit)")
        return kit

    def _write_accounts(self) -> None:
        """The sandbox's /etc/passwd and /etc/group: root and the kernel's user, nobody else."""
        user = "nobody" if self.uid == NOBODY else "student"
        group = "nogroup" if self.gid == NOBODY else "student"
        groups = {0: "root", NOBODY: "nogroup", self.gid: group}
        (self.root / "passwd").write_text(
            "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
            f"{user}:x:{self.uid}:{self.gid}:{user}:{self.work}:/usr/sbin/nologin\n")
        (self.root / "group").write_text("".join(f"{name}:x:{gid}:\n"
                                                 for gid, name in groups.items()))
        for name in ("passwd", "group"):
            (self.root / name).chmod(0o644)

    def hand_over(self, *paths: Path) -> None:
        """Make ``paths`` the kernel's where the grader is root and the kernel is not."""
        if os.geteuid() == 0 and self.uid != 0:
            for path in paths:
                os.chown(path, self.uid, self.gid)

    def wrap(self, kernel_cmd: list[str]) -> list[str]:
        """The kernel's command line, run inside this sandbox."""
        switch = list(DROP_TO_NOBODY) if os.geteuid() == 0 and self.uid != 0 else []
        inner = [*switch, *self.limits.prlimit(self.uid), *kernel_cmd]
        if self.level != "bubblewrap":
            return inner
        args = ["bwrap", *_namespaces(), *self.mounts(), "--clearenv"]
        for key, value in self.env.items():
            args += ["--setenv", key, value]
        return [*args, "--chdir", str(self.work), *inner]

    def mounts(self) -> list[str]:
        """bwrap's filesystem: the allow-list (module docstring), nothing else."""
        ops = _system_mounts()
        ops += [("--ro-bind", f"/etc/{name}", f"/etc/{name}") for name in ETC_FILES
                if os.path.exists(f"/etc/{name}")]
        ops += [("--ro-bind", str(self.root / name), f"/etc/{name}") for name in ("passwd", "group")]
        shown = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix),
                 Path(sys.executable)]
        if not self.kit.is_relative_to(self.root):     # else the private folder shows it
            shown.append(self.kit)
        data = os.environ.get("BLOCKMEM_DATA")
        if data and Path(data).is_dir():
            shown.append(Path(data))
        ops += _read_only(shown)
        ops += [("--ro-bind", str(self.root), str(self.root)),
                *(("--bind", str(p), str(p)) for p in (self.work, self.connection))]
        return [*BASE_MOUNTS, *_parent_folders(ops), *(arg for op in ops for arg in op)]

    def kernel_manager(self):
        """A jupyter kernel manager whose kernel starts inside this sandbox (IPC sockets in
        the private folder, so no network is needed between the grader and the kernel)."""
        from jupyter_client.manager import AsyncKernelManager

        sandbox = self

        class SandboxedKernelManager(AsyncKernelManager):
            def format_kernel_cmd(self, extra_arguments=None):
                return sandbox.wrap(super().format_kernel_cmd(extra_arguments))

            def write_connection_file(self, **kwargs):
                super().write_connection_file(**kwargs)       # 0600: the kernel's to read
                sandbox.hand_over(Path(self.connection_file))

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


def _system_mounts() -> list[tuple[str, str, str]]:
    """``/usr`` read-only, and ``/bin``, ``/lib``... as on this machine: symlinks where they
    are (a merged /usr), else read-only binds."""
    ops = []
    for name in SYSTEM_DIRS:
        if os.path.islink(name):
            ops.append(("--symlink", os.readlink(name), name))
        elif os.path.isdir(name):
            ops.append(("--ro-bind", name, name))
    return ops


def _read_only(paths: list[Path]) -> list[tuple[str, str, str]]:
    """bwrap binds showing ``paths`` read-only: the real folders (a file's folder), bound at
    their real paths, and each symlink met on the way to them, recreated, so each path
    leads where it does here (a virtual environment reached through a link included)."""
    real = [p.resolve() if p.resolve().is_dir() else p.resolve().parent for p in paths]
    folders = _outermost([*real, *(Path(d) for d in SYSTEM_DIRS if not os.path.islink(d))])
    _refuse_the_repository(folders)
    ops = [("--ro-bind", str(f), str(f)) for f in folders if str(f) not in SYSTEM_DIRS]
    links = dict.fromkeys(link for p in paths for link in _symlinks_on(p))
    ops += [("--symlink", target, str(location)) for target, location in links
            if str(location) not in SYSTEM_DIRS
            and not any(location.is_relative_to(f) for f in folders)]
    return ops


def _parent_folders(ops: list[tuple[str, str, str]]) -> list[str]:
    """``--dir`` (mode 0755) for each folder above what ``ops`` create: bwrap would make them
    0700, closed to a kernel run as ``NOBODY``."""
    made = [Path(op[2]) for op in ops]
    above = {parent for path in made for parent in path.parents
             if parent not in (Path("/"), Path("/tmp"))
             and not any(parent.is_relative_to(m) for m in made)}
    return [arg for folder in sorted(above, key=lambda p: len(p.parts))
            for arg in ("--perms", "0755", "--dir", str(folder))]


def _outermost(folders: list[Path]) -> list[Path]:
    """``folders`` without duplicates and without those inside another one."""
    unique = sorted(set(folders))
    return [f for f in unique if not any(f != g and f.is_relative_to(g) for g in unique)]


def _refuse_the_repository(folders: list[Path]) -> None:
    """A SandboxError where a folder to show holds the kit's repository (a virtual
    environment or a data folder set to the checkout would show its solutions)."""
    if not any((REPOSITORY / p).exists() for p in (".git", "notebooks/solutions")):
        return
    for folder in folders:
        if REPOSITORY.is_relative_to(folder):
            raise SandboxError(f"the sandbox would show {folder}, which holds the kit's "
                               f"repository {REPOSITORY} (its .git and solutions): put the "
                               "Python environment and BLOCKMEM_DATA outside the repository")


def _symlinks_on(path: Path, depth: int = 0) -> list[tuple[str, Path]]:
    """(target, location) of each symlink met resolving ``path`` here, each location a real
    path: what bwrap recreates so that ``path`` leads where it does on this machine."""
    found, here = [], Path("/")
    for part in Path(os.path.abspath(path)).parts[1:]:
        step = here / part
        if step.is_symlink() and depth < 40:
            target = os.readlink(step)
            found += [(target, step), *_symlinks_on(Path(here, target), depth + 1)]
            step = step.resolve()
        here = step
    return found


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
