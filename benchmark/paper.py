"""The papers' published numbers, one place: FPL's (PROTOCOL.md section 1) Table 2, Table 1, Table 3, Fig. 5;
FedPLVM's (section 2) Tables 1 to 5 and 7 to 12; FedAPC's (section 3) Tables I and II; FedProto's (section 4).

A table here maps method -> dataset -> domain (in the paper's column order) and "AVG" -> accuracy (%);
`ray_jobs.tables` says which runs each is compared with. How many runs each mean is over (`RUNS`), how many
independent seeds that is (`SEEDS`, the verdicts' count), and the std over those runs where the paper prints one
(FedPLVM's, `FEDPLVM_*_STD`, the same shape; GPU noise, not seed-to-seed spread)."""
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

# FedAPC Table I (its 8-client protocol; its Office-10 is Office-Caltech-10) and Table II (without augmentation)
FEDAPC_TABLE1 = {
    "fedavg": _row([93.20, 84.35, 75.38, 53.91, 76.71], [63.84, 79.79, 53.79, 44.67, 60.52]),
    "moon": _row([94.46, 82.08, 82.18, 56.88, 78.90], [67.05, 77.47, 54.67, 49.33, 62.13]),
    "fedproto": _row([94.72, 81.19, 80.52, 58.37, 78.70], [68.22, 83.89, 55.52, 50.00, 64.41]),
    "fedapc": _row([95.03, 86.51, 81.98, 58.74, 80.57], [69.20, 78.42, 57.93, 60.00, 66.39]),
}
FEDAPC_TABLE2 = {
    "fedapc_noaug": _row([94.26, 84.34, 78.43, 55.83, 78.22], [64.17, 78.34, 53.86, 51.33, 61.93]),
    "fedapc": FEDAPC_TABLE1["fedapc"],
}
FEDAPC = {**FEDAPC_TABLE1, **FEDAPC_TABLE2}  # `make table-fedapc`: both tables in one report


# ------------------------------------------------------------------ FedPLVM (NeurIPS 2024), PROTOCOL.md section 2
FEDPLVM_DOMAINS = {"digit5": ["mnist", "svhn", "usps", "syn", "mnistm"],
                   "office10": ["amazon", "caltech", "dslr", "webcam"]}


def _plvm(digit5: list[float] | None = None, office10: list[float] | None = None) -> dict[str, dict[str, float]]:
    rows = {"digit5": digit5, "office10": office10}
    return {ds: dict(zip(FEDPLVM_DOMAINS[ds] + ["AVG"], v)) for ds, v in rows.items() if v is not None}


# How many runs each paper's means are over, as it states: FPL "three times" (its Evaluation Metric), FedAPC "3 times"
# (its Implementation Details), FedPLVM "5 experiments" (its Implement Details; its Table 3 a single one, appendix H);
# FedProto states none (its ± is over the clients of a run)
RUNS = {"fpl": 3, "fedapc": 3, "fedplvm": 5, "fedplvm_table3": 1, "fedproto": None}
# The independent seeds each paper's means are over, for the standard error of its mean in the verdicts
# (`benchmark.verdicts`): FPL's and FedAPC's runs (three); FedPLVM's five runs share seed 0 (its main.py seeds torch,
# numpy and random with 0 in every run, docs/deviations.md 27), so their mean is one seed's draw and their printed std
# its GPU noise; its Table 3 a single run; FedProto's one run (its ± is over the clients of that run)
SEEDS = {"fpl": 3, "fedapc": 3, "fedplvm": 1, "fedplvm_table3": 1, "fedproto": 1}

# Tables 1 (Digit-5) and 2 (Office-10): final round, mean of 5 runs
FEDPLVM_TABLE12 = {
    "fedavg": _plvm([84.98, 29.38, 82.36, 47.00, 53.14, 59.37], [48.26, 35.11, 57.29, 71.75, 53.10]),
    "fedprox": _plvm([85.72, 28.86, 82.30, 46.78, 52.60, 59.25], [47.74, 36.44, 56.25, 73.45, 53.47]),
    "fedproto": _plvm([88.60, 31.94, 85.54, 51.82, 56.86, 62.95], [49.31, 36.07, 57.38, 79.05, 55.45]),
    "fedpcl": _plvm([88.84, 39.70, 84.74, 54.70, 59.96, 65.59], [53.65, 38.93, 58.13, 78.64, 57.34]),
    "fedfa": _plvm([89.46, 38.96, 85.86, 58.04, 61.38, 66.74], [56.46, 40.91, 60.00, 78.58, 58.99]),
    "fpl": _plvm([90.12, 36.78, 86.10, 57.36, 64.02, 66.88], [54.38, 38.24, 61.25, 80.34, 58.55]),
    "fedplvm": _plvm([90.70, 42.08, 86.24, 60.08, 67.16, 69.25], [57.03, 42.71, 61.50, 81.36, 60.65]),
}

