"""A table's runs: its plan (every run of its method x preset rows at a profile's settings, each with its run
folder), a part of it (`select`: some methods, seeds, datasets or grid values) and the check of the data those
runs read. The tables themselves are data in `ray_jobs.tables`."""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from benchmark.checkpoint import protocol_difference
from benchmark.data import DATASETS, DataError, check_domains_present, resolve_data_root
from benchmark.protocols import PRESETS, ConfigError, unknown_name
from benchmark.results import is_complete, protocol, read_summary, run_complete
from ray_jobs.config import RunConfig
from ray_jobs.tables import TABLES, Reading, make_target, report_name


def domains_for(dataset: str, requested: list[str] | None) -> list[str]:
    """The requested domains that belong to `dataset`; all of its domains when none do."""
    mine = [d for d in DATASETS[dataset] if requested and d in requested]
    return mine or list(DATASETS[dataset])


def foreign_domains_note(name: str, tables, profile: str, requested_domains: list[str] | None) -> str | None:
    """A note when --domains names a domain that none of the tables swept (`name`: a table or a group) reads: it
    changes nothing there (Table 2 has no MNIST-M; one DOMAINS for a group's tables is fine)."""
    datasets = list(dict.fromkeys(PRESETS[p]["dataset"] for t in tables for _, p in TABLES[t].row_list(profile)))
    theirs = list(dict.fromkeys(d for ds in datasets for d in DATASETS[ds]))
    foreign = [d for d in requested_domains or [] if d not in theirs]
    if not foreign:
        return None
    return (f"note: --table {name} reads no {', '.join(foreign)} (its datasets {', '.join(datasets)} have "
            f"{', '.join(theirs)}): --domains changes nothing there for {'it' if len(foreign) == 1 else 'them'}.")


def plan(table: str, profile: str, requested_domains: list[str] | None, results_dir: Path, data_root: str | None,
         extra: dict | None = None, find_data: bool = True, methods: list[str] | None = None) -> list[RunConfig]:
    """Every run of the table, for each row (`Table.row_list`: at the smoke profile its default rows and those of
    `methods`) its grid's values (a grid table) and seeds (its data is checked by `check_data`, for the runs a sweep
    will make). `find_data=False`: the runs keep `data_root` as given, unresolved, for a reader of finished run
    folders that needs no data (the README's Results)."""
    spec = TABLES[table]
    root = resolve_data_root(data_root) if find_data else data_root
    every = list(dict.fromkeys(d for ds in DATASETS.values() for d in ds))
    unknown = sorted(set(requested_domains or []) - set(every))
    if unknown:
        raise ConfigError(unknown_name("domain", unknown, every))
    rows = spec.row_list(profile, methods)
    dataset_of = {p: PRESETS[p]["dataset"] for _, p in rows}
    runs = []
    for method, preset in rows:
        for hparams in spec.hparam_sets(profile):
            for seed in spec.seeds_for(profile):
                cfg = RunConfig.from_preset(preset, method=method, hparams=hparams, seed=seed,
                                            data_root=None if root is None else str(root),
                                            domains=domains_for(dataset_of[preset], requested_domains),
                                            wandb_group=f"{report_name(table)}-{profile}",
                                            **{**spec.overrides(profile), **(extra or {})})
                runs.append(dataclasses.replace(cfg, out=str(results_dir / "runs" / cfg.run_name)))
    return runs


def select(table: str, profile: str, runs: list[RunConfig], methods: list[str] | None = None,
           seeds: list[int] | None = None, datasets: list[str] | None = None,
           values: list[float] | None = None) -> list[RunConfig]:
    """The planned runs of the given methods, seeds, datasets and, in a hyperparameter grid, values (None: all),
    for a sweep that runs part of a table. Any of the table's methods may be named at any profile: `runs` are then
    planned with them (`plan`'s `methods`)."""
    spec = TABLES[table]
    if values and spec.grid is None:
        grids = ", ".join(t for t, s in TABLES.items() if s.grid is not None)
        raise ConfigError(f"table {table} has no hyperparameter grid: --values is for {grids}.")
    have = {"method": list(dict.fromkeys(m for m, _ in spec.row_list())), "seed": list(spec.seeds_for(profile)),
            "dataset": list(dict.fromkeys(c.dataset for c in runs)),
            "value": [next(iter(h.values())) for h in spec.hparam_sets(profile)] if spec.grid else []}
    for key, asked in (("method", methods), ("seed", seeds), ("dataset", datasets), ("value", values)):
        bad = [a for a in asked or [] if a not in have[key]]
        if bad:
            raise ConfigError(unknown_name(key, bad, have[key], f" in table {table} at the {profile} profile"))
    return [c for c in runs if (not methods or c.method in methods) and (not seeds or c.seed in seeds)
            and (not datasets or c.dataset in datasets) and (not values or c.hparams[spec.grid[0]] in values)]


