"""How a Trainer run stops early and keeps time: the stop button (SIGINT, SIGTERM, SIGHUP),
the stop every process agrees on under torchrun, and the run's clock.

The notebook "stop" button (SIGINT) finishes the current step and stops cleanly: the
model and the history are kept, a checkpoint is written when ``checkpoint_dir`` is set,
and ``fit`` returns the history. A second press interrupts at once. A
``KeyboardInterrupt`` raised anywhere in the loop (for instance by a callback) is handled
the same way. (The kit has no loss-based early stopping: a run ends at its step count.)
"""

from __future__ import annotations

import signal
import threading
import time

from blockmem_lite import distributed

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


class StopButton:
    """While active, the first SIGINT (Ctrl-C, the notebook stop button), SIGTERM or SIGHUP
    only sets ``requested`` (and ``signal_name``) so the loop stops between steps and saves;
    a second one raises KeyboardInterrupt.

    Installed only in the main thread, and only over a signal's default handler.
    """

    def __init__(self):
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def __enter__(self) -> StopButton:
        if threading.current_thread() is not threading.main_thread():
            return self
        for name in STOP_SIGNALS:
            number = getattr(signal, name, None)           # SIGHUP does not exist on Windows
            default = signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL
            if number is not None and signal.getsignal(number) is default:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        # After a lost process torchrun's SIGTERM is on its way to the survivors: it is
        # ignored from here on, so the caller can still write what it must, then exit.
        lost = exc[0] is not None and issubclass(exc[0], distributed.PeerLost)
        for number, previous in self._previous.items():
            signal.signal(number, signal.SIG_IGN if lost and number == signal.SIGTERM
                          else previous)
        self._previous.clear()


def agreed_stop(stop: StopButton, world: distributed.World, stop_code: int = 0) -> int:
    """W > 1, before each step: the largest stop signal number any process has (0: go on),
    so every process stops after the same step. ``stop_code``: a stop this process asked
    for otherwise (a callback's KeyboardInterrupt: SIGINT's number). Peers' stops do not
    touch ``stop``, so their own signal, arriving later, still only asks for a stop."""
    mine = 0
    if stop.requested:
        mine = int(getattr(signal, stop.signal_name or "SIGINT", signal.SIGINT))
    return world.all_reduce_max(max(mine, stop_code))


class Clock:
    """Wall time of a run (continuing ``base_s`` from earlier fits) and the ETA."""

    def __init__(self, base_s: float, start_step: int):
        self.base_s = base_s
        self.start_step = start_step
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return self.base_s + time.perf_counter() - self.start

    def eta(self, step: int, total: int) -> float:
        done = step - self.start_step
        mean_step = (time.perf_counter() - self.start) / max(1, done)
        return mean_step * max(0, total - step)