# FedPLVM's ± (the std over its 5 runs) where it prints one: every domain of Tables 1, 2, 7, 8, 10, 11 and 12 (not
# their Avg), the Avg of Tables 4 and 5; none in Tables 3 and 9. Same shape as the means, without the AVG
FEDPLVM_TABLE12_STD = {
    "fedavg": _plvm([0.92, 1.06, 1.18, 0.73, 0.78], [1.92, 0.96, 1.47, 0.80]),
    "fedprox": _plvm([1.50, 1.23, 0.75, 1.10, 2.37], [0.65, 1.92, 4.42, 0.80]),
    "fedproto": _plvm([0.72, 1.58, 0.34, 1.12, 0.42], [2.18, 0.91, 2.55, 2.40]),
    "fedpcl": _plvm([1.08, 2.25, 0.72, 1.18, 1.34], [2.33, 2.73, 5.08, 0.83]),
    "fedfa": _plvm([0.55, 1.69, 0.38, 1.06, 0.98], [2.15, 2.39, 4.68, 1.86]),
    "fpl": _plvm([1.39, 1.88, 0.66, 1.96, 1.38], [1.02, 2.38, 3.19, 1.73]),
    "fedplvm": _plvm([0.39, 1.59, 1.37, 1.47, 0.77], [1.45, 1.04, 2.02, 1.86]),
}

# Table 3 (Digit-5): local / global prototype generation; cluster/cluster is FedPLVM (a single run, Appendix H)
FEDPLVM_TABLE3 = {
    "fedplvm_avg_avg": _plvm([86.90, 33.10, 83.90, 53.40, 61.40, 63.54]),
    "fedplvm_avg_cluster": _plvm([89.40, 37.00, 85.50, 56.60, 63.50, 66.40]),
    "fedplvm": _plvm([90.20, 43.70, 86.90, 61.20, 65.40, 69.48]),
}
# Table 4 (Digit-5, AVG only): without / with global clustering, and the prototypes a client receives per round
FEDPLVM_TABLE4 = {"fedplvm_no_global_clustering": {"digit5": {"AVG": 69.18}}, "fedplvm": {"digit5": {"AVG": 69.47}}}
FEDPLVM_TABLE4_PROTOTYPES = {"fedplvm_no_global_clustering": 100.92, "fedplvm": 21.20}
FEDPLVM_TABLE4_STD = {"fedplvm_no_global_clustering": {"digit5": {"AVG": 0.77}}, "fedplvm": {"digit5": {"AVG": 0.71}}}
# Table 5 (Digit-5, AVG only): contrast / correction terms
FEDPLVM_TABLE5 = {
    "fedplvm_no_loss": {"digit5": {"AVG": 66.96}},
    "fedplvm_contrast_only": {"digit5": {"AVG": 68.42}},
    "fedplvm_correction_only": {"digit5": {"AVG": 67.95}},
    "fedplvm": {"digit5": {"AVG": 69.25}},
}
FEDPLVM_TABLE5_STD = {"fedplvm_no_loss": {"digit5": {"AVG": 0.85}}, "fedplvm_contrast_only": {"digit5": {"AVG": 0.95}},
                      "fedplvm_correction_only": {"digit5": {"AVG": 0.63}}, "fedplvm": {"digit5": {"AVG": 0.62}}}


# Tables 7 (Digit-5) and 8 (Office-10), appendix D: label skew, Dirichlet alpha 0.5 as stated (Table 8's numbers fit
# 1.0: docs/deviations.md, 32); final round, mean of 5 runs
FEDPLVM_TABLE78 = {
    "fedavg": _plvm([79.44, 24.16, 65.46, 40.58, 55.16, 52.96], [47.36, 33.63, 49.42, 72.95, 50.84]),
    "fedprox": _plvm([81.40, 24.44, 67.54, 41.64, 55.80, 54.16], [48.58, 33.78, 52.42, 75.10, 52.47]),
    "fedproto": _plvm([83.28, 23.06, 69.98, 40.78, 57.66, 54.95], [52.44, 35.56, 51.38, 75.62, 53.75]),
    "fedpcl": _plvm([85.44, 25.82, 69.28, 42.60, 58.66, 56.36], [54.07, 36.56, 57.62, 76.42, 56.17]),
    "fedfa": _plvm([86.65, 29.57, 73.48, 47.19, 60.24, 59.43], [53.28, 36.67, 53.71, 73.20, 54.22]),
    "fpl": _plvm([85.18, 31.54, 72.96, 49.48, 61.08, 60.05], [53.05, 35.41, 58.67, 76.62, 55.94]),
    "fedplvm": _plvm([86.18, 33.24, 73.98, 51.72, 62.90, 61.60], [55.28, 37.48, 59.79, 77.36, 57.48]),
}

