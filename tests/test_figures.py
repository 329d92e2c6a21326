"""Figures, t-SNE, progress output and the W&B run's metadata.

Curves and bars are drawn from constructed run folders (two methods, two seeds,
three rounds, written by the real Recorder without training) and must plot the
folders' numbers; the t-SNE command, the terminal progress bar and the W&B
offline records come from one real 2-round run.
"""
from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchmark import figures, paper
from benchmark.data import eval_subset, load_domain
from benchmark.results import MODEL_FILE, Recorder
from ray_jobs import figures as cli
from ray_jobs import progress
from ray_jobs.config import RunConfig
from ray_jobs.progress import RunProgress, SweepProgress
from ray_jobs.run import run

DOMAINS = ["mnist", "usps", "syn"]  # digits without svhn: the paper's AVG becomes the mean of these three
METHODS, SEEDS, ROUNDS = ["fedavg", "fpl"], [0, 1], 3


def check_png(path: Path, min_side: int = 200, max_side: int = 4000) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    w, h = struct.unpack(">II", data[16:24])
    assert min_side <= w <= max_side and min_side <= h <= max_side, (w, h)
    assert len(data) > 5000  # something was drawn
    return w, h


def check_svg(path: Path) -> None:
    assert "<svg" in path.read_text()[:2000]


