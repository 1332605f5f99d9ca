"""Checkpoint files and run folders: nothing a user trained is lost.

* ``atomic_write``: a temp file in the same folder, fsync, then ``os.replace``,
  so a kill mid-write never leaves half a checkpoint; temp files that killed
  processes left behind are removed.
* ``load_checkpoint_file``: ``torch.load(weights_only=True)`` with one clear
  error for a file that is empty, truncated, not a checkpoint, missing parts or
  holding a part of the wrong kind (a step that is no whole number).
* ``RunLock``: a lock file naming the process that writes into a folder, so a
  second run cannot overwrite the first one's checkpoint; a lock whose process
  is gone (or whose pid now names another process) is stale and taken over, and
  a refusal names the lock file and how to clear it; a folder in its place is
  refused naming it.
* ``prepare_folder``: the output folder is checked before any training
  (creatable, writable, not a file), with a warning when the disk is short.
* ``is_disk_full``: the errors a full disk raises (``OSError`` ENOSPC, torch's
  zip writer's "unexpected pos").
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import socket
import time
import warnings
import zipfile
from pathlib import Path

import psutil
import torch

from blockmem_lite.units import human_bytes

CHECKPOINT_NAME = "checkpoint.pt"
HISTORY_NAME = "history.json"        # beside checkpoint.pt: the history up to its step
CHECKPOINT_FORMAT = "blockmem_lite.checkpoint/1"
CHECKPOINT_KEYS = ("format", "model", "optimizer", "step", "epoch", "position", "data_size",
                   "history", "rng", "train_config")
COUNT_KEYS = ("step", "epoch", "position", "data_size")       # whole numbers >= 0
DICT_KEYS = ("model", "optimizer", "history", "rng", "train_config")
LOCK_NAME = ".blockmem_run.lock"
PROC_ROOT = Path("/proc")            # where Linux describes its processes


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used, with the file and the reason."""