def reported_runs(runs: list[RunConfig]) -> list[RunConfig]:
    """The runs a report reads: each planned run or, where it is not complete, the same run complete on the most of
    its domains short of all (made with `--domains`, for a data root without one of them), so that a report made
    without `--domains` still has them; the report's title and sections then say which domains are left out."""
    def subsets(cfg: RunConfig):
        for k in range(len(cfg.domains) - 1, 0, -1):
            for doms in itertools.combinations(cfg.domains, k):
                sub = dataclasses.replace(cfg, domains=list(doms), out=None)
                yield dataclasses.replace(sub, out=str(Path(cfg.out).parent / sub.run_name))
    return [cfg if run_complete(cfg) else next((s for s in subsets(cfg) if run_complete(s)), cfg) for cfg in runs]


def check_no_finished_run_replaced(runs: list[RunConfig]) -> None:
    """Stop before any run when one of `runs` (those to make: none complete under its own protocol) would replace a
    finished run, which is then of another protocol, in its folder (a run's name carries what departs from its
    preset, `RunConfig.departures`; a run recorded by older code can still clash: a bf16-mixed run that ray_jobs.run's
    former default, auto, made under the 32-true name)."""
    clash = [(c, protocol_difference(read_summary(Path(c.out))["protocol"], protocol(c), "there"))
             for c in runs if is_complete(Path(c.out))]
    if clash:
        shown = "; ".join(f"{c.out} ({', '.join(diff)})" for c, diff in clash[:3])
        more = f" and {len(clash) - 3} more" if len(clash) > 3 else ""
        raise ConfigError(f"{len(clash)} of the runs to make would replace a finished run of another protocol in its "
                          f"folder: {shown}{more}. The sweep started no run. Sweep into another --results-dir, "
                          "or delete those folders to replace their runs.")


def check_data(runs: list[RunConfig], table: str) -> None:
    """Stop before any run when a domain that one of `runs` reads is absent or corrupt in the data root; the
    data of runs the sweep does not make (other datasets, other domains) is not read."""
    for (ds, root), doms in {(c.dataset, c.data_root): tuple(c.domains) for c in runs}.items():
        try:
            check_domains_present(Path(root), ds, list(doms))
        except DataError as e:  # (a missing domain: it names the --domains to leave it out, which a sweep takes)
            target, keep = make_target(table), ",".join(e.domains_without or [])
            own = target in (f"table{table}", f"table-{table}")  # a table of a group (fedplvm_fig4a) has no target
            raise DataError(f"{e} The sweep started no run" + (
                f"; with make: DOMAINS={keep} make {target}." if keep and own else ".")) from None


def reading_run(planned: list[RunConfig], dataset: str, seed: int, r: Reading, erasing: bool) -> RunConfig | None:
    """The run of reading `r` (its method's planned run with its hyperparameters and `erasing`) of this dataset and
    seed, in the planned run's results folder; None where the table plans no such row."""
    c = next((c for c in planned if (c.dataset, c.seed, c.method) == (dataset, seed, r.method)), None)
    if c is None:
        return None
    cfg = dataclasses.replace(c, hparams={**c.hparams, **r.hparams}, erasing=erasing)
    return dataclasses.replace(cfg, out=str(Path(c.out).parent / cfg.run_name))


def reading_runs(table: str, planned: list[RunConfig], chosen: list[RunConfig]) -> list[RunConfig]:
    """The runs of the table's readings (`Table.readings`) beside its chosen rows, for `--readings`: for each chosen
    run of a reading's method on a dataset the table shows readings for, the reading's run of that seed and, for a
    reading with erasing, its controls marked with erasing (FedAPC's FedAvg `--erasing`); none the table plans as a
    row. The report's "Readings of" sections read them (at the full profile)."""
    spec = TABLES[table]
    if not spec.readings:
        raise ConfigError(f"table {table} has no readings; --readings is for "
                          f"{', '.join(t for t, s in TABLES.items() if s.readings)}.")
    rows, out = {c.out for c in planned}, {}
    for c in (c for c in chosen if spec.shows_readings(c.dataset)):
        for r in (r for r in spec.readings if r.method == c.method):
            for x, erasing in ((r, r.erasing), *(x.beside(r) for x in spec.reading_controls)):
                run = reading_run(planned, c.dataset, c.seed, x, erasing)
                if run is not None and run.out not in rows:  # (a control without erasing is a row's run)
                    out[run.out] = run
    return list(out.values())