@pytest.fixture
def constructed(tmp_path, monkeypatch):
    """Run folders in the real format, with accuracies drawn here: {(method, seed): (run_dir, records)}."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    rng = np.random.default_rng(7)
    runs = {}
    for m in METHODS:
        for seed in SEEDS:
            cfg = RunConfig(method=m, dataset="digits", domains=DOMAINS, seed=seed, rounds=ROUNDS)
            out = tmp_path / "runs" / cfg.run_name
            record = {**cfg.to_dict(), "run_name": cfg.run_name, "dropped_domains": cfg.dropped_domains}
            rec = Recorder(out, record, [{"id": 0, "domain": "mnist", "num_samples": 5}], {d: 10 for d in DOMAINS})
            records = []
            for r in range(ROUNDS):
                acc = {d: float(rng.uniform(0, 100)) for d in DOMAINS}
                acc["AVG"] = float(np.mean(list(acc.values())))
                records.append({"round": r, "accuracy": acc, "train_loss": 1.0, "client_loss": {"0": 1.0},
                                "time_s": {"round": 1.0}})
                rec.log_round(records[-1])
            rec.finish()
            runs[(m, seed)] = (out, records)
    return runs


def test_curves_plot_the_runs_numbers(constructed, tmp_path):
    dirs = [d for d, _ in constructed.values()]
    data = figures.plot_curves(dirs, tmp_path / "fig" / "curves")
    check_png(tmp_path / "fig" / "curves.png")
    check_svg(tmp_path / "fig" / "curves.svg")
    assert len(data) == len(METHODS) * (len(DOMAINS) + 1) * ROUNDS
    for m in METHODS:
        for d in DOMAINS + ["AVG"]:
            for r in range(ROUNDS):
                values = [constructed[(m, s)][1][r]["accuracy"][d] for s in SEEDS]
                row = data[(data.method == m) & (data.domain == d) & (data["round"] == r + 1)].iloc[0]
                assert row["mean"] == pytest.approx(np.mean(values))
                assert row["std"] == pytest.approx(np.std(values, ddof=1))
                assert row["seeds"] == 2 and row["dataset"] == "digits"


@pytest.mark.slow
def test_bars_plot_the_last5_means_beside_the_paper(constructed, tmp_path):
    dirs = [d for d, _ in constructed.values()]
    data = figures.plot_bars(dirs, paper.TABLE2, tmp_path / "bars")
    check_png(tmp_path / "bars.png")
    check_svg(tmp_path / "bars.svg")
    assert len(data) == len(METHODS) * (len(DOMAINS) + 1)
    for m in METHODS:
        for d in DOMAINS + ["AVG"]:
            per_seed = [np.mean([rec["accuracy"][d] for rec in constructed[(m, s)][1]]) for s in SEEDS]  # 3 rounds < 5
            row = data[(data.method == m) & (data.domain == d)].iloc[0]
            assert row["ours"] == pytest.approx(np.mean(per_seed))
            assert row["std"] == pytest.approx(np.std(per_seed, ddof=1))
            ref = (np.mean([paper.TABLE2[m]["digits"][x] for x in DOMAINS]) if d == "AVG"
                   else paper.TABLE2[m]["digits"][d])
            assert row["paper"] == pytest.approx(ref)


@pytest.mark.slow
def test_drawing_again_writes_the_same_bytes(constructed, tmp_path):
    """A redraw from unchanged runs leaves every file as it was: no date in the SVG, and its clip-path ids hashed
    with a fixed salt (matplotlib's default salt is random per process and per file)."""
    dirs = [d for d, _ in constructed.values()]
    figures.plot_bars(dirs, paper.TABLE2, tmp_path / "a" / "bars")
    figures.plot_bars(dirs, paper.TABLE2, tmp_path / "b" / "bars")
    for fmt in figures.FORMATS:
        first, second = ((tmp_path / x / f"bars.{fmt}").read_bytes() for x in "ab")
        assert first == second, fmt
    assert b"<dc:date>" not in (tmp_path / "a" / "bars.svg").read_bytes()


def test_regenerate_redraws_a_report_from_its_run_folders(constructed, tmp_path, capsys):
    names = sorted(d.name for d, _ in constructed.values())
    (tmp_path / "table1.md").write_text("# FPL Table 1: reproduction (smoke profile)\n\n" + cli.RUNS_LINE
                                        + ", ".join(names) + "\n")
    (tmp_path / "table3.md").write_text("# FPL Table 3: reproduction\n\n" + cli.RUNS_LINE + "gone-run\n")
    assert cli.main(["all", str(tmp_path)]) == 0
    for name in ("curves", "bars"):
        check_png(tmp_path / "figures" / "table1" / f"{name}.png")
        check_svg(tmp_path / "figures" / "table1" / f"{name}.svg")
    assert not (tmp_path / "figures" / "table3").exists()
    out = capsys.readouterr().out
    assert "skipped" in out and "table3.md: 1 of 1 run folders missing" in out and "written 4 figure files" in out


@pytest.mark.slow
def test_regenerate_draws_a_report_as_the_report_did(constructed, tmp_path, monkeypatch):
    """`make figures` draws a table's methods and datasets in the order its report lists its runs (the table's:
    FPL Table 2 puts fpl before fedavg, not alphabetically) under the report's own title."""
    drawn = []

    def spy(table, run_dirs, out_dir, title=""):
        got = cli_table_figures(table, run_dirs, out_dir, title)
        drawn.append((table, title, list(dict.fromkeys(got["bars"].method)), list(dict.fromkeys(got["curves"].method))))
        return got

    cli_table_figures = cli.table_figures
    monkeypatch.setattr(cli, "table_figures", spy)
    order = [RunConfig(method=m, dataset="digits", domains=DOMAINS, seed=s, rounds=ROUNDS) for m in ("fpl", "fedavg")
             for s in SEEDS]
    (tmp_path / "table2.md").write_text("# FPL Table 2: reproduction (full profile) — PARTIAL: 4 of its 48 runs\n\n"
                                        + cli.runs_line(order) + "\n")
    assert cli.regenerate([tmp_path])
    assert drawn == [("2", "FPL Table 2, full profile", ["fpl", "fedavg"], ["fpl", "fedavg"])]
    short = f"-rounds{ROUNDS}"  # the runs' departure from FPL's 100 rounds, in their names
    assert cli.runs_line(order + order[:1]) == (
        f"Runs: fpl-digits-no_svhn-code{short}-seed0, fpl-digits-no_svhn-code{short}-seed1, "
        f"fedavg-digits-no_svhn-code{short}-seed0, fedavg-digits-no_svhn-code{short}-seed1")


def test_regenerate_of_a_folder_that_is_not_there_says_so(tmp_path, capsys):
    assert cli.main(["all", str(tmp_path), str(tmp_path / "gone")]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'gone'}: no such folder; name results folders that hold "
                                       "table reports (table*.md and runs/), e.g. results.\n")