FEDPLVM_TABLE78_STD = {
    "fedavg": _plvm([0.86, 0.91, 1.86, 0.87, 1.24], [1.60, 0.21, 1.37, 1.38]),
    "fedprox": _plvm([0.53, 1.06, 2.05, 1.02, 0.58], [0.76, 0.63, 5.31, 0.80]),
    "fedproto": _plvm([0.80, 0.51, 0.81, 0.99, 0.85], [0.86, 1.09, 0.19, 2.11]),
    "fedpcl": _plvm([2.13, 0.97, 3.73, 1.55, 1.46], [0.76, 2.18, 0.11, 0.82]),
    "fedfa": _plvm([0.69, 1.97, 0.77, 0.49, 1.24], [1.72, 1.49, 1.43, 2.52]),
    "fpl": _plvm([2.66, 2.96, 2.41, 2.42, 2.10], [0.50, 1.05, 2.95, 1.60]),
    "fedplvm": _plvm([0.98, 1.31, 2.17, 1.08, 1.32], [0.76, 0.21, 1.90, 0.08]),
}

# Table 9 (Digit-5, appendix E): K-Means instead of FINCH at both levels; FINCH's row is Table 1's
FEDPLVM_TABLE9 = {
    "fedplvm_kmeans_adaptive": _plvm([89.97, 42.10, 85.83, 60.90, 66.03, 68.97]),
    "fedplvm_kmeans2": _plvm([89.53, 40.67, 85.33, 59.13, 63.53, 67.64]),
    "fedplvm_kmeans5": _plvm([89.72, 41.97, 85.41, 60.13, 64.69, 68.38]),
    "fedplvm": {"digit5": FEDPLVM_TABLE12["fedplvm"]["digit5"]},
}

# Table 12 (Digit-5, appendix H): local clustering with the global average, mean of 5 runs; cluster/cluster is Table 1's
FEDPLVM_TABLE_T12 = {
    "fedplvm_cluster_avg": _plvm([89.43, 40.57, 85.74, 59.77, 65.03, 68.11]),
    "fedplvm": {"digit5": FEDPLVM_TABLE12["fedplvm"]["digit5"]},
}

FEDPLVM_TABLE_T12_STD = {"fedplvm_cluster_avg": _plvm([0.55, 1.21, 0.89, 0.88, 1.02]),
                         "fedplvm": {"digit5": FEDPLVM_TABLE12_STD["fedplvm"]["digit5"]}}

# Table 11 (Digit-5, appendix G): privacy protection of the local model (DP-SGD, epsilon 4, delta 1e-5) and of the
# local clustered prototypes (Gaussian noise, s 0.05, p 0.1), w/ or w/o each; mean of 5 runs; w/o w/o is Table 1's
FEDPLVM_TABLE11 = {
    "fedplvm_dp_both": _plvm([89.74, 38.40, 84.44, 55.98, 62.44, 66.20]),
    "fedplvm_dp_model": _plvm([89.42, 38.12, 83.68, 57.54, 65.26, 66.80]),
    "fedplvm_dp_protos": _plvm([90.64, 40.12, 86.40, 58.80, 66.44, 68.48]),
    "fedplvm": {"digit5": FEDPLVM_TABLE12["fedplvm"]["digit5"]},
}

FEDPLVM_TABLE11_STD = {
    "fedplvm_dp_both": _plvm([0.35, 2.86, 0.48, 1.27, 1.25]),
    "fedplvm_dp_model": _plvm([0.85, 1.12, 0.43, 1.74, 0.51]),
    "fedplvm_dp_protos": _plvm([0.34, 1.95, 0.99, 1.53, 1.60]),
    "fedplvm": {"digit5": FEDPLVM_TABLE12_STD["fedplvm"]["digit5"]},
}

# Table 10 (Digit-5, appendix F): 10 clients, MNIST 1, SVHN 4, USPS 2, Synth 2, MNIST-M 1; a domain's value is the mean
# over its clients. The paper's Avg is the mean over all clients (FEDPLVM_TABLE10_CLIENT_AVG); "AVG" here is the mean
# over the domains (FPL's way, what the reports' AVG column is), from the paper's per-domain values
_T10 = {"fpl": [90.44, 59.78, 85.14, 73.01, 69.34], "fedplvm": [90.90, 62.72, 85.92, 74.51, 71.32]}
FEDPLVM_TABLE10 = {m: _plvm(v + [float(np.mean(v))]) for m, v in _T10.items()}
FEDPLVM_TABLE10_CLIENT_AVG = {"fpl": 71.52, "fedplvm": 73.40}
FEDPLVM_TABLE10_STD = {"fpl": _plvm([0.67, 1.56, 0.93, 1.09, 0.98]), "fedplvm": _plvm([0.97, 1.69, 0.75, 1.20, 0.35])}


