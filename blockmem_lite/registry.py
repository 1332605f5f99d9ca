"""The mechanism registry: every architecture the kit knows, built in or plugged in.

A mechanism is one module that declares everything about itself and ends with::

    register(Mechanism(name="bcmt", model=BCMTLM, summary="...", options=BCMTOptions,
                       flops=flops_per_token, presets={...}, bench_options=(...),
                       bench_variants=..., trace_keys=(...)))

The core (config, train, metrics, bench, viz, tasks, corpora, the CLI) asks
this registry and never names a mechanism; the only name it knows is the
baseline every ratio is measured against (``BASELINE``).

A user's mechanism is a first-class citizen: a Python file passed to
``load_plugin`` (``--plugin FILE`` on the command line) that calls ``register``
when imported, or an installed package exposing the entry point group
``blockmem_lite.mechanisms`` (its object is a ``Mechanism``, a function that
registers, or a module that registers when imported).

This module sits below ``config`` (``ModelConfig`` builds and validates each
mechanism's options through it), so it imports nothing of the kit but
``validation``. The built-in mechanisms register when ``blockmem_lite.mechanisms``
is imported (one module per mechanism), which ``import blockmem_lite`` always does first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import re
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from blockmem_lite.validation import fail

BASELINE = "dense"                       # the architecture every ratio is measured against
ENTRY_POINT_GROUP = "blockmem_lite.mechanisms"
PRESET_NAMES = ("tiny", "fast", "class", "gpu")
BUILTIN = "builtin"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass
class Options:
    """Base class of a mechanism's own config fields (subclass it as a dataclass).

    Each field is reachable as ``cfg.<field>`` on a ``ModelConfig`` of that
    architecture and from the command line as ``--set field=value``. Give a
    field ``metadata={"help": "..."}`` and ``train --help`` shows it.
    ``validate(cfg)`` raises ``ValueError`` (``validation.fail``) for bad values;
    ``cfg`` is the whole ModelConfig, so limits may depend on ``seq_len`` etc.
    """

    def validate(self, cfg) -> None:
        """Check this mechanism's fields against the whole config (default: nothing)."""

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def describe(cls) -> list[str]:
        """``name=default  help`` per field, for ``--help`` texts."""
        lines = []
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"{f.name}={default!r}  {f.metadata.get('help', '')}".rstrip())
        return lines


@dataclass(frozen=True)
class BenchOption:
    """A ``bench`` command-line option a mechanism adds, e.g. ``--block-size 64,128``."""

    flag: str
    default: str
    help: str

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class SpecialBench:
    """A benchmark a mechanism owns beyond the train / decode phases.

    ``run(options, bench) -> records``: ``options`` maps every bench option's
    ``dest`` to its string value; ``bench`` is the bench core's context
    (``bench.BenchContext``: timing, memory, models, records), so the
    mechanism needs no import of the measuring layer. Records carry ``phase``
    = ``name``; ``columns`` ((header, record -> text), ...) lay out their table
    under ``title(records)``, followed by ``footer(records)`` lines.
    """

    name: str
    run: Callable[[dict, object], list[dict]]
    columns: tuple[tuple[str, Callable[[dict], str]], ...]
    title: Callable[[list[dict]], str]
    footer: Callable[[list[dict]], list[str]] = lambda records: []


@dataclass(frozen=True)
class Claim:
    """One headline figure of a paper, stored as data, and the kit measurement that answers it.

    ``paper``, ``arxiv``, ``where`` (table or section), ``quantity``, ``value`` and
    ``unit``, and the paper's ``setting`` (model size, data, hardware, baseline)
    are what the paper states. ``statement`` is the claim in words, e.g. "faster
    than dense in training". ``kit(results)`` returns the kit's comparable value
    from a ``lab.reproduce`` result (None when the run did not measure it);
    ``holds(value)`` says whether the statement holds for that value;
    ``ceiling(results)``, optional, the FLOP ceiling the value is bounded by.
    ``comparable=False`` marks a claim the kit cannot test at its scale, with
    the reason in ``note``.
    """

    key: str
    paper: str
    arxiv: str
    where: str
    quantity: str
    value: float | None
    unit: str
    setting: str
    statement: str
    kit: Callable[[dict], float | None] | None = None
    holds: Callable[[float], bool] | None = None
    ceiling: Callable[[dict], float | None] | None = None
    comparable: bool = True
    note: str = ""


