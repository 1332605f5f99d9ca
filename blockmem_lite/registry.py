"""The mechanism registry: every architecture the kit knows, built in or plugged in.

A mechanism declares its knobs once, on its options (``knob``: default, help, bench
symbol and sweep, per-preset values, whether it sets the local span), and registers
a six-field record::

    @dataclass
    class BCMTOptions(Options):
        block_size: int = knob(64, help="L: tokens per block", symbol="L", sweep=(64, 128),
                               presets={"tiny": 8, "fast": 16}, span=True)

    register(Mechanism(name="bcmt", model=BCMTLM, options=BCMTOptions,
                       flops=flops_per_token, state_bytes=state_bytes, summary="..."))

The bench flag (``--block-size``), the variants and their labels (``L=64``), the presets,
the boundaries ``check_causal`` probes and the local span all derive from the knobs.
Two optional records sit beside it: ``register_bench`` (bench options of its own,
variants, special benches) and ``register_lab`` (how the lab runs it, its claims).

The core (config, train, metrics, bench, viz, tasks, corpora, the CLI) asks
this registry and never names a mechanism; the only name it knows is the
baseline every ratio is measured against (``BASELINE``).

A user's mechanism is a first-class citizen: a Python file passed to
``load_plugin`` (``--plugin FILE`` on the command line) that calls ``register``
when imported, or an installed package exposing the entry point group
``blockmem_lite.mechanisms`` (its object is a ``Mechanism``, a function that
registers, or a module that registers when imported).

It sits below ``config`` and imports nothing of the kit but ``validation``; the built-in
mechanisms register when ``import blockmem_lite`` imports ``blockmem_lite.mechanisms``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import itertools
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

from blockmem_lite.validation import fail, parse_int_list

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
class Knob:
    """What the kit derives from one option field, declared once on the field (``knob``).

    * ``symbol``: the letter of bench labels (``"L"`` -> ``L=64``);
    * ``sweep``: the values ``bench`` times by default; the field then has a bench flag
      (``block_size`` -> ``--block-size 64,128``) and each value is a variant;
    * ``presets``: {preset name: value}, its size per preset (``config.preset``);
    * ``span``: its value is the local span (a block, segment or chunk: how far back a
      token sees exactly); the recall experiment sets it and ``check_causal`` probes it;
    * ``boundary``: a length whose boundaries ``check_causal`` probes (``span`` is one);
    * ``recall_sweep``: the values the memory-size sweep (``sweep --knob``) trains by default.
    """

    symbol: str | None = None
    sweep: tuple = ()
    presets: Mapping[str, object] = field(default_factory=dict)
    span: bool = False
    boundary: bool = False
    recall_sweep: tuple = ()


def knob(default=dataclasses.MISSING, *, help: str, symbol: str | None = None,  # noqa: A002
         sweep=(), presets: Mapping[str, object] | None = None, span: bool = False,
         boundary: bool = False, recall_sweep=()):
    """An ``Options`` field with its help and the ``Knob`` metadata the registry derives the
    bench flag, variants, presets, boundaries and local span from (the module's example)."""
    meta = Knob(symbol, tuple(sweep), dict(presets or {}), span, boundary or span,
                tuple(recall_sweep))
    return field(default=default, metadata={"help": help, "knob": meta})


def knobs_of(options: type) -> dict[str, Knob]:
    """{field name: Knob} of an Options class (fields declared without ``knob``: a plain Knob)."""
    return {f.name: f.metadata.get("knob", Knob()) for f in dataclasses.fields(options)}


def check_int_list(name: str, values, allow_empty: bool = False) -> None:
    """A typed bench value: a list or tuple of ints >= 1 (non-empty unless ``allow_empty``)."""
    if not isinstance(values, (list, tuple)) or (not values and not allow_empty) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        fail(name, values, "expected a list of integers >= 1, e.g. [16, 32]")


def int_list(flag: str):
    """The parser of a comma-separated list of positive ints, for option ``flag``."""
    return lambda text: parse_int_list(flag, text)


@dataclass(frozen=True)
class BenchOption:
    """A ``bench`` option beyond the swept knobs (e.g. MoC's ``--bank-tokens 512,8192``).

    ``default`` is a typed value, as the Python API (``bench.run_bench(options=...)``)
    takes it; ``parse(text) -> value`` reads the command line's string (default: a
    comma-separated list of positive ints).
    """

    flag: str
    default: object
    help: str
    parse: Callable[[str], object] | None = None
    check: Callable[[object], object] | None = None

    def validate(self, value) -> None:
        """Refuse a bad typed value (a ValueError naming the option) before any timing;
        a string is the command line's form, read by ``read``."""
        if isinstance(value, str) and self.parse is None:
            fail(self.dest, value, f"expected a list of values, e.g. {self.default!r} "
                                   f"(a string is the command line's form: {self.flag} TEXT)")
        (self.check or (lambda v: check_int_list(self.dest, v)))(value)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def read(self, text: str):
        """The typed value of the command line's ``text``."""
        return (self.parse or int_list(self.flag))(text)


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
      ``recall.curriculum``, short rows first (ARMT's segment curriculum);
    * ``claims``: its paper's headline figures (``Claim``) and how the kit answers them.

    ``local_span`` and ``recall_span`` default to the option declared with
    ``knob(..., span=True)``, where there is one (``lab_spec``).
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
    claims: tuple[Claim, ...] = ()


@dataclass(frozen=True)
class BenchSpec:
    """What ``bench`` runs of a mechanism beyond its swept knobs (optional, ``register_bench``):

    * ``options``: bench options of its own (``BenchOption``), e.g. MoC's bank sizes;
    * ``variants(values) -> [(label, overrides)]``: the configs one bench run times, from
      every bench option's typed value (``values`` maps ``dest`` -> value); default: every
      combination of the swept knobs, labelled by their symbols (``C=16 w=2``);
    * ``specials``: benchmarks of its own beyond train and decode (``SpecialBench``);
    * ``prepare(model, cfg)``: run on every model the bench builds (also in the RSS
      process) before anything runs, e.g. CAT pins its training chunk size to the record's C.
    """

    options: tuple[BenchOption, ...] = ()
    variants: Callable[[dict], list[tuple[str, dict]]] | None = None
    specials: tuple[SpecialBench, ...] = ()
    prepare: Callable | None = None


@dataclass(frozen=True)
class Mechanism:
    """Everything the kit needs to know about one architecture.

    * ``model(cfg) -> LanguageModel``; ``summary``: one line for ``--help``;
    * ``options``: its config fields (an ``Options`` dataclass), validated there; their
      ``knob`` metadata gives the bench flags and variants, the presets, the boundaries
      ``checks.check_causal`` probes and the local span;
    * ``flops(cfg, seq_len, decode) -> forward FLOPs per token`` (LM head
      included; ``decode=True``: one decoding step at context ``seq_len``),
      or None where no model exists; the bench prints ceilings from it;
    * ``state_bytes(cfg, t) -> bytes``: the analytic size of the decoding state after t
      tokens (fp32), drawn beside the measured one.

    Beside it, optional: ``register_bench(name, BenchSpec(...))`` (bench options of its
    own, variants, special benches) and ``register_lab(name, LabSpec(...))`` (how the lab
    runs it, its paper's claims). The names it records under ``trace`` are its model's
    ``trace_keys``.
    """

    name: str
    model: Callable
    options: type = Options
    flops: Callable | None = None
    state_bytes: Callable | None = None
    summary: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            fail("name", self.name, "expected lower-case letters, digits and _, starting with "
                                    "a letter (it is the arch name, e.g. 'swa')")
        if not callable(self.model):
            fail("model", self.model, "expected a LanguageModel class or a function cfg -> model")
        if not (isinstance(self.options, type) and issubclass(self.options, Options)
                and dataclasses.is_dataclass(self.options)):
            fail("options", self.options, "expected a dataclass subclassing registry.Options")
        for name, meta in knobs_of(self.options).items():
            unknown = set(meta.presets) - set(PRESET_NAMES)
            if unknown:
                fail(f"{self.options.__name__}.{name} presets", dict(meta.presets),
                     f"expected preset names among {', '.join(PRESET_NAMES)}")
        spans = [name for name, meta in knobs_of(self.options).items() if meta.span]
        if len(spans) > 1:
            fail(f"{self.options.__name__} span knobs", spans, "expected at most one field "
                 "declared with span=True (the local span)")


# --- what the registry derives from the knobs ------------------------------------------------

def preset_values(name: str, preset_name: str) -> dict:
    """{option: value} of mechanism ``name`` at preset ``preset_name`` (its knobs' presets)."""
    return {f: meta.presets[preset_name] for f, meta in knobs_of(get(name).options).items()
            if preset_name in meta.presets}


def boundary_fields(name: str) -> tuple[str, ...]:
    """Options of ``name`` whose values are block / segment / chunk lengths."""
    return tuple(f for f, meta in knobs_of(get(name).options).items() if meta.boundary)


def span_field(name: str) -> str | None:
    """The option of ``name`` that sets its local span (``knob(..., span=True)``), if any."""
    return next((f for f, meta in knobs_of(get(name).options).items() if meta.span), None)


def swept_knobs(name: str) -> dict[str, Knob]:
    """{option: Knob} of the knobs of ``name`` that ``bench`` sweeps."""
    return {f: meta for f, meta in knobs_of(get(name).options).items() if meta.sweep}


def knob_option(name: str, field_name: str) -> BenchOption:
    """The bench flag of a swept knob: ``block_size`` -> ``--block-size``, its sweep the default."""
    f = next(f for f in dataclasses.fields(get(name).options) if f.name == field_name)
    flag = "--" + field_name.replace("_", "-")
    return BenchOption(flag, list(f.metadata["knob"].sweep), f.metadata.get("help", ""))


def knob_variants(name: str, values: dict) -> list[tuple[str, dict]]:
    """Every combination of the swept knobs' ``values`` (first knob fastest), labelled by
    their symbols: [("C=16 w=2", {"chunk_size": 16, "decoder_width": 2}), ...]."""
    swept = swept_knobs(name)
    if not swept:
        return [("", {})]
    grid = [[(f, v) for v in values[f]] for f in reversed(list(swept))]
    combos = [tuple(reversed(c)) for c in itertools.product(*grid)]
    return [(" ".join(f"{swept[f].symbol or f}={v}" for f, v in combo), dict(combo))
            for combo in combos]


_BENCH: dict[str, BenchSpec] = {}
_LAB: dict[str, LabSpec] = {}


def _register_spec(table: dict, name: str, spec, kind: type):
    if not isinstance(spec, kind):
        fail("spec", spec, f"expected a registry.{kind.__name__}(...)")
    table[name] = spec
    return spec


def register_bench(name: str, spec: BenchSpec) -> BenchSpec:
    """Give mechanism ``name`` bench options, variants or special benches of its own."""
    return _register_spec(_BENCH, name, spec, BenchSpec)


def bench_spec(name: str) -> BenchSpec:
    """The ``BenchSpec`` of ``name`` (an empty one where none was registered)."""
    get(name)
    return _BENCH.get(name, BenchSpec())


def bench_options(name: str) -> tuple[BenchOption, ...]:
    """The bench options of ``name``: a flag per swept knob, then its ``BenchSpec``'s own."""
    return (*(knob_option(name, f) for f in swept_knobs(name)), *bench_spec(name).options)


def bench_variants(name: str, values: dict) -> list[tuple[str, dict]]:
    """[(label, overrides)] one bench run times for ``name`` at the typed option ``values``
    (by ``dest``): its ``BenchSpec.variants``, else every combination of its swept knobs."""
    variants = bench_spec(name).variants
    return variants(values) if variants else knob_variants(name, values)


def shared_bench_options() -> dict[str, tuple[BenchOption, list[str]]]:
    """Each mechanism bench option once (several may share one, e.g. --block-size), with users."""
    out: dict[str, tuple[BenchOption, list[str]]] = {}
    for name in names():
        for opt in bench_options(name):
            out.setdefault(opt.flag, (opt, []))[1].append(name)
    return out


def default_bench_options() -> dict:
    """Every registered bench option's default (typed) value, by ``dest``."""
    return {opt.dest: opt.default for opt, _ in shared_bench_options().values()}


def checked_bench_options(options: dict | None) -> dict:
    """The defaults updated with ``options`` (typed values by ``dest``, e.g.
    ``{"window": [16, 32]}``; one int stands for a list of one), each checked before any
    timing; an unknown name is refused with the known ones."""
    known = {opt.dest: opt for opt, _ in shared_bench_options().values()}
    values = default_bench_options()
    for name, value in (options or {}).items():
        if name not in known:
            fail("options", name, f"expected bench options among {', '.join(sorted(known))}")
        if isinstance(known[name].default, list) and isinstance(value, int) \
                and not isinstance(value, bool):
            value = [value]
        known[name].validate(value)
        values[name] = list(value) if isinstance(value, tuple) else value
    return values


def register_lab(name: str, spec: LabSpec) -> LabSpec:
    """Tell the comparison lab how to run mechanism ``name`` and which claims it answers."""
    return _register_spec(_LAB, name, spec, LabSpec)


def lab_spec(name: str) -> LabSpec:
    """The ``LabSpec`` of ``name``, its local span and recall span defaulting to the span knob."""
    spec = _LAB.get(name, LabSpec())
    span = span_field(name)
    if span is None:
        return spec
    return dataclasses.replace(
        spec, local_span=spec.local_span or (lambda cfg: getattr(cfg, span)),
        recall_span=spec.recall_span or (lambda cfg, n: dataclasses.replace(cfg, **{span: n})))


_REGISTRY: dict[str, Mechanism] = {}
_SOURCES: dict[str, str] = {}            # name -> "builtin", the plugin file, "entry point X", ""
_loading: list[str] = []                 # the plugin file or entry point being imported
_entry_points_loaded = False


def _source_of(mechanism: Mechanism) -> str:
    """The file that rebuilds the model ("": this session, e.g. the kit's class via a test)."""
    if _loading:                                          # a plugin file being imported
        return _loading[-1]
    module = sys.modules.get(getattr(mechanism.model, "__module__", ""), None)
    name = getattr(module, "__name__", "")
    if name.split(".")[0] == "blockmem_lite":
        caller = sys._getframe(1)
        while caller.f_back is not None and caller.f_globals.get("__name__") == __name__:
            caller = caller.f_back
        caller_module = caller.f_globals.get("__name__", "")
        return BUILTIN if caller_module.split(".")[0] == "blockmem_lite" else ""
    path = getattr(module, "__file__", None)
    return str(Path(path).resolve()) if path and name != "__main__" else ""


def _describe(origin: str) -> str:
    """A source of ``_SOURCES`` in words, for error messages."""
    words = {BUILTIN: "the kit (built in)", "": "this session (a notebook or interactive code)"}
    return words.get(origin, origin if origin.startswith("entry point ") else f"plugin {origin}")


def _check_free(mechanism: Mechanism, origin: str) -> None:
    """Refuse a name already taken, unless it is the same model class (by its qualified name:
    a re-run cell or a re-imported file defines it again) from the same source."""
    name, taken = mechanism.name, _REGISTRY.get(mechanism.name)
    old, new = (getattr(m.model, "__qualname__", m.model) for m in (taken or mechanism, mechanism))
    if taken is None or (_SOURCES[name] == origin and old == new):
        return
    if _SOURCES[name] == BUILTIN:
        fail("name", name, f"a built-in mechanism has that name (this one from {_describe(origin)})"
                           f"; choose another (taken: {', '.join(sorted(_REGISTRY))})")
    fail("name", name, f"already registered by {_describe(_SOURCES[name])} (model {old}), and "
                       f"{_describe(origin)} registers another one (model {new}): rename one "
                       f"of them, or registry.unregister({name!r}) first to replace it")


def register(mechanism: Mechanism) -> Mechanism:
    """Make the kit know ``mechanism`` by its name; returns it. A name is taken once: again
    is refused, naming both sources, unless it is the same model class from the same source
    (a re-run notebook cell), which replaces it. ``source(name)`` says where it came from."""
    if not isinstance(mechanism, Mechanism):
        fail("mechanism", mechanism, "expected a registry.Mechanism(...)")
    origin = _source_of(mechanism)
    _check_free(mechanism, origin)
    _REGISTRY[mechanism.name] = mechanism
    _SOURCES[mechanism.name] = origin
    return mechanism


def source(name: str) -> str:
    """Where mechanism ``name`` came from: "builtin", its plugin file, "entry point NAME", or
    "" for one defined in a notebook or an interactive session."""
    get(name)
    return _SOURCES[name]


def unregister(name: str) -> None:
    """Forget a plugin mechanism (built-ins stay), with its bench and lab records."""
    if name in _REGISTRY and _SOURCES[name] != BUILTIN:
        for table in (_REGISTRY, _SOURCES, _BENCH, _LAB):
            table.pop(name, None)


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
def _importing(source: str, folder: Path | None = None):
    """Registrations meanwhile come from ``source``; ``folder`` (a plugin's) leads sys.path."""
    _loading.append(source)
    sys.path[:0] = [str(folder)] if folder is not None else []
    try:
        yield
    finally:
        _loading.pop()
        if folder is not None and str(folder) in sys.path:
            sys.path.remove(str(folder))               # the first occurrence: the one put there


def _from_source(source: str) -> list[str]:
    return sorted(n for n, origin in _SOURCES.items() if origin == source)


def _what_it_raised(err: BaseException, source: str) -> str:
    """What a plugin file raised while it ran, and where: 'RuntimeError: boom (line 4 ...)'."""
    if isinstance(err, SystemExit):
        return f"it raised SystemExit (sys.exit({err.code!r})): a plugin must register, not exit"
    frames = [f for f in traceback.extract_tb(err.__traceback__)   # the plugin's, its helpers'
              if not f.filename.startswith(("<", str(Path(__file__).parent)))]
    where = [f"line {f.lineno} of the plugin" for f in frames if f.filename == source][-1:]
    where += [f"raised in {Path(f.filename).name}, line {f.lineno}, in {f.name}"
              for f in frames[-1:] if f.filename != source]
    return f"{type(err).__name__}: {err}" + (f" ({'; '.join(where)})" if where else "")


def load_plugin(path) -> list[str]:
    """Import the Python file at ``path``, which registers one or more mechanisms.

    Returns the names it registered; loading the same file again does nothing. While it
    runs, its folder is importable (helper files beside it). Errors (ValueError) name the
    file and what it raised, ``sys.exit`` included; a file that fails registers nothing.
    """
    named = isinstance(path, (str, PathLike)) and bool(str(path).strip())
    resolved = Path(path).expanduser().resolve() if named else None
    if resolved is None or not resolved.is_file() or resolved.suffix != ".py":
        fail("plugin", str(path) if named else path, "expected an existing .py file that calls "
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
        with _importing(source, resolved.parent):
            spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:         # KeyboardInterrupt still stops
        sys.modules.pop(module_name, None)
        for name in _from_source(source):             # what it registered before failing
            unregister(name)
        raise ValueError(f"plugin {source} failed to import: "
                         f"{_what_it_raised(err, source)}") from None
    if not _from_source(source):
        sys.modules.pop(module_name, None)
        raise ValueError(f"plugin {source} registered no mechanism: it must call "
                         "blockmem_lite.register_mechanism(Mechanism(...)) when imported")
    return _from_source(source)


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
    origin = source(name)
    if origin == BUILTIN or origin.startswith("entry point "):
        return None
    if not origin:
        fail("arch", name, "is defined in this session only, so a fresh process cannot build "
                           "it: save it in a .py file and load_plugin(FILE) (or --plugin FILE), "
                           "or measure without a subprocess (e.g. bench memory 'saved')")
    return origin
