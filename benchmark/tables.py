"""The paper tables the sweeps reproduce, as data: which runs (method, preset) make each table, the
paper's numbers beside them, the reported metric, and the profiles the sweeps run them at.

`make table<name>` runs `ray_jobs.sweep --table <name>`; a table's `full` profile runs its presets
unchanged with its seeds, the `smoke` profile the same code paths with tiny settings.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from benchmark import paper
from benchmark.methods import TABLE2_METHODS

METRICS = {
    "last5": "mean accuracy of the last 5 rounds",
    "final": "accuracy after the final round",
}
# profile -> RunConfig overrides on top of a table's presets (full: none, the paper's protocol)
PROFILES = {
    "full": {},
    "smoke": dict(rounds=2, local_epochs=1, client_fraction=0.05, eval_max=100),
}
SMOKE_SEEDS = (0,)


@dataclass(frozen=True)
class Table:
    title: str
    rows: list[tuple[str, str]]  # (method, preset) per row, datasets in order of first appearance
    paper: dict  # the paper's numbers: method -> dataset -> domain (and "AVG") -> accuracy
    metric: str = "last5"  # a key of METRICS: the summary.json entry the table reports
    seeds: tuple[int, ...] = (0, 1, 2)  # of the full profile
    smoke: dict = field(default_factory=dict)  # this table's changes to the smoke profile

    def seeds_for(self, profile: str) -> tuple[int, ...]:
        return self.seeds if profile == "full" else SMOKE_SEEDS

    def overrides(self, profile: str) -> dict:
        return {**PROFILES[profile], **(self.smoke if profile == "smoke" else {})}


FPL_PRESETS = ("fpl-digits", "fpl-office")


def _fpl_rows(methods) -> list[tuple[str, str]]:
    return [(m, p) for p in FPL_PRESETS for m in methods]


TABLES: dict[str, Table] = {
    "2": Table("FPL Table 2", _fpl_rows(TABLE2_METHODS), paper.TABLE2),
    "1": Table("FPL Table 1 (CPCL / UPCR ablation)", _fpl_rows(paper.TABLE1), paper.TABLE1),
    "3": Table("FPL Table 3 (consistency target G vs U) and Fig. 5 (CPCL cluster vs global prototypes)",
               _fpl_rows(paper.TABLE3) + [("fpl_cpcl_only", "fpl-office"), ("fpl_cpcl_global", "fpl-office")],
               paper.TABLE3),
    # FedProto (AAAI 2022) Table 1, MNIST n-way k-shot, n = 3, 4, 5; its own report (ray_jobs.table_fedproto)
    "fedproto": Table("FedProto Table 1 (MNIST, stdev 2)",
                      [(m, f"fedproto-mnist-n{n}") for n in (3, 4, 5) for m in paper.FEDPROTO_TABLE1],
                      paper.FEDPROTO_TABLE1, metric="final", smoke=dict(eval_max=None)),
}