def reference(table: dict, method: str, dataset: str, domains: list[str], all_domains: list[str] | None = None
              ) -> dict[str, float] | None:
    """The paper's values of `method` on the `domains` that ran and their AVG: the paper's own AVG when every
    domain ran, else the mean of its values on those domains. None when the paper has no row for `method`, or
    gives only an AVG (FedPLVM's Tables 4 and 5) and not every one of the dataset's `all_domains` ran."""
    if method not in table or dataset not in table[method]:
        return None
    row = table[method][dataset]
    order = [d for d in row if d != "AVG"]
    if not order and all_domains is not None and list(domains) != list(all_domains):
        return None
    kept = [d for d in order if d in domains]
    avg = row["AVG"] if kept == order else float(np.mean([row[d] for d in kept]))
    return {**{d: row[d] for d in kept}, "AVG": avg}


# FedProto (AAAI 2022), MNIST (PROTOCOL.md section 4): per stdev of n (2: Table 1, 3: Table 2's second rows), method
# and n, (mean, std over clients) of the test accuracy; methods in the paper's row order. Table 2 prints FedAvg's
# stdev-2 n = 3 cell as 91.40 ± 6.48, Table 1 as 95.04 ± 6.48: Table 1's is kept (docs/fedproto.md).
FEDPROTO_TABLE = {
    2: {
        "local": {3: (94.05, 2.93), 4: (93.35, 3.26), 5: (92.92, 3.17)},
        "fesem": {3: (95.26, 3.48), 4: (97.06, 2.72), 5: (96.31, 2.41)},
        "fedprox": {3: (96.26, 2.89), 4: (96.40, 3.33), 5: (95.65, 3.38)},
        "fedper": {3: (95.57, 2.96), 4: (96.44, 2.62), 5: (95.55, 3.13)},
        "fedavg": {3: (95.04, 6.48), 4: (94.32, 4.89), 5: (93.22, 4.39)},
        "fedrep": {3: (94.96, 2.78), 4: (95.18, 3.80), 5: (94.94, 2.81)},
        "fedproto_orig": {3: (97.13, 0.30), 4: (96.80, 0.41), 5: (96.70, 0.29)},
        "fedproto_mh": {3: (97.07, 0.50), 4: (96.65, 0.31), 5: (96.22, 0.36)},
    },
    3: {
        "local": {3: (93.44, 3.57), 4: (94.24, 2.49), 5: (93.97, 2.97)},
        "fesem": {3: (96.40, 3.35), 4: (95.82, 3.94), 5: (95.98, 2.46)},
        "fedprox": {3: (96.65, 3.28), 4: (95.25, 3.73), 5: (95.34, 2.85)},
        "fedper": {3: (96.57, 2.65), 4: (95.93, 2.76), 5: (96.07, 2.80)},
        "fedavg": {3: (94.57, 4.91), 4: (91.99, 6.89), 5: (92.19, 3.97)},
        "fedrep": {3: (95.01, 3.92), 4: (95.55, 2.79), 5: (95.38, 2.97)},
        "fedproto_orig": {3: (96.71, 0.43), 4: (96.87, 0.28), 5: (96.47, 0.23)},
        "fedproto_mh": {3: (96.48, 0.43), 4: (96.84, 0.33), 5: (95.56, 0.31)},
    },
}
# the paper's communication columns (the same for both stdevs): parameters uploaded per round by all clients
# (x 10^3) and the rounds it reports each method needing to converge (we run every method for the protocol's 100)
FEDPROTO_COMM_PARAMS_K = {"local": 0, "fesem": 430, "fedprox": 430, "fedper": 106, "fedavg": 430, "fedrep": 110,
                          "fedproto_orig": 4, "fedproto_mh": 4}
FEDPROTO_COMM_ROUNDS = {"local": 0, "fesem": 150, "fedprox": 110, "fedper": 100, "fedavg": 150, "fedrep": 100,
                        "fedproto_orig": 100, "fedproto_mh": 100}
# Figure 2: the methods whose test features it maps (t-SNE) on MNIST at n = 3, in its panel order (a plot only)
FEDPROTO_FIGURE2 = ("fedproto_orig", "fedavg", "fesem", "fedper")
# Figure 3: the methods it compares on MNIST with fewer samples per class (a plot only: no numbers to compare)
FEDPROTO_FIGURE3 = ("fedproto_orig", "fedavg")
