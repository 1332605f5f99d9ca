"""Memory-size sweeps: one knob of one mechanism at several values, each model trained with
the recall recipe (``recall.RecallRecipe``) and asked beyond its span with 1 ... n_pairs
pairs, beside the slot model of its capacity (``recall.slot_curve``). Zoology draws MQAR
accuracy against model dimension; here it is against the size of each memory, so "not
learned" becomes "this memory holds about N pairs" or "it could hold them and did not".

``python -m blockmem_lite sweep --arch armt --knob n_mem_tokens`` sweeps any numeric option
of a mechanism, a plugin's too; its values default to the option's ``knob(...,
recall_sweep=...)``. ``--knob steps`` sweeps the training budget instead (the recipe's steps,
in each stage of a curriculum): the accuracy against budget that tells a memory short of
its slot model by training how far from it that training is. OUT/<arch>-<knob>.json keeps
every finished point, so a stopped sweep goes on where it stopped, and
OUT/<arch>-<knob>.html draws it (``lab.figures.memory_sweep``; plotly.js beside it, so it
opens offline).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from blockmem_lite import course, recall, registry
from blockmem_lite.checkpoints import atomic_write_bytes, prepare_folder
from blockmem_lite.config import ModelConfig, preset
from blockmem_lite.measure import bench
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import pick_device, seed_everything
from blockmem_lite.train import Trainer
from blockmem_lite.validation import check_choice, fail, parse_int_list

SWEEP_FORMAT = "blockmem_lite.recall_sweep/1"
RECIPE_KNOBS = {"steps": int}      # knobs of the recall recipe, not of the model: the budget

def default_sweeps() -> dict[tuple[str, str], tuple]:
    """{(arch, option): values} of every registered mechanism's knobs declared with
    ``knob(..., recall_sweep=...)``: what ``sweep`` trains when no ``--values`` are given."""
    return {(arch, name): meta.recall_sweep for arch in registry.names()
            for name, meta in registry.knobs_of(registry.get(arch).options).items()
            if meta.recall_sweep}


def sweepable(arch: str) -> dict[str, type]:
    """{option: its type} of the numeric options of ``arch`` and, for a mechanism that has
    some, the recipe's budget (``RECIPE_KNOBS``): any of them can be swept."""
    fields = dataclasses.fields(registry.get(arch).options)
    options = {f.name: type(f.default) for f in fields if type(f.default) in (int, float)}
    return {**options, **RECIPE_KNOBS} if options else {}


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One value of the knob, the config trained at it and the recipe's settings it
    changes (the budget sweep's steps)."""

    value: float
    cfg: ModelConfig
    recipe_changes: tuple = ()              # ((field, value), ...) of the recall recipe

    def recipe(self, recipe: recall.RecallRecipe) -> recall.RecallRecipe:
        return dataclasses.replace(recipe, **dict(self.recipe_changes))


def points(arch: str, knob: str, values, recipe: recall.RecallRecipe) -> list[SweepPoint]:
    """The configs of a sweep, checked before anything trains: the mechanism's own model
    (its default options, not the lab's variant of it) at the recipe's sizes and span, with
    ``knob`` at each value. Rows keep the recipe's layout, so sweeping a span knob (BCMT's
    block, CAT's chunk) puts the same pairs in more or fewer spans."""
    check_choice("--arch", arch, registry.names())
    kinds = sweepable(arch)
    if not kinds:
        fail("--arch", arch, "has no numeric option to sweep")
    check_choice("--knob", knob, sorted(kinds))
    if not values:
        fail("--values", values, f"{arch} {knob} has no default sweep; give the values, "
                                 "e.g. --values 1,2,4")
    base = recipe.model_config(preset("tiny", arch=arch).model)
    if knob in RECIPE_KNOBS:
        if any(kinds[knob](v) < 1 for v in values):
            fail("--values", values, f"expected {knob} >= 1")
        return [SweepPoint(value, base, ((knob, kinds[knob](value)),)) for value in values]
    return [SweepPoint(value, dataclasses.replace(base, **{knob: kinds[knob](value)}))
            for value in values]


def train_point(point: SweepPoint, recipe: recall.RecallRecipe, seed: int,
                callbacks=()) -> dict:
    """Train one recall model of ``point`` at ``seed`` and measure its capacity curve."""
    recipe = point.recipe(recipe)
    run = preset("tiny", arch=point.cfg.arch)
    seed_everything(seed)
    model = build_model(point.cfg)

    def trainer_for(stage: recall.RecallRecipe, rows, k: int) -> Trainer:
        return Trainer(model, stage.train_config(run.train, seed), rows, callbacks=callbacks)

    history = recall.train(recipe, trainer_for,
                           staged=registry.lab_spec(point.cfg.arch).recall_curriculum)
    if history.interrupted:          # a stop (Ctrl-C, SIGTERM): nothing half-trained is stored
        raise KeyboardInterrupt
    return {"capacity": recall.capacity(model, recipe), "beyond": recall.beyond(model, recipe)}


def run_sweep(arch: str, knob: str, values=None, preset_name: str = "class", seeds=None,
              out="runs/sweeps", progress: bool = True) -> dict:
    """Every point of the sweep not stored yet in OUT/<arch>-<knob>.json; returns the record
    (one entry per value: the capacity curve over seeds, the slot model, the minutes)."""
    check_choice("--preset", preset_name, tuple(recall.RECALL_SIZES))
    recipe = recall.RECALL_SIZES[preset_name]
    values = tuple(values or default_sweeps().get((arch, knob), ())
                   or ((recipe.steps, 2 * recipe.steps, 4 * recipe.steps) if knob == "steps"
                       else ()))
    sweep = points(arch, knob, values, recipe)
    seeds = tuple(seeds or recipe.seeds[:1])
    path = prepare_folder(out, name="--out") / f"{arch}-{knob}.json"
    record = _load(path, {"format": SWEEP_FORMAT, "arch": arch, "knob": knob,
                          "preset": preset_name, "seeds": list(seeds),
                          "chance": recall.chance(recipe),
                          "recipe": json.loads(json.dumps(dataclasses.asdict(recipe))),
                          "stages": [s.seq_len for s in recall.stages(
                              recipe, registry.lab_spec(arch).recall_curriculum)]})
    record["machine"] = bench.machine(pick_device("auto"))
    record["threads"] = torch.get_num_threads()   # float sums (and so ARMT's run) depend on it
    for i, point in enumerate(sweep, start=1):
        key = str(point.value)
        if key in record["points"]:
            continue
        if progress:
            print(f"[{i}/{len(sweep)}] {arch} {knob}={point.value}: training "
                  f"{len(seeds)} seed(s)", file=sys.stderr, flush=True)
        start = time.perf_counter()
        curves = [train_point(point, recipe, seed)["capacity"] for seed in seeds]
        record["points"][key] = {"value": point.value, "capacity": recall.combine_curve(curves),
                                 "slot_model": recall.slot_curve(point.cfg, point.recipe(recipe)),
                                 "minutes": (time.perf_counter() - start) / 60}
        atomic_write_bytes(path, json.dumps(record, indent=1).encode())
    return record


def shipped_folder() -> Path | None:
    """Where the kit keeps the sweeps it measured on a 2-core CPU (beside its class run, in a
    checkout or an installed wheel); None in an install that carries none."""
    runs = course.shipped_runs()
    return runs / "class_cpu" / "sweeps" if runs else None


def shipped(arch: str, knob: str) -> dict | None:
    """The sweep of ``knob`` the kit ships for ``arch`` (None where this install has none,
    e.g. an install without the course)."""
    folder = shipped_folder()
    path = folder / f"{arch}-{knob}.json" if folder else None
    return json.loads(path.read_text(encoding="utf-8")) if path and path.is_file() else None


def _load(path: Path, meta: dict) -> dict:
    """The stored sweep at ``path`` (same settings) or a new one."""
    if not path.is_file():
        return {**meta, "points": {}}
    stored = json.loads(path.read_text())
    changed = [k for k in meta if stored.get(k) != meta[k]]
    if changed:
        fail("--out", str(path.parent), f"holds a sweep with other settings "
                                        f"({', '.join(changed)} differ); use another folder")
    return stored


# --- command line --------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m blockmem_lite sweep",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train one recall model per value of a memory's size knob and draw its "
                    "beyond-span accuracy against the number of pairs beside the slot model "
                    "of that memory's capacity (--knob steps: against the training budget). "
                    "Stopped, it goes on where it stopped.",
        epilog="default sweeps (arch knob: values; any numeric option of a mechanism, a "
               "plugin's too, sweeps with --values):\n" + "\n".join(
            f"  {a} {k}: {','.join(map(str, v))}" for (a, k), v in default_sweeps().items()))
    p.add_argument("--arch", required=True, help="mechanism (--plugin FILE adds yours)")
    p.add_argument("--knob", required=True, help="a numeric option of it, e.g. n_mem_tokens, or "
                   "steps (the recipe's training budget; default values: 1, 2 and 4 times it)")
    p.add_argument("--values", default=None, help="comma-separated (default: below)")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE",
                   help="a Python file that registers a mechanism (repeatable)")
    p.add_argument("--preset", default="class", help="recall recipe: "
                                                     + ", ".join(recall.RECALL_SIZES))
    p.add_argument("--seeds", default=None, help="comma-separated (default: the recipe's first)")
    p.add_argument("--out", default="runs/sweeps", help="output folder")
    return p