def test_regenerate_of_a_folder_without_reports_says_why_nothing_was_drawn(tmp_path, capsys):
    (tmp_path / "runs" / "a-run").mkdir(parents=True)  # run folders, but no table report
    assert cli.main(["all", str(tmp_path)]) == 0
    assert capsys.readouterr().out == (f"written 0 figure files ({tmp_path}: no table report (table*.md) with its "
                                       "runs, and no demo run folders; `figures tsne RUN_DIR` draws a run's own "
                                       "map)\n")


def test_tsne_of_a_run_without_a_model_says_so(constructed, capsys):
    run_dir = constructed[("fpl", 0)][0]
    assert cli.main(["tsne", str(run_dir)]) == 2
    assert f"{run_dir} has no {MODEL_FILE}" in capsys.readouterr().err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def fake_round(r: int, avg: float) -> dict:
    return {"round": r, "accuracy": {"mnist": avg, "AVG": avg}, "train_loss": 0.5, "time_s": {"round": 0.1}}


def test_run_progress_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    p = RunProgress("demo", 3, stream=out)
    for r, avg in enumerate([10.0, 20.0, 30.0]):
        p.update(fake_round(r, avg))
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in out.getvalue()
    assert lines[1].startswith("[demo] round 2/3  loss 0.5000  mnist 20.00  AVG 20.00  (0.1s, ETA ")
    assert lines[2].endswith("ETA 00:00)")


class Writes(io.StringIO):
    """A stream that records each write: another thread's line can land only between two writes."""

    def __init__(self):
        super().__init__()
        self.writes = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


class TerminalWrites(Writes, Terminal):
    pass


def test_every_progress_line_is_one_write_with_its_newline():
    """`print(line)` and `tqdm.write(line)` write the line and its newline apart; a Ray worker's line printed between
    them would sit inside ours. Plain lines, and on a terminal the lines above the bar."""
    run_out, sweep_out = Writes(), Writes()
    RunProgress("demo", 2, stream=run_out).update(fake_round(0, 10.0))
    p = SweepProgress(2, stream=sweep_out)
    p.started("a")
    p.round("a", 0, 2, 10.0)
    p.finished("a", {"final": {"AVG": 15.0}, "last5": None, "wall_time_s": 3})
    assert len(run_out.writes) == 1 and run_out.writes[0].startswith("[demo] round 1/2 ")
    assert [w.split("] ", 1)[1] for w in sweep_out.writes] == ["started a\n", "a: round 1/2, AVG 10.00\n",
                                                                "a: AVG 15.00 final (3s)\n"]
    assert all(w.count("\n") == 1 and w.endswith("\n") for w in run_out.writes + sweep_out.writes)
    term = TerminalWrites()  # a bar, the lines above it
    p = SweepProgress(2, stream=term)
    p.finished("a", {"final": {"AVG": 15.0}, "last5": None, "wall_time_s": 3})
    assert "a: AVG 15.00 final (3s)\n" in term.writes


def test_a_resumed_runs_progress_counts_its_own_rounds(monkeypatch):
    """A run resumed after 7 of its 10 rounds shows rounds 8 to 10 of 10, its time left from the rounds it trained
    (its clock here a fake one: the first round it trains takes 30 s)."""
    clock = [1000.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    out, term = io.StringIO(), Terminal()
    plain, bar = RunProgress("demo", 10, stream=out, first=7), RunProgress("demo", 10, stream=term, first=7)
    clock[0] += 30
    for p in (plain, bar):
        p.update(fake_round(7, 10.0))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[demo] round 8/10  loss 0.5000") and lines[0].endswith("ETA 01:00)")  # 2 of 30 s
    assert term.getvalue().split("\r")[-1].startswith("demo 8/10 rounds |")
    for p in (plain, bar):
        p.update(fake_round(8, 10.0))
        p.update(fake_round(9, 10.0))
        p.close()
    assert out.getvalue().splitlines()[-1].startswith("[demo] round 10/10 ")