@dataclass(frozen=True)
class LabSpec:
    """How the comparison lab (``lab.reproduce``) runs a mechanism, where it needs more than
    "train it, measure it":

    * ``config(cfg) -> cfg``: the config the lab trains (e.g. CAT's multi-chunk model);
    * ``variants(cfg) -> [(label, overrides)]``: settings of one trained model measured
      apart (e.g. each chunk size); ``switch(model, overrides)`` puts a trained model in
      that setting (a fresh one for the bench is built with the overrides);
    * ``start(cfg, trained) -> model``: build from models already trained in the run
      (``trained`` maps entry labels to models; e.g. ARMT wraps the trained dense);
    * ``iso_flop_baseline``: also train a dense model of (nearly) its FLOPs per token
      (``metrics.iso_flop_dense_config``), the fair baseline of a mechanism that adds work;
    * ``local_span(cfg) -> int | None``: how far back a token sees exactly (a block, a chunk,
      a segment): recall beyond it is what the memory must carry;
    * ``recall_span(cfg, span) -> cfg``: the config at local span ``span`` (the recall
      experiment, ``recall.RecallRecipe``, sets every mechanism to one span);
    * ``twin(cfg) -> cfg``: the memory-less twin, the same model and span with the memory
      path off; the memory "pays" when the mechanism recalls beyond the span and it cannot;
    * ``memory_slots(cfg, n_pairs) -> int``: the memory's analytic capacity in the slot
      model (``recall.slot_accuracy``): how many slots a query can address when ``n_pairs``
      key-value pairs sit at the start of the row (0 for a twin: it has no memory);
    * ``recall_curriculum``: train the recall models (mechanism and twin) in the stages of
      ``recall.curriculum``, short rows first (ARMT's segment curriculum).
    """

    config: Callable | None = None
    variants: Callable | None = None
    switch: Callable | None = None
    start: Callable | None = None
    iso_flop_baseline: bool = False
    local_span: Callable | None = None
    recall_span: Callable | None = None
    twin: Callable | None = None
    memory_slots: Callable | None = None
    recall_curriculum: bool = False


def single_variant(options: dict) -> list[tuple[str, dict]]:
    """The bench variants of a mechanism without sweep options: itself, unlabelled."""
    return [("", {})]


@dataclass(frozen=True)
class Mechanism:
    """Everything the kit needs to know about one architecture.

    * ``model(cfg) -> LanguageModel``; ``summary``: one line for ``--help``;
    * ``options``: its config fields (an ``Options`` dataclass), validated there;
    * ``flops(cfg, seq_len, decode) -> forward FLOPs per token`` (LM head
      included; ``decode=True``: one decoding step at context ``seq_len``),
      or None where no model exists; the bench prints ceilings from it;
    * ``state_bytes(cfg, t) -> bytes``: the analytic size of the decoding state after t
      tokens (fp32), drawn beside the measured one;
    * ``presets``: {preset name: {option: value}}, its sizes per preset;
    * ``bench_options`` and ``bench_variants(options) -> [(label, overrides)]``:
      how a sweep value becomes a config and a label;
    * ``trace_keys``: the names it records under ``trace`` (glob patterns
      after the ``layer{i}.`` style scopes, e.g. ``"layer*.gate"``);
    * ``boundary_fields``: options whose values are block / segment / chunk
      lengths; ``checks.check_causal`` probes their boundaries, where causal
      mechanisms most often leak;
    * ``special_benches``: benchmarks of its own (``SpecialBench``);
    * ``claims``: the paper's headline figures (``Claim``) and how the kit answers them;
    * ``lab``: how the comparison lab runs it (``LabSpec``; default: train and measure).

    ``source`` is filled in by ``register``: "builtin", the plugin file, or
    "entry point NAME"; "" for one defined in a notebook or an interactive
    session (fine everywhere except measurements in a fresh process).
    """

    name: str
    model: Callable
    summary: str
    options: type = Options
    flops: Callable | None = None
    state_bytes: Callable | None = None
    presets: Mapping[str, Mapping] = field(default_factory=dict)
    bench_options: tuple[BenchOption, ...] = ()
    bench_variants: Callable[[dict], list[tuple[str, dict]]] = single_variant
    trace_keys: tuple[str, ...] = ()
    boundary_fields: tuple[str, ...] = ()
    special_benches: tuple[SpecialBench, ...] = ()
    claims: tuple[Claim, ...] = ()
    lab: LabSpec = field(default_factory=LabSpec)
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            fail("name", self.name, "expected lower-case letters, digits and _, starting with "
                                    "a letter (it is the arch name, e.g. 'swa')")
        if not callable(self.model):
            fail("model", self.model, "expected a LanguageModel class or a function cfg -> model")
        if not (isinstance(self.options, type) and issubclass(self.options, Options)
                and dataclasses.is_dataclass(self.options)):
            fail("options", self.options, "expected a dataclass subclassing registry.Options")
        for preset_name, values in self.presets.items():
            if preset_name not in PRESET_NAMES:
                fail("presets", preset_name, f"expected preset names among {', '.join(PRESET_NAMES)}")
            unknown = set(values) - set(self.options.field_names())
            if unknown:
                fail("presets", dict(values), f"{', '.join(sorted(unknown))} are not fields of "
                                              f"{self.options.__name__}")
        unknown = set(self.boundary_fields) - set(self.options.field_names())
        if unknown:
            fail("boundary_fields", self.boundary_fields,
                 f"{', '.join(sorted(unknown))} are not fields of {self.options.__name__}")


_REGISTRY: dict[str, Mechanism] = {}
_loading: list[str] = []                 # the plugin file or entry point being imported
_entry_points_loaded = False