# --- writing ---------------------------------------------------------------------------------
def is_disk_full(error: BaseException) -> bool:
    """True for the errors a full disk (or quota) raises while writing."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(error, RuntimeError) and "unexpected pos" in str(error)


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (psutil: on Windows ``os.kill(pid, 0)``
    sends a console Ctrl-C instead of testing the pid)."""
    try:
        return psutil.pid_exists(pid)
    except (OverflowError, ValueError):      # no pid at all
        return False


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started, which tells it from a later process given the same pid:
    clock ticks since boot (/proc/<pid>/stat field 22) on Linux, milliseconds since the
    epoch (psutil) where there is no /proc (macOS, Windows); None where neither can say."""
    try:
        fields = (PROC_ROOT / str(pid) / "stat").read_text(encoding="utf-8").rsplit(")", 1)[1]
        return int(fields.split()[19])
    except (OSError, IndexError, ValueError):
        pass
    try:
        return round(psutil.Process(pid).create_time() * 1000)
    except (psutil.Error, OverflowError, ValueError):
        return None


def _may_be_a_run(pid: int) -> bool:
    """False when live process ``pid`` cannot be a run of this kit: its command line names
    neither Python (scripts, notebook kernels, torchrun) nor blockmem_lite, e.g. an init
    process, a shell or ``sleep`` (pid 1 of a container). True where /proc cannot tell."""
    try:
        cmdline = (PROC_ROOT / str(pid) / "cmdline").read_bytes().lower()
    except OSError:
        return True
    return b"python" in cmdline or b"blockmem" in cmdline


def remove_stale_temps(path: Path) -> list[Path]:
    """Delete ``.<name>.<pid>.tmp`` files next to ``path`` whose writer process is gone."""
    removed = []
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(path.name) + 2:-len(".tmp")]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def atomic_write(path: Path, write) -> None:
    """Write via a temp file in the same folder, fsync, then ``os.replace`` (never half a file).

    ``write(f)`` writes to the open binary file. On any error the temp file is
    removed and ``path`` keeps its previous content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    atomic_write(path, lambda f: f.write(payload))


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows cannot open folders; os.replace is already durable enough there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- reading ---------------------------------------------------------------------------------
def load_checkpoint_file(path) -> dict:
    """The checkpoint dict at ``path``, loaded on CPU with ``weights_only=True``.

    A ``CheckpointError`` (a ValueError) names the file and what is wrong with it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is not usable: the file is empty (0 bytes); "
                              "it was never written completely")
    broken = (f"checkpoint {path} is not usable: it is truncated or not a torch checkpoint; "
              "restore it from a copy or train again")
    if not zipfile.is_zipfile(path):                   # torch writes zip archives
        raise CheckpointError(broken)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, zipfile.BadZipFile, EOFError):
        raise CheckpointError(broken) from None
    except pickle.UnpicklingError:
        raise CheckpointError(f"checkpoint {path} is not usable: it holds objects other than "
                              "tensors, numbers, strings, lists and dicts, which the kit never "
                              "loads (they could run code)") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"checkpoint {path} is not usable: not a {CHECKPOINT_FORMAT} file")
    missing = [k for k in CHECKPOINT_KEYS if k not in ckpt]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not usable: it lacks {', '.join(missing)}")
    _check_kinds(ckpt, path)
    return ckpt


def _check_kinds(ckpt: dict, path: Path) -> None:
    """Refuse (CheckpointError) a count that is no whole number >= 0 or a part that is no
    dict, naming the file and the first such field (a file edited or written by other code)."""
    for key in COUNT_KEYS:
        value = ckpt[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(f"checkpoint {path} is not usable: its {key!r} is {value!r}, "
                                  "not a whole number >= 0; restore it from a copy or train "
                                  "again")
    for key in DICT_KEYS:
        if not isinstance(ckpt[key], dict):
            raise CheckpointError(f"checkpoint {path} is not usable: its {key!r} is "
                                  f"{ckpt[key]!r:.60}, not a dict; restore it from a copy or "
                                  "train again")


# --- run folders -----------------------------------------------------------------------------
class RunLocked(RuntimeError):
    """Another live process writes into the folder."""


class RunLock:
    """``with RunLock(folder):`` one process at a time writes checkpoints into ``folder``.

    The lock file holds the owner's pid, host, start time and the moment its process
    started (``_process_start``). A lock left by a process that no longer runs on this host,
    or whose pid now names another process (a later one, or one that cannot be a run: pid 1
    of a container), is stale and taken over; a lock from another host cannot be checked and
    is left to the user. The same process may take the lock again (nested fits); the
    outermost release frees it.
    """

    _held: dict[str, int] = {}                 # folder -> nesting depth in this process

    def __init__(self, folder):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME

    def owner(self) -> dict | None:
        """The lock file's content (pid, host, started, process_start); None if unreadable."""
        try:
            owner = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return owner if isinstance(owner, dict) else None

    def _stale(self, owner: dict | None) -> bool:
        """True when the run that took the lock is gone (checkable on this host only)."""
        if owner is None:
            return True
        if owner.get("host") != socket.gethostname():
            return False
        pid = owner.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return True                                  # not a lock this kit wrote
        if not _pid_alive(pid):
            return True
        start = _process_start(pid)
        if owner.get("process_start") is not None and start is not None:
            return start != owner["process_start"]       # the pid now names another process
        return not _may_be_a_run(pid)

    def _refusal(self, owner: dict) -> RunLocked:
        """The error for a lock held by ``owner``: whose it is and how to clear it."""
        pid, host = owner.get("pid"), owner.get("host")
        here = socket.gethostname()
        who = (f"{self.folder} is in use by another run (pid {pid} on {host}, started "
               f"{owner.get('started')}; lock file {self.path})")
        if host != here:
            return RunLocked(f"{who}: that run is on another host ({host}; this is {here}), "
                             "so it cannot be checked from here. Wait for it to finish, or "
                             f"choose another output folder; if that run is gone, delete "
                             f"{self.path}")
        return RunLocked(f"{who}: process {pid} still runs. Wait for it to finish, or choose "
                         f"another output folder; if that run is gone, delete {self.path}")

    def _check_not_a_folder(self) -> None:
        """Refuse (ValueError) a folder (or anything but a file) where the lock file goes."""
        if self.path.exists() and not self.path.is_file():
            kind = "a folder" if self.path.is_dir() else "a special file"
            raise ValueError(f"{self.path} is {kind}, not a run lock file: move it away (the "
                             "kit writes its lock there) or choose another output folder")

    def check(self) -> None:
        """Raise ``RunLocked`` when a live run of another process holds the folder; take
        nothing. A command reports a busy folder before any long work with it, and the fit
        that writes into the folder takes the lock."""
        self._check_not_a_folder()
        key = str(self.folder.resolve())
        if self.path.exists() and not self._held.get(key):
            owner = self.owner()
            if not self._stale(owner):
                raise self._refusal(owner)

    def acquire(self) -> None:
        key = str(self.folder.resolve())
        if self._held.get(key):
            self._held[key] += 1
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self._check_not_a_folder()
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self.owner()
                if not self._stale(owner):
                    raise self._refusal(owner) from None
                self.path.unlink(missing_ok=True)            # stale: its process is gone
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"pid": os.getpid(), "host": socket.gethostname(),
                           "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                           "process_start": _process_start(os.getpid())}, f)
            self._held[key] = 1
            return
        raise RunLocked(f"could not take the lock {self.path}: another run took it at the same "
                        f"moment; if no other run writes into {self.folder}, delete {self.path} "
                        "and start again")

    def release(self) -> None:
        key = str(self.folder.resolve())
        depth = self._held.get(key, 0)
        if depth > 1:
            self._held[key] = depth - 1
            return
        self._held.pop(key, None)
        owner = self.owner()
        if owner is not None and owner.get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def prepare_folder(folder, expected_bytes: int = 0, name: str = "checkpoint_dir") -> Path:
    """Create ``folder`` and prove it writable, before any long work; warn when the free
    disk space is below ``expected_bytes`` (about one checkpoint)."""
    folder = Path(folder)
    for parent in [folder, *folder.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{name}={str(folder)!r} is not allowed: {parent} is a file, "
                                 "not a folder")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write_test.{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"{name}={str(folder)!r} is not allowed: it cannot be written "
                         f"({err.strerror or err})") from None
    free = shutil.disk_usage(folder).free
    if expected_bytes and free < expected_bytes:
        warnings.warn(f"only {human_bytes(free)} free in {folder}; a checkpoint needs about "
                      f"{human_bytes(expected_bytes)}: free some space or checkpoints will "
                      "fail", UserWarning, stacklevel=3)
    return folder