def test_run_progress_bar_in_a_terminal():
    out = Terminal()
    p = RunProgress("demo", 3, stream=out)
    for r, avg in enumerate([10.0, 20.0]):
        p.update(fake_round(r, avg))
    text = out.getvalue()
    assert "\r" in text and "[demo] round" not in text
    last = text.split("\r")[-1]
    assert last.startswith("demo 2/3 rounds |") and "ETA " in last and last.rstrip().endswith("AVG 20.00, loss 0.5000")


def test_sweep_progress_counts_in_both_modes():
    for out in (io.StringIO(), Terminal()):
        p = SweepProgress(4, stream=out)
        p.started("a")
        p.started("b")
        p.finished("a", {"final": {"AVG": 15.0}, "last5": {"AVG": 12.5}, "wall_time_s": 3})
        p.failed_run("b", "boom")
        p.started("c")
        assert p.counts().startswith("1 done, 1 running, 1 failed, 1 left, ETA ")
        p.close()
        text = out.getvalue()
        assert "a: AVG 15.00 final, 12.50 last-5 mean (3s)" in text and "b FAILED: boom" in text
        if isinstance(out, Terminal):
            assert "1 running, 1 failed, 1 left" in text.split("\r")[-2] + text.split("\r")[-1]
        else:
            assert "[1 done, 0 running, 1 failed, 2 left, ETA " in text  # the line written when b failed


# --------------------------------------------------------------------------- one real run