def _source_of(mechanism: Mechanism) -> str:
    if _loading:
        return _loading[-1]
    module = sys.modules.get(getattr(mechanism.model, "__module__", ""), None)
    name = getattr(module, "__name__", "")
    if name == "blockmem_lite" or name.startswith("blockmem_lite."):
        return BUILTIN
    path = getattr(module, "__file__", None)
    return str(Path(path).resolve()) if path and name != "__main__" else ""


def register(mechanism: Mechanism) -> Mechanism:
    """Make the kit know ``mechanism`` by its name; returns it with ``source`` filled in.

    Registering a name again replaces a plugin's entry (re-running a notebook
    cell is fine) but never a built-in one.
    """
    if not isinstance(mechanism, Mechanism):
        fail("mechanism", mechanism, "expected a registry.Mechanism(...)")
    mechanism = dataclasses.replace(mechanism, source=_source_of(mechanism))
    old = _REGISTRY.get(mechanism.name)
    if old is not None and old.source == BUILTIN and mechanism.source != BUILTIN:
        fail("name", mechanism.name, f"a built-in mechanism has that name; choose another "
                                     f"(taken: {', '.join(sorted(_REGISTRY))})")
    _REGISTRY[mechanism.name] = mechanism
    return mechanism


def unregister(name: str) -> None:
    """Forget a plugin mechanism (built-ins stay)."""
    if name in _REGISTRY and _REGISTRY[name].source != BUILTIN:
        del _REGISTRY[name]


def names() -> list[str]:
    """Every registered architecture name, sorted (installed entry points included)."""
    load_entry_points()
    return sorted(_REGISTRY)


def mechanisms() -> list[Mechanism]:
    return [_REGISTRY[n] for n in names()]


def get(name: str) -> Mechanism:
    """The mechanism called ``name``; a clear error naming the known ones otherwise."""
    if name not in _REGISTRY:
        load_entry_points()
    if name not in _REGISTRY:
        fail("arch", name, f"known architectures are {', '.join(names())} (a plugin of yours "
                           "needs --plugin FILE or blockmem_lite.load_plugin(FILE))")
    return _REGISTRY[name]


def option_owners(field_name: str) -> list[str]:
    """Names of the mechanisms that have an option called ``field_name``."""
    return [m.name for m in mechanisms() if field_name in m.options.field_names()]


@contextlib.contextmanager
def _importing(source: str):
    _loading.append(source)
    try:
        yield
    finally:
        _loading.pop()


def _from_source(source: str) -> list[str]:
    return sorted(n for n, m in _REGISTRY.items() if m.source == source)


def load_plugin(path) -> list[str]:
    """Import the Python file at ``path``, which registers one or more mechanisms.

    Returns the names it registered. Loading the same file again does nothing
    (its mechanisms stay registered). Errors name the file and what went wrong.
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file() or resolved.suffix != ".py":
        fail("plugin", str(path), "expected an existing .py file that calls "
                                  "blockmem_lite.register_mechanism(Mechanism(...)) when imported")
    source = str(resolved)
    if _from_source(source):
        return _from_source(source)
    digest = hashlib.sha1(source.encode()).hexdigest()[:8]
    module_name = f"blockmem_lite_plugin_{re.sub(r'[^0-9a-zA-Z_]', '_', resolved.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        with _importing(source):
            spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(module_name, None)
        raise ValueError(f"plugin {source} failed to import: {type(err).__name__}: {err}") from err
    registered = _from_source(source)
    if not registered:
        raise ValueError(f"plugin {source} registered no mechanism: it must call "
                         "blockmem_lite.register_mechanism(Mechanism(...)) when imported")
    return registered


def load_entry_points() -> list[str]:
    """Register the mechanisms of installed packages (entry point group
    ``blockmem_lite.mechanisms``), once per process; a broken one only warns."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return []
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    before = set(_REGISTRY)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        source = f"entry point {point.name}"
        try:
            with _importing(source):
                loaded = point.load()
                if isinstance(loaded, Mechanism):
                    register(loaded)
                elif callable(loaded) and not isinstance(loaded, type):
                    loaded()
        except Exception as err:   # a third-party plugin must not break the kit
            warnings.warn(f"mechanism plugin {point.name!r} ({point.value}) failed to load: "
                          f"{type(err).__name__}: {err}", stacklevel=2)
    return sorted(set(_REGISTRY) - before)


def plugin_file(name: str) -> str | None:
    """The file a fresh process must load to know mechanism ``name`` (None: nothing to load).

    A ValueError for mechanisms defined in a notebook or session, which a fresh
    process cannot rebuild.
    """
    source = get(name).source
    if source == BUILTIN or source.startswith("entry point "):
        return None
    if not source:
        fail("arch", name, "is defined in this session only, so a fresh process cannot build "
                           "it: save it in a .py file and load_plugin(FILE) (or --plugin FILE), "
                           "or measure without a subprocess (e.g. bench memory 'saved')")
    return source
