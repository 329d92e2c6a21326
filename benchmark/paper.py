"""The papers' published numbers: FPL's (PROTOCOL.md section 1) Table 2, Table 1, Table 3, Fig. 5.

A table here maps method -> dataset -> domain (in the paper's column order) and "AVG" -> accuracy (%);
`benchmark.tables` says which runs each is compared with."""
from __future__ import annotations

import numpy as np

DOMAIN_ORDER = {"digits": ["mnist", "usps", "svhn", "syn"], "office_caltech": ["caltech", "amazon", "webcam", "dslr"]}


def _row(digits: list[float], office: list[float]) -> dict[str, dict[str, float]]:
    return {
        "digits": dict(zip(DOMAIN_ORDER["digits"] + ["AVG"], digits)),
        "office_caltech": dict(zip(DOMAIN_ORDER["office_caltech"] + ["AVG"], office)),
    }


TABLE2 = {
    "fedavg": _row([98.14, 90.85, 76.56, 55.01, 80.14], [60.15, 75.44, 45.86, 36.00, 54.36]),
    "fedprox": _row([98.11, 90.24, 77.01, 56.66, 80.50], [60.21, 77.44, 48.62, 37.33, 55.90]),
    "moon": _row([97.44, 92.15, 77.62, 38.79, 76.50], [56.19, 71.54, 41.04, 30.22, 49.74]),
    "feddyn": _row([98.01, 91.00, 78.95, 54.22, 80.54], [61.64, 75.54, 48.28, 35.56, 55.25]),
    "fedopt": _row([96.23, 91.80, 73.03, 57.85, 79.72], [56.31, 56.74, 63.33, 48.89, 56.31]),
    "fedproc": _row([97.86, 88.99, 78.90, 45.84, 77.89], [58.07, 73.65, 42.76, 30.22, 51.17]),
    "fedproto": _row([98.30, 92.44, 80.35, 53.58, 81.16], [64.02, 79.37, 50.17, 40.33, 58.47]),
    "fpl": _row([98.31, 92.71, 80.27, 61.20, 83.12], [63.39, 79.26, 55.86, 48.00, 61.63]),
}

# Table 1: CPCL / UPCR ablation (none = FedAvg, both = FPL)
TABLE1 = {
    "fedavg": TABLE2["fedavg"],
    "fpl_cpcl_only": _row([98.03, 91.13, 79.76, 56.84, 81.44], [61.65, 78.16, 43.62, 45.33, 57.19]),
    "fpl_upcr_only": _row([98.23, 93.12, 81.18, 55.40, 81.98], [64.26, 79.54, 48.39, 44.67, 59.21]),
    "fpl": TABLE2["fpl"],
}

# Table 3: consistency target, global G (the paper's G row is FedProto's) vs unbiased U (= UPCR only)
TABLE3 = {
    "fpl_upcr_global": TABLE2["fedproto"],
    "fpl_upcr_only": TABLE1["fpl_upcr_only"],
}

# Fig. 5: CPCL with cluster vs global prototypes on Office-Caltech: cluster is +2.08 AVG
FIG5_CLUSTER_MINUS_GLOBAL_AVG = 2.08



def reference(table: dict, method: str, dataset: str, domains: list[str]) -> dict[str, float] | None:
    """The paper's values of `method` on the `domains` that ran and their AVG: the paper's own AVG when every
    domain ran, else the mean of its values on those domains. None when the paper has no row for `method`."""
    if method not in table or dataset not in table[method]:
        return None
    row = table[method][dataset]
    order = [d for d in row if d != "AVG"]
    kept = [d for d in order if d in domains]
    avg = row["AVG"] if kept == order else float(np.mean([row[d] for d in kept]))
    return {**{d: row[d] for d in kept}, "AVG": avg}


# FedProto (AAAI 2022), Table 1, MNIST, stdev 2 (PROTOCOL.md section 4): per method, n -> (mean, std over
# clients) of the test accuracy, and the parameters communicated per round (x 10^3, the paper's column)
FEDPROTO_TABLE1 = {
    "fedproto_orig": {3: (97.13, 0.30), 4: (96.80, 0.41), 5: (96.70, 0.29)},
    "fedproto_mh": {3: (97.07, 0.50), 4: (96.65, 0.31), 5: (96.22, 0.36)},
    "fedavg": {3: (95.04, 6.48), 4: (94.32, 4.89), 5: (93.22, 4.39)},
    "fedprox": {3: (96.26, 2.89), 4: (96.40, 3.33), 5: (95.65, 3.38)},
    "local": {3: (94.05, 2.93), 4: (93.35, 3.26), 5: (92.92, 3.17)},
}
FEDPROTO_COMM_PARAMS_K = {"fedproto_orig": 4, "fedproto_mh": 4, "fedavg": 430, "fedprox": 430, "local": 0}
