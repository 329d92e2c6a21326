"""`make bench`'s code paths, every section (the GPU-only ones included) with `--profile small` on the CPU:
the report's figures are consistent with one another (ratios and shares recomputed from the printed values),
and in process a round's local training is the groups' training (at the same time or one after another)."""
from __future__ import annotations

import re

import pytest
import torch

from ray_jobs import bench


@pytest.fixture(scope="module")
def report(slow_setup, ray_cluster, data_root, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("BENCH_DATA_ROOT", str(data_root))
    mp.setenv("WANDB_MODE", "disabled")
    try:
        path = bench.main(["--profile", "small", "--out-dir", str(tmp_path_factory.mktemp("perf")),
                           "--full-rounds", "1"])
    finally:
        mp.undo()
    return path.name, path.read_text()


def printed_ratio(a: float, b: float):
    """b / a as printed (to 0.001) from rates printed to 0.1: within the printed values' rounding."""
    return pytest.approx(b / a, abs=5e-4 + b / a * (0.05 / a + 0.05 / b))


def phases(line: str) -> dict[str, tuple[float, float]]:
    """{phase: (seconds, share in %)} of a printed round, and its total under 'round'."""
    out = {k: (float(s), float(p)) for k, s, p in re.findall(r"(\w+) ([\d.]+)s \((\d+)%\)", line)}
    out["round"] = (float(re.search(r"round ([\d.]+)s$", line).group(1)), 100.0)
    return out


def test_every_section_is_reported_and_saved_under_the_device_name(report):
    name, text = report
    assert name == "bench-cpu.txt"
    for section in ("(1)", "(2)", "(3)", "(4)", "(5)", "(6)", "(7)", "(8)", "(9)", "(10)"):
        assert f"\n{section} " in text
    assert "\ncommand: python -m ray_jobs.bench --profile small --out-dir " in text
    # the engines of every method in both precisions, the ratio the printed rates'
    rows = re.findall(r"(\w+) +(32-true|bf16-mixed) +sequential +([\d.]+) images/s +fused +([\d.]+) images/s +"
                      r"fused / sequential +([\d.]+)", text)
    assert {(m, p) for m, p, *_ in rows} == {(m, p) for m in ("fedavg", "fpl") for p in ("32-true", "bf16-mixed")}
    for *_, seq, fused, ratio in rows:
        assert float(ratio) == printed_ratio(float(seq), float(fused))
    # each engine's bf16-mixed / 32-true, of the same rows' rates
    rate = {(m, p, e): float(r) for m, p, s, f, _ in rows for e, r in (("sequential", s), ("fused", f))}
    bf16 = re.findall(r"(\w+) +bf16-mixed / 32-true +sequential +([\d.]+) +fused +([\d.]+)", text)
    assert sorted(m for m, *_ in bf16) == ["fedavg", "fpl"]
    for m, *ratios in bf16:
        assert [float(r) for r in ratios] == [printed_ratio(rate[(m, "32-true", e)], rate[(m, "bf16-mixed", e)])
                                              for e in ("sequential", "fused")]
    # the ceiling of a stack's step: one model on the 2 clients' 16 images each in one batch, its ratio the printed
    # one's
    (ceiling, ratio), = re.findall(r"one model, the 2 clients' images in batches of 32 \(plain loop: a stack's step "
                                   r"without its clients' own weights\) +([\d.]+) images/s, +([\d.]+) x the fused "
                                   r"engine \(FedAvg, 32-true\)", text)
    assert float(ratio) == printed_ratio(rate[("fedavg", "32-true", "fused")], float(ceiling))
    # clients of unequal sizes: one stack against one stack per size and against one client after another
    (seq, one, per_size, r_stacks, r_seq, k_seq, k_one, k_per_size), = re.findall(
        r"clients of unequal sizes \(FedAvg, 2 clients of each of 8, 3, 5 samples, batch 4, 32-true\): sequential "
        r"([\d.]+), one stack ([\d.]+), per-size stacks ([\d.]+) images/s; one stack / per-size stacks +([\d.]+), "
        r"one stack / sequential +([\d.]+); kernels launched \(operators dispatched, views not counted\): "
        r"sequential (\d+), one stack (\d+), per-size stacks (\d+)", text)
    assert float(r_stacks) == printed_ratio(float(per_size), float(one))
    assert float(r_seq) == printed_ratio(float(seq), float(one))
    # 14 client steps one after another against 5 steps of the stack's first 6, 4 (three calls) and 2 clients:
    # the stack launches fewer kernels (its gathers and masked updates before 2026-11-26 launched twice as many:
    # 9,222 against 4,570 for the cuda profile's sizes). On the CPU, where torch's SGD loops over the parameters;
    # on CUDA its foreach form makes the sequential count the smaller (H100, 2026-11-26: 4,574 against 5,056)
    assert int(k_one) < int(k_per_size) < int(k_seq)
    # --cudnn-benchmark on / off: each engine's images/s with it over without (no cuDNN on the CPU: only the path)
    (cudnn,) = re.findall(r"--cudnn-benchmark on / off \(FedAvg, 32-true, no cuDNN on the CPU\): "
                          r"equal sequential +([\d.]+), equal fused +([\d.]+), unequal sequential +([\d.]+), "
                          r"unequal fused +([\d.]+)", text)
    assert all(float(r) > 0 for r in cudnn)
    # --compile on / off: the fused engine compiled (aot_eager on the CPU: the path only) over eager, the ratio the
    # printed rates', and its first round (the compilation) slower than a compiled round of the same 32 images
    (on, off, ratio, first), = re.findall(
        r"--compile on / off \(fused, FedAvg, 32-true, 2 clients of 16 samples, torch.compile backend aot_eager, no "
        r"kernel generation\): ([\d.]+) against ([\d.]+) images/s, +([\d.]+); its first round \(compiling\) ([\d.]+) s",
        text)
    assert float(ratio) == printed_ratio(float(off), float(on))
    assert float(first) > 32 / float(on)
    # the fused step's input both ways, the ratio the printed times' (to 0.01 ms and 0.01)
    (clients, each, one, ratio), = re.findall(r"fused step input \((\d+) clients x 16 augmented images\): "
                                              r"one gather per client +([\d.]+) ms, one for all +([\d.]+) ms per step, "
                                              r"per client / one +([\d.]+)", text)
    assert int(clients) == 2 and float(one) > 0
    r = float(each) / float(one)  # each time printed to 0.005 ms, the ratio to 0.005
    assert float(ratio) == pytest.approx(r, abs=5e-3 + 0.005 * (1 + r) / float(one))
    # (7): training and evaluation in both memory formats, the ratio the printed rates'
    rows = re.findall(r"(training|evaluation), .* contiguous +([\d.]+) images/s +channels_last +([\d.]+) images/s +"
                      r"channels_last / contiguous +([\d.]+)", text)
    assert [r[0] for r in rows] == ["training", "evaluation"]
    for _, contiguous, channels_last, ratio in rows:
        assert float(ratio) == printed_ratio(float(contiguous), float(channels_last))
    # the runs' testing batch on this CPU (64) against one pass, the ratio the printed rates'
    (batched, one, ratio), = re.findall(r"evaluation in batches of 64 \(the runs' on this device\) +([\d.]+) images/s, "
                                        r"one pass of \d+ +([\d.]+) images/s: +([\d.]+)", text)
    assert float(ratio) == printed_ratio(float(one), float(batched))
    # (2)'s ratio beside its target; (8) a FedPLVM round without and with evaluation, and the full runs' estimates
    assert re.search(r"ratio fit_local / plain +[\d.]+ +\(target >= 0\.98\)", text)
    # the client loop's kernels: the plain loop's and, on 2 steps an epoch (16 images, batch 8), one a step (its loss
    # sum) and two an epoch (zeroing its class sums); the rest of its per-step cost over the plain loop is host time
    kp, ko = map(float, re.search(r"kernels per step \(operators dispatched, views not counted\): plain ([\d.]+), "
                                  r"fit_local ([\d.]+)", text).groups())
    assert kp > 100 and ko == kp + 1 + 2 / 2
    (plain, evaluation, evaluated, ratio), = re.findall(
        r"without evaluation \(round 1\) .*round ([\d.]+)s\n.*with evaluation +\(round 2\) .*evaluation ([\d.]+)s "
        r"\(\d+%\).*round ([\d.]+)s\n +with / without +([\d.]+)", text)
    plain, evaluated = float(plain), float(evaluated)
    assert float(evaluation) > 0 and float(ratio) == pytest.approx(evaluated / plain,
                                                                   abs=6e-3 + 1e-3 * evaluated / plain)
    estimates = re.findall(r"a full run \(50 rounds\) at --eval-every (\d+) *: +(\d+) rounds evaluated, "
                           r"about +([\d.]+) min", text)
    assert [(int(k), int(e)) for k, e, _ in estimates] == [(1, 50), (5, 10), (50, 1)]  # every 5th, and the final
    for _, e, minutes in estimates:
        assert float(minutes) == pytest.approx((int(e) * evaluated + (50 - int(e)) * plain) / 60, abs=0.051)


def test_phase_shares_add_up_and_in_process_training_is_the_sum_of_the_groups(report):
    _, text = report
    lines = [ln for ln in text.splitlines() if re.match(r" +(sequential|fused) +local_training", ln)
             or ln.lstrip().startswith("full FPL")]
    assert len(lines) == 6  # (5): two engines, then Office and Digits with two engines each
    assert "full FPL digits without svhn" in text  # the shared data root has no SVHN test set
    for line in lines:
        p = phases(line)
        total = p.pop("round")[0]
        assert sum(s for s, _ in p.values()) == pytest.approx(total, abs=5e-3)
        for s, share in p.values():
            # the share is printed rounded to 1%, from seconds that are themselves printed rounded to 1 ms
            assert share == pytest.approx(100 * s / total, abs=0.5 + 100 * 1e-3 / total)
        # two client groups in one process, at the same time (sequential) or one after another (fused): the round's
        # training is the slower one's or both groups', nothing of it counted as transfer
        assert p["transfer_and_scheduling"][0] < 0.1 * p["local_training"][0]


def test_full_rounds_estimate_a_whole_run_from_the_last_rounds_phases(report):
    """--full-rounds K: each full run's K rounds, and the protocol's 100 rounds estimated as 100 x the last round's
    training plus its evaluation x the 24 rounds Table 2's schedule tests (every 5th, and the last 5)."""
    _, text = report
    lines = [ln for ln in text.splitlines() if ln.lstrip().startswith("full FPL")]
    assert [re.search(r"engine (\w+)", ln).group(1) for ln in lines] == ["sequential", "fused"] * 2
    for line in lines:
        rounds, est = map(int, re.search(r"a whole run of (\d+) rounds about (\d+) s", line).groups())
        assert rounds == 100 and "x the 24 rounds --eval-every 5 tests" in line and ": 1 rounds x 1 epochs" in line
        p = phases(line)
        evaluation, total = p["evaluation"][0], p["round"][0]
        # est = 100 x round - 76 x evaluation, from seconds printed to 1 ms (each within 5e-4), printed to 1 s
        assert est == pytest.approx(100 * (total - evaluation) + 24 * evaluation, abs=0.5 + (100 + 76) * 5e-4)


def test_checkpoint_writes_hold_the_models_they_name(report):
    """(6): the checkpoint sizes are the global ResNet-10 alone and with k client models beside it (bytes of
    the state_dicts, counted here), rates and savings recomputed from the printed values."""
    from benchmark.models import ResNet10

    _, text = report
    rows = re.findall(r"^    (?:global model only \(FedAvg, FPL\)|and (\d+) client models \(MOON\)) +([\d.]+) MB +"
                      r"([\d.]+) s +(\d+) MB/s +--checkpoint-every 10 saves ([\d.]+) s per round$", text, re.M)
    assert len(rows) == 2
    model_mb = sum(v.numel() * v.element_size() for v in ResNet10().state_dict().values()) / 1e6
    for k, mb, secs, rate, saved in rows:
        mb, secs = float(mb), float(secs)
        assert mb == pytest.approx((1 + int(k or 0)) * model_mb, rel=0.01)  # (the file's own framing: < 1%)
        assert float(saved) == pytest.approx(0.9 * secs, abs=1e-3)
        assert float(rate) == pytest.approx(mb / secs, abs=0.5 + mb / secs * (5e-4 / secs + 0.05 / mb))
    assert int(rows[1][0]) == 2  # the small profile's client count


def test_many_clients_hold_one_client_on_the_device_and_name_a_model_per_client(report):
    """(9): 20, 100 and 500 clients of FPL's Digits without SVHN (17, 85 and 425 here), a tenth drawn (2, 8, 42),
    one client on the device at a time, the images held in host memory, and a model per client counted as clients x
    ResNet-10's bytes."""
    from benchmark.communication import count
    from benchmark.models import ResNet10

    _, text = report
    rows = re.findall(r"^    (\S+) +(\d+) clients \((\d+) images\), +(\d+) drawn: build +[\d.]+ s, "
                      r"round +[\d.]+ s \( *[\d.]+ images/s\), at most (\d+) client on the device, "
                      r"host +([\d.]+) MB; a model per client \(MOON\) would add +([\d.]+) MB",
                      text, re.M)
    assert [(p, int(n), int(k), int(one)) for p, n, _, k, one, _, _ in rows] == [
        ("fpl-digits", 17, 2, 1), ("scale-digits-100", 85, 8, 1), ("scale-digits-500", 425, 42, 1)]
    model_mb = count(ResNet10().state_dict())[1] / 1e6
    for _, n, images, _, _, host, mb in rows:
        assert float(mb) == pytest.approx(int(n) * model_mb, abs=0.051)
        # FedAvg keeps no state: the host memory is the images (3 x 32 x 32 bytes) and labels (8 bytes) it holds
        assert float(host) == pytest.approx(int(images) * (3 * 32 * 32 + 8) / 2**20, abs=0.051)


def test_kernels_counts_the_operators_that_are_not_views():
    """ones, add, mul_ launch a kernel each; view and the slice launch none."""
    assert bench.kernels(lambda: (torch.ones(3) + 1).view(3, 1)[:2].mul_(2)) == 3


def test_bf16_mixed_over_32_true_of_both_loops_and_whether_the_processor_has_native_bfloat16(report):
    """(2): both loops in bf16-mixed, their ratios over the 32-true rates printed above them; the processor's
    native bfloat16 as `native_bf16` reads its flags, and the precision --precision auto picks from it."""
    from benchmark.provenance import cpu_flags, native_bf16

    _, text = report
    plain, ours = (float(re.search(rf"{what} +([\d.]+) images/s", text).group(1))
                   for what in ("plain PyTorch loop", "LightningModule fit_local"))
    bf_plain, bf_ours, r_plain, r_ours = map(float, re.search(
        r"bf16-mixed: plain ([\d.]+), fit_local ([\d.]+) images/s; bf16-mixed / 32-true: plain +([\d.]+), "
        r"fit_local +([\d.]+)", text).groups())
    assert r_plain == printed_ratio(plain, bf_plain) and r_ours == printed_ratio(ours, bf_ours)
    native = native_bf16(cpu_flags())
    (said, picked), = re.findall(r"native bfloat16 on this processor: (yes|no) \(.*\); --precision auto picks "
                                 r"(32-true|bf16-mixed)", text)
    assert (said == "yes", picked) == (native, "bf16-mixed" if native else "32-true")


def test_a_round_in_process_with_the_groups_one_after_another_and_at_the_same_time(report):
    """(10): both ways' second round, the ratios those of the printed times."""
    _, text = report
    rows = dict(re.findall(r"^    groups (one after another|at the same time) +(.*)$", text, re.M))
    assert list(rows) == ["one after another", "at the same time"]
    one, both = (phases(rows[way]) for way in rows)
    r_train, r_round = map(float, re.search(r"one after another / at the same time: local training +([\d.]+), "
                                            r"round +([\d.]+)", text).groups())
    for ratio, key in ((r_train, "local_training"), (r_round, "round")):
        a, b = one[key][0], both[key][0]  # seconds printed to 1 ms
        assert ratio == pytest.approx(a / b, abs=5e-4 + (a / b) * 5e-4 * (1 / a + 1 / b))