def _values(arch: str, knob: str, text: str | None):
    if text is None:
        return None
    kind = sweepable(arch).get(knob, float) if arch in registry.names() else float
    try:
        return [kind(v) for v in text.split(",")]
    except ValueError:
        fail("--values", text, f"expected comma-separated {kind.__name__}s, e.g. 1,2,4,8")


def main(argv: list[str] | None = None) -> int:
    """``python -m blockmem_lite sweep ...``; returns the exit status."""
    args = parser().parse_args(argv)
    out = Path(args.out)
    try:
        for plugin in args.plugin:
            registry.load_plugin(plugin)
        seeds = parse_int_list("--seeds", args.seeds, minimum=0) if args.seeds else None
        record = run_sweep(args.arch, args.knob, _values(args.arch, args.knob, args.values),
                           args.preset, seeds, out)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"stopped; the finished points are kept in {out}: run the same command again "
              "to continue", file=sys.stderr)
        return 130
    path = out / f"{args.arch}-{args.knob}.json"
    try:
        from blockmem_lite.lab import figures
    except ImportError as err:
        print(f"wrote {path} (no plot: {err})")
        return 0
    html = path.with_suffix(".html")
    figures.memory_sweep(record).write_html(html, include_plotlyjs="directory")
    print(f"wrote {path} and {html}")
    print(summary(record))
    return 0


def summary(record: dict) -> str:
    """One line per value: accuracy by pairs, measured against the slot model."""
    lines = [f"{record['arch']} {record['knob']} (beyond-span accuracy by pairs: measured / "
             "slot model)"]
    for point in record["points"].values():
        cells = " ".join(f"{m['n_pairs']}:{m['accuracy']:.2f}/{s['accuracy']:.2f}"
                         for m, s in zip(point["capacity"], point["slot_model"], strict=True))
        lines.append(f"  {record['knob']}={point['value']}: {cells}  "
                     f"({point['minutes']:.1f} min)")
    return "\n".join(lines)
