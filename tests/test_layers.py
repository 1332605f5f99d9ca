"""The package's import graph, read from its own source with ``ast``: imports only go down the
documented layer order (docs/KIT.md, "The layers"), there are no cycles (imports inside functions
count), and the core never names a mechanism."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "blockmem_lite"

# Bottom to top. A module may import modules of its own layer or lower ones, never higher.
# A module takes the lowest layer one of its patterns matches.
LAYERS = (
    ("leaves", ("units", "validation", "labdata", "course")),
    ("registry", ("registry",)),
    ("settings", ("config", "runtime", "distributed", "tokenizer", "measure", "measure.flops",
                  "compiling")),
    ("primitives and kernels", ("nn", "masks", "trace", "scratch", "ops", "ops.*")),
    ("model interface", ("models.base",)),
    ("the papers' models", ("models.*",)),
    ("model zoo", ("models",)),
    ("registrations", ("mechanisms", "mechanisms.*")),
    ("data", ("corpora", "tasks")),
    ("measuring and training", ("checkpoints", "measure.*", "train", "train.*",
                                "checks", "guard", "own_work", "plugged_in", "recall",
                                "knowledge")),
    ("lab", ("lab", "lab.run", "lab.parts", "lab.language_models", "lab.lab_bench",
             "lab.progress", "lab.verdicts", "lab.report")),
    ("viz", ("viz", "viz.*")),
    ("lessons", ("lessons", "expected")),
    ("lab figures and sweeps", ("lab.figures", "lab.recall_sweep")),
    ("exercise checks", ("exercise_checks", "exercise_checks.*")),
    ("tools and command line", ("tools", "tools.*", "__main__", "")),
)
# The core asks the registry: it imports no mechanism module and compares with no name.
CORE = ("config", "runtime", "distributed", "tokenizer", "compiling", "nn", "masks",
        "trace", "models.base", "corpora", "tasks", "measure", "measure.*", "train", "train.*",
        "checks", "guard", "own_work", "plugged_in", "recall", "knowledge", "checkpoints",
        "labdata", "lab",
        "lab.*", "viz", "viz.*", "scratch", "lessons", "expected", "tools.cli", "tools.site",
        "tools.train_command", "tools.bench_command", "tools.reproduce_command")


def module_names() -> dict[str, Path]:
    """'models.bcmt' -> path; the package itself is ''."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = module_names()


def matches(name: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        return name.startswith(pattern[:-1])
    return name == pattern


def layer_of(name: str) -> int:
    hits = [i for i, (_, patterns) in enumerate(LAYERS) for p in patterns if matches(name, p)]
    assert hits, f"blockmem_lite.{name} has no layer: add it to LAYERS and docs/KIT.md"
    return min(hits)


def inner(full: str | None) -> str | None:
    """'blockmem_lite.models.bcmt' -> 'models.bcmt'; 'blockmem_lite' -> ''; other -> None."""
    if full == "blockmem_lite":
        return ""
    if full and full.startswith("blockmem_lite.") and full[len("blockmem_lite."):] in MODULES:
        return full[len("blockmem_lite."):]
    return None


def resolve(importer: str, node) -> list[str]:
    """Package-internal modules an import statement pulls in ('' = the package facade).

    ``from blockmem_lite import sub`` is an edge to the module ``sub``, not to the
    facade; ``from blockmem_lite import name`` (not a module) is an edge to the facade.
    """
    if isinstance(node, ast.Import):
        return sorted({m for m in (inner(a.name) for a in node.names) if m is not None})
    if node.level:                                     # relative: from . import x
        package = importer.split(".") if MODULES[importer].name == "__init__.py" else \
            importer.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        module = ".".join(["blockmem_lite", *package, *([node.module] if node.module else [])])
    else:
        module = node.module
    base = inner(module)
    if base is None:
        return []
    subs = [f"{base}.{a.name}".lstrip(".") for a in node.names]
    sub_modules = [s for s in subs if s in MODULES]
    if len(sub_modules) == len(subs):
        return sorted(sub_modules)
    return sorted({base, *sub_modules})


def edges() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets = set()
        for node in ast.walk(tree):                      # inside functions too
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets.update(t for t in resolve(name, node) if t != name)
        graph[name] = targets
    return graph


GRAPH = edges()


def test_every_module_has_a_layer():
    assert all(0 <= layer_of(name) < len(LAYERS) for name in MODULES)


@pytest.mark.parametrize("importer", sorted(MODULES))
def test_imports_only_go_down_the_layers(importer):
    upward = [f"{target} ({LAYERS[layer_of(target)][0]})" for target in sorted(GRAPH[importer])
              if layer_of(target) > layer_of(importer)]
    assert not upward, (f"blockmem_lite.{importer or '__init__'} "
                        f"({LAYERS[layer_of(importer)][0]}) imports upward: {', '.join(upward)}")


def test_there_are_no_import_cycles():
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in GRAPH[node]:
            if state.get(target) == "open":
                cycle = stack[stack.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(c or "__init__"
                                                                    for c in cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)
    assert set(state) == set(GRAPH) and set(state.values()) == {"done"}


def test_the_core_imports_no_mechanism_module():
    mechanisms = {n for n in MODULES if n != "models.base"
                  and n.startswith(("models.", "mechanisms", "ops."))}
    for name in MODULES:
        if any(matches(name, p) for p in CORE):
            bad = sorted(GRAPH[name] & (mechanisms | {"models"}))
            assert not bad, f"blockmem_lite.{name} imports mechanism modules: {bad}"


def test_the_core_never_branches_on_a_mechanism_name():
    names = {"bcmt", "honly", "cat", "armt", "moc"}
    for name, path in MODULES.items():
        if not any(matches(name, p) for p in CORE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                constants = [c.value for c in [node.left, *node.comparators]
                             if isinstance(c, ast.Constant)]
                assert not names & set(constants), \
                    f"blockmem_lite.{name}:{node.lineno} compares with a mechanism name"


def test_the_checker_sees_a_planted_upward_import(tmp_path):
    """Teeth: the resolver finds imports inside functions and relative ones."""
    tree = ast.parse("def f():\n    from blockmem_lite import train\n    from . import bench\n")
    found = [t for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             for t in resolve("measure.flops", node)]
    assert found == ["train", "measure.bench"]
    assert layer_of("train") > layer_of("measure.flops")
    assert layer_of("measure.bench") > layer_of("measure.flops")