def wandb_records(run_dir: Path) -> list:
    """The records of an offline W&B run, read from its .wandb file (W&B's LevelDB-style log of protobufs)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk  # full/first start a record; middle/last continue it
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


@pytest.fixture(scope="module")
def real_run(slow_setup, data_root, tmp_path_factory):
    """FedAvg on Office-Caltech, 2 rounds of 1 epoch on 10% of the data, local executor, 40 test images per
    domain, W&B offline, printing to a terminal (a stream that says it is one)."""
    out = tmp_path_factory.mktemp("tsne") / "fedavg-office"
    cfg = RunConfig(method="fedavg", dataset="office_caltech", rounds=2, local_epochs=1, client_fraction=0.1,
                    eval_max=40, executor="local", num_actors=1, data_root=str(data_root), out=str(out),
                    wandb_group="table9-test")
    term = Terminal()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", term)
        summary = run(cfg)
    return out, summary, cfg, term.getvalue()


def test_real_run_shows_a_bar_and_saves_a_small_model(real_run):
    out, summary, cfg, printed = real_run
    last = printed.split("\r")[-1]
    assert last.startswith(f"{cfg.run_name} 2/2 rounds |") and f"AVG {summary['final']['AVG']:.2f}" in last
    state = torch.load(out / MODEL_FILE, weights_only=True)
    assert state["classifier.weight"].dtype == torch.float16 and state["bn1.num_batches_tracked"].dtype == torch.int64
    assert 9e6 < (out / MODEL_FILE).stat().st_size < 11e6  # 4.9 M parameters in float16
    check_png(out / "curves.png")


@pytest.mark.slow
def test_tsne_command_on_a_real_run(real_run, data_root, capsys):
    out, _, cfg, _ = real_run
    assert cli.main(["tsne", str(out), "--per-domain", "25"]) == 0
    assert f"written: {out / 'tsne.png'}" in capsys.readouterr().out
    check_png(out / "tsne.png")
    check_svg(out / "tsne.svg")
    maps = figures.plot_tsne([out], out / "again", per_domain=25, formats=("png",))
    assert list(maps) == [cfg.run_name]
    m = maps[cfg.run_name]
    for dom in cfg.domains:  # the points are the run's evaluated test images (40 at most), 25 of them per domain
        d = load_domain(data_root, "office_caltech", dom, need_train=False)
        keep = eval_subset(len(d.test_y), 40)
        assert len(keep) > 25
        assert m[m.domain == dom].label.tolist() == d.test_y[keep[eval_subset(len(keep), 25)]].tolist()
    assert np.isfinite(m[["x", "y"]].to_numpy()).all() and m[["x", "y"]].std().min() > 0


def test_wandb_offline_run_carries_config_tags_summary_and_figure(real_run):
    out, summary, cfg, _ = real_run
    run_dir = next((out / "wandb").glob("offline-run-*"))
    records = wandb_records(run_dir)
    info = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    config = {u.key: json.loads(u.value_json) for u in info.config.update}
    assert ((config["method"], config["dataset"], config["split"], config["seed"])
            == ("fedavg", "office_caltech", "default", 0))
    assert (config["rounds"], config["local_epochs"], config["lr"]) == (2, 1, 0.01)
    assert set(info.tags) == {"method:fedavg", "dataset:office_caltech", "split:default",
                              "seed:0"}  # no hyperparameters
    assert (info.run_group, info.job_type) == ("table9-test", "train")
    summ = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            for u in r.summary.update:
                summ[u.key or "/".join(u.nested_key)] = json.loads(u.value_json)
    for d, v in summary["last5"].items():
        assert summ[f"last5/{d}"] == pytest.approx(v)
    assert summ["wall_time_s"] == pytest.approx(summary["wall_time_s"])
    images = list(run_dir.glob("files/media/images/curves_*.png"))
    assert len(images) == 1 and images[0].read_bytes() == (out / "curves.png").read_bytes()


def test_wandb_config_and_tags_carry_method_hyperparameters():
    from benchmark.results import wandb_config, wandb_tags

    cfg = {**RunConfig(method="fpl", hparams={"tau": 0.05}).to_dict(), "run_name": "x"}
    conf, tags = wandb_config(cfg), wandb_tags(cfg)
    assert conf["tau"] == 0.05 and conf["upcr_target"] == "unbiased" and "hparams" not in conf
    assert {"method:fpl", "seed:0", "tau:0.05", "cpcl:True", "upcr_target:unbiased"} <= set(tags)


def test_sweep_progress_counts_rounds_and_shows_the_evaluated_ones():
    """Given the rounds each run has left, a sweep's time left comes from the rounds trained (not ? until a run
    ends), and each evaluated round is a line (plain mode); a skipped evaluation is counted, not shown; a run that
    fails leaves no rounds behind it (the time left is 0 once the others end)."""
    out = io.StringIO()
    p = SweepProgress(2, stream=out, rounds={"a": 4, "b": 4})
    p.started("a")
    p.started("b")
    assert p.counts().endswith("ETA ?")
    p.round("a", 0, 4, None)
    p.round("a", 1, 4, 12.5)
    assert p.trained == 2 and p.counts().startswith("0 done, 2 running, 0 failed, 0 left, ETA 00:0")
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("[0 done, 2 running, 0 failed, 0 left, ETA ")
    assert lines[-1].endswith("] a: round 2/4, AVG 12.50")
    assert not any("round 1/4" in line for line in lines)
    assert p.rounds_left == {"a": 2, "b": 4}
    p.failed_run("b", "boom")
    p.round("a", 2, 4, 20.0)
    p.round("a", 3, 4, 30.0)
    p.finished("a", {"final": {"AVG": 30.0}, "last5": None, "wall_time_s": 1})
    assert p.rounds_left == {"a": 0, "b": 0} and p.counts() == "1 done, 0 running, 1 failed, 0 left, ETA 00:00"
    term = Terminal()
    bar = SweepProgress(2, stream=term, rounds={"a": 4, "b": 4})
    bar.started("a")
    bar.round("a", 0, 4, None)
    bar.round("a", 1, 4, 12.5)
    last = term.getvalue().split("\r")[-1]
    bar.failed_run("a", "boom")
    after = term.getvalue().split("\r")[-1]
    bar.close()
    assert "a: round" not in term.getvalue()
    assert last.startswith("sweep 2/8 rounds |") and last.rstrip().endswith("0 done, 1 running, 0 failed, 1 left")
    assert after.startswith("sweep 2/6 rounds |")  # a's 2 rounds left are gone
