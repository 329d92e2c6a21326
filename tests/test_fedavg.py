"""Weighted FedAvg of whole state_dicts, BatchNorm buffers included, against hand computations,
through the live path: each client group `accumulate`s, the driver takes the `weighted_mean` of
the groups' partial sums, `FedAvgServer.aggregate` casts it back."""
from __future__ import annotations

import torch

from lightning_modules.fedavg import FedAvgServer
from lightning_modules.server import accumulate, add_sums, cast_like, weighted_mean


def weighted_sum(states, weights):
    """What one client group returns: sum_i w_i * state_i (float64) by `accumulate`."""
    acc = None
    for state, w in zip(states, weights):
        acc = accumulate(acc, state, w)
    return acc


def fedavg(states, weights, groups=1):
    """The live FedAvg round: clients spread round-robin over `groups` client groups, each returns
    its partial sum and weight, the driver takes the weighted mean, the rule aggregates."""
    parts = [(states[g::groups], weights[g::groups]) for g in range(groups)]
    mean64 = weighted_mean([weighted_sum(s, w) for s, w in parts], [sum(w) for _, w in parts])
    return rule().aggregate(states[0], mean64, round_idx=0)


def rule():
    return FedAvgServer({}, 10, 512, 5, ["conv.weight", "bn.bias"])


def _state(w, b, mean, var, nbt):
    return {
        "conv.weight": torch.tensor(w, dtype=torch.float32),
        "bn.bias": torch.tensor(b, dtype=torch.float32),
        "bn.running_mean": torch.tensor(mean, dtype=torch.float32),
        "bn.running_var": torch.tensor(var, dtype=torch.float32),
        "bn.num_batches_tracked": torch.tensor(nbt, dtype=torch.int64),
    }


A = _state([[1.0, 2.0], [0.0, -4.0]], [0.5, 1.0], [0.0, 8.0], [1.0, 2.0], 10)
B = _state([[5.0, -2.0], [4.0, 4.0]], [1.5, -1.0], [4.0, 0.0], [3.0, 6.0], 3)
C = _state([[2.0, 2.0], [2.0, 2.0]], [0.0, 0.0], [2.0, 2.0], [2.0, 2.0], 7)


def test_fedavg_two_clients_by_hand():
    out = fedavg([A, B], [1, 3])
    # (1 * a + 3 * b) / 4
    assert torch.equal(out["conv.weight"], torch.tensor([[4.0, -1.0], [3.0, 2.0]]))
    assert torch.equal(out["bn.bias"], torch.tensor([1.25, -0.5]))
    assert torch.equal(out["bn.running_mean"], torch.tensor([3.0, 2.0]))
    assert torch.equal(out["bn.running_var"], torch.tensor([2.5, 5.0]))
    # (10 + 9) / 4 = 4.75, rounded to 5 and kept int64
    assert out["bn.num_batches_tracked"].dtype == torch.int64
    assert out["bn.num_batches_tracked"].item() == 5
    assert all(out[k].dtype == torch.float32 for k in A if k != "bn.num_batches_tracked")
    assert set(out) == set(A)


def test_fedavg_three_clients_by_hand():
    for groups in (1, 2, 3):
        assert_same(fedavg([A, B, C], [1, 3, 4], groups), fedavg([A, B, C], [1, 3, 4]))
    out = fedavg([A, B, C], [1, 3, 4])
    # (a + 3 b + 4 c) / 8
    assert torch.equal(out["conv.weight"], torch.tensor([[3.0, 0.5], [2.5, 2.0]]))
    assert torch.equal(out["bn.running_mean"], torch.tensor([2.5, 2.0]))
    assert torch.equal(out["bn.running_var"], torch.tensor([2.25, 3.5]))
    assert out["bn.num_batches_tracked"].item() == 6  # (10 + 9 + 28) / 8 = 5.875
    # equal weights are the plain mean
    eq = fedavg([A, B], [2, 2])
    assert torch.equal(eq["bn.running_var"], torch.tensor([2.0, 4.0]))


def test_weighted_sum_and_accumulate_agree():
    s = weighted_sum([A, B, C], [1, 3, 4])
    assert all(v.dtype == torch.float64 for v in s.values())
    assert torch.equal(s["conv.weight"], torch.tensor([[24.0, 4.0], [20.0, 16.0]], dtype=torch.float64))
    assert s["bn.num_batches_tracked"].item() == 47.0
    acc = accumulate(None, A, 1)
    acc = accumulate(acc, B, 3)
    acc = accumulate(acc, C, 4)
    assert all(torch.equal(acc[k], s[k]) for k in s)
    # partial sums of two actors added together give the same total
    parts = add_sums(weighted_sum([A], [1]), weighted_sum([B, C], [3, 4]))
    assert all(torch.equal(parts[k], s[k]) for k in s)
    assert add_sums(None, s) is s
    # the inputs are not modified
    assert A["bn.num_batches_tracked"].item() == 10 and A["conv.weight"][0, 0].item() == 1.0


def assert_same(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_accumulates_in_float64():
    # 1 + 1e-8 is lost in float32 but kept in float64
    x = {"w": torch.tensor([1.0], dtype=torch.float32)}
    y = {"w": torch.tensor([1e-8], dtype=torch.float32)}
    s = weighted_sum([x, y], [1.0, 1.0])
    assert s["w"].item() == 1.0 + float(torch.tensor(1e-8, dtype=torch.float32))


def test_server_rule_aggregate_is_cast_of_mean():
    mean64 = {k: v / 4 for k, v in weighted_sum([A, B], [1, 3]).items()}
    out = rule().aggregate(A, mean64, round_idx=0)
    # (1 * a + 3 * b) / 4 by hand, in A's dtypes (num_batches_tracked: 4.75 rounded to 5)
    ref = {"conv.weight": torch.tensor([[4.0, -1.0], [3.0, 2.0]]), "bn.bias": torch.tensor([1.25, -0.5]),
           "bn.running_mean": torch.tensor([3.0, 2.0]), "bn.running_var": torch.tensor([2.5, 5.0]),
           "bn.num_batches_tracked": torch.tensor(5)}
    assert set(out) == set(ref)
    for k in ref:
        assert out[k].dtype == A[k].dtype and torch.equal(out[k], ref[k]), k
    assert rule().payload({0: {1: torch.ones(3)}}, 0) is None  # FedAvg sends nothing with the weights
    casted = cast_like({"n": torch.tensor(2.6, dtype=torch.float64), "w": torch.tensor(2.6, dtype=torch.float64)},
                       {"n": torch.tensor(0), "w": torch.tensor(0.0, dtype=torch.float16)})
    assert casted["n"].item() == 3 and casted["n"].dtype == torch.int64 and casted["w"].dtype == torch.float16


def test_fedavg_real_model_states():
    from benchmark.models import ResNet10
    torch.manual_seed(0)
    nets = [ResNet10(10) for _ in range(2)]
    x = torch.randn(4, 3, 16, 16)
    for net in nets:  # give the BN buffers different values
        net.train()
        with torch.no_grad():
            net(x + torch.rand(1))
    sa, sb = (n.state_dict() for n in nets)
    out = fedavg([sa, sb], [1, 3])
    assert set(out) == set(sa)
    for k in sa:
        if sa[k].dtype.is_floating_point:
            torch.testing.assert_close(out[k], (sa[k].double() + 3 * sb[k].double()).div(4).float())
        else:
            assert out[k].item() == 1
    assert not torch.equal(sa["bn1.running_mean"], sb["bn1.running_mean"])
