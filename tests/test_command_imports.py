"""Each command imports what it runs: ``train --help`` loads neither the lab, the bench, the
grader nor plotly, and stays within a budget of the kit's modules."""

import json
import subprocess
import sys

import pytest

REPORT = """
import json, sys
from blockmem_lite.__main__ import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""
# What no training needs: the lab, the bench and its roofline, the grader, the site, plotly.
NOT_FOR_TRAINING = ("blockmem_lite.lab", "blockmem_lite.measure.bench",
                    "blockmem_lite.measure.roofline", "blockmem_lite.tools.grading",
                    "blockmem_lite.tools.site", "blockmem_lite.viz", "plotly")
TRAIN_BUDGET = 48          # kit modules `train --help` may import: training 45, the command 3


def imported(*argv: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", REPORT, *argv], capture_output=True,
                          text=True, check=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def kit(modules: list[str]) -> list[str]:
    return [m for m in modules if m == "blockmem_lite" or m.startswith("blockmem_lite.")]


def within(modules: list[str], packages) -> list[str]:
    """The modules of ``modules`` that are one of ``packages`` or inside one."""
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


def test_train_help_imports_no_lab_bench_grader_or_plotly_within_its_budget(capfd):
    modules = imported("train", "--help")
    capfd.readouterr()
    heavy = within(modules, NOT_FOR_TRAINING)
    assert not heavy, f"`train --help` imported {heavy}"
    assert len(kit(modules)) <= TRAIN_BUDGET, kit(modules)


def test_importing_the_kit_loads_no_command_or_plotly():
    modules = imported()
    assert not within(modules, ("blockmem_lite.tools", "blockmem_lite.lab", "plotly"))


@pytest.mark.parametrize("command, needs", [("bench", "blockmem_lite.measure.bench"),
                                            ("reproduce", "blockmem_lite.lab")])
def test_each_command_loads_its_own_module_and_not_the_others(command, needs):
    modules = imported(command, "--help")
    assert needs in modules
    others = {"train": "blockmem_lite.tools.train_command",
              "bench": "blockmem_lite.tools.bench_command",
              "reproduce": "blockmem_lite.tools.reproduce_command"}
    assert [m for name, m in others.items() if m in modules] == [others[command]]
