"""The lab's progress: one text bar over the whole plan of a ``reproduce`` run, with an ETA.

Training steps feed it between tasks (it is a ``Trainer`` callback); the recall and facts
models trained on worker processes (``lab.parts``) show as one task, and count as done
once they are; the bench reports its phases (``within``).
"""

from __future__ import annotations

import sys
import time

from blockmem_lite.units import human_duration, time_left


class PlanProgress:
    """One text progress bar over the whole plan; training steps feed it between tasks.
    ``stream=None`` keeps it silent."""

    WEIGHT = {"lm": 1.0, "recall": 1.0, "facts": 1.0, "bench": 2.0}   # rough relative costs

    def __init__(self, plan, done: set, stream=sys.stderr, min_interval_s: float = 2.0):
        self.plan, self.stream, self.min_interval_s = plan, stream, min_interval_s
        self.total = sum(self.WEIGHT[t] for t, _ in plan)
        self.done = sum(self.WEIGHT[t] for t, label in plan if f"{t}/{label}" in done)
        self.start_done, self.start = self.done, time.perf_counter()
        self.current, self.fraction, self._last = "", 0.0, 0.0
        self.part = (0, 1)                               # (index, count) of the task's trainings
        self.prepaid: set[tuple[str, str]] = set()      # tasks whose work the workers did

    def begin(self, task: str, label: str) -> None:
        weight = 0.0 if (task, label) in self.prepaid else self.WEIGHT[task]
        self.current, self.weight, self.fraction = f"{task} {label}", weight, 0.0
        self.part = (0, 1)
        self._print(force=True)

    def train_part(self, index: int, count: int) -> None:
        """The task's next training is the ``index``-th of ``count`` (a language model's
        seeds): its steps fill that share of the task's bar."""
        self.part = (index, count)

    def finish(self) -> None:
        self.done += self.weight
        self.fraction = 0.0
        self._print(force=True)

    def begin_workers(self, tasks: list[tuple[str, str]]) -> None:
        """The models of ``tasks`` train on worker processes, shown as one task; once they
        are done, those tasks count as done (``end_workers``) and add nothing when they run."""
        weight = sum(self.WEIGHT[task] for task, _ in tasks)
        self.current, self.weight, self.fraction = "small models", weight, 0.0
        self._workers = tasks
        self._print(force=True)

    def within(self, fraction: float, text: str) -> None:
        """Progress inside the current task: the workers' share of their work, the bench's
        phases (``text`` replaces the task's name on the bar)."""
        changed = text != self.current
        self.current, self.fraction = text, fraction
        self._print(force=changed)

    def end_workers(self, completed: bool) -> None:
        if completed:
            self.done += self.weight
            self.prepaid.update(self._workers)
        self.current, self.weight, self.fraction = "", 0.0, 0.0

    def on_step(self, trainer, rec) -> None:           # a Trainer callback
        index, count = self.part
        self.fraction = (index + rec["step"] / max(1, rec["total_steps"])) / count
        self._print()

    def line(self) -> str:
        progress = self.done + self.weight * self.fraction if self.current else self.done
        share = progress / self.total
        elapsed = time.perf_counter() - self.start
        rate = (progress - self.start_done) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - progress) / rate if rate > 0 else None
        bar = "#" * int(30 * share) + "-" * (30 - int(30 * share))
        return (f"[{bar}] {100 * share:3.0f}%  {human_duration(elapsed)} elapsed, "
                f"{time_left(eta)}  {self.current}")

    def _print(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.stream is not None and (force or now - self._last >= self.min_interval_s):
            print(f"[reproduce] {self.line()}", file=self.stream, flush=True)
            self._last = now
