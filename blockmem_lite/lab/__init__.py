"""The comparison lab: every registered mechanism on the same work, the papers' claims beside ours.

``from blockmem_lite import lab; lab.reproduce("fast", out=...)`` runs it; this facade holds
the names notebooks, tests and the command line use. The modules, one job each:

* ``lab.run``: the plan (``Entry``, ``plan_entries``, ``plan_tasks``), its progress line,
  the ``Lab`` that trains and measures each task into ``OUT/results.json``, ``reproduce``;
* ``lab.language_models``: one language model at one seed, trained and measured (the loss
  by position too), and its seeds combined; ``lab.parts``: the recall and facts models,
  trained side by side on worker processes; ``lab.lab_bench``: the lab's bench;
* ``lab.verdicts``: the claims table, "does memory pay?" (``memory_pays``,
  ``knowledge_pays``) and the terminal summary, from a result or ``results_from``;
* ``labdata`` (outside the package, a leaf the mechanisms read too): a result read into
  figures and tables (one row per model, the state curves, ...);
* ``lab.report``: ``OUT/report.md``, and the tables as fixed-width text;
* ``lab.figures`` (plotly; it sits above ``viz``) and ``lab.recall_sweep`` (the ``sweep``
  command) are imported on their own: ``from blockmem_lite.lab import figures``.
"""

from blockmem_lite.lab.progress import PlanProgress
from blockmem_lite.lab.report import (
    PLOTS,
    format_knowledge,
    format_memory_pays,
    format_model_table,
    format_state_table,
    report_markdown,
    write_report,
)
from blockmem_lite.lab.run import (
    DETERMINISTIC,
    LAB_SIZES,
    RESULTS_FORMAT,
    RESULTS_NAME,
    TASKS,
    Entry,
    Lab,
    plan_entries,
    plan_tasks,
    reproduce,
    shipped_run,
)
from blockmem_lite.lab.verdicts import (
    BLIND_ATOL,
    CLAIM_COLUMNS,
    claim_row,
    claims_table,
    format_claims,
    knowledge_pays,
    memory_pays,
    results_from,
    summary,
)
from blockmem_lite.labdata import (
    MODEL_COLUMNS,
    missing_tasks,
    model_table,
    speed_vs_dense,
    state_table,
    trained_models,
)

__all__ = [
    "BLIND_ATOL", "CLAIM_COLUMNS", "DETERMINISTIC", "LAB_SIZES", "MODEL_COLUMNS", "PLOTS",
    "RESULTS_FORMAT", "RESULTS_NAME", "TASKS", "Entry", "Lab", "PlanProgress", "claim_row",
    "claims_table", "format_claims", "format_knowledge", "format_memory_pays",
    "format_model_table", "format_state_table", "knowledge_pays", "memory_pays",
    "missing_tasks", "model_table", "plan_entries", "plan_tasks", "report_markdown",
    "reproduce", "results_from", "shipped_run", "speed_vs_dense", "state_table", "summary", "trained_models",
    "write_report",
]
