"""FedPLVM's Table 11 privacy protection (appendix G; lightning_modules/privacy.py): the noise multiplier Opacus's
accountant sets for the protocol reaches epsilon 4 at delta 1e-5 (checked with a fresh accountant), DP-SGD's
clipped per-sample gradients against per-sample autograd and never above the bound in a run, Opacus's GroupNorm
model, Gaussian noise on the local prototypes against a hand computation, the fused engine's refusal."""
from __future__ import annotations

import copy

import pytest
import torch
from opacus.accountants import RDPAccountant
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator

from benchmark.models import ResNet10PLVM, build_model
from benchmark.protocols import DATASET_SPECS, ConfigError
from lightning_modules.base import fit_local
from lightning_modules.clients import resolve_engine
from lightning_modules.fedplvm import FedPLVMClient, FedPLVMRound
from lightning_modules.fused import fit_fused
from lightning_modules.privacy import DPSGD, model_options, noise_multiplier, perturb_prototypes
from lightning_modules.registry import METHODS
from ray_jobs.config import RunConfig

EPSILON, DELTA = 4.0, 1e-5


def spent_epsilon(sigma: float, sample_rate: float, steps: int) -> float:
    """Epsilon at DELTA after `steps` steps, from a fresh Opacus RDP accountant (not the search that chose sigma)."""
    accountant = RDPAccountant()
    accountant.history = [(sigma, sample_rate, steps)]
    return accountant.get_epsilon(delta=DELTA)


@pytest.mark.parametrize("preset,steps", [("fedplvm-digit5", 300), ("fedplvm-office10", 480)])
def test_noise_multiplier_reaches_epsilon_over_the_whole_run(preset, steps):
    """100 images a client, batch 32 with drop_last: 3 steps an epoch, 2 epochs, 50 (80) rounds."""
    cfg = RunConfig.from_preset(preset, method="fedplvm_dp_model")
    assert cfg.rounds * cfg.local_epochs * (100 // cfg.batch_size) == steps and cfg.drop_last
    assert (cfg.hparams["dp_epsilon"], cfg.hparams["dp_delta"]) == (EPSILON, DELTA)
    q = cfg.batch_size / 100
    sigma = noise_multiplier(EPSILON, DELTA, q, steps)
    assert EPSILON - 0.01 <= spent_epsilon(sigma, q, steps) <= EPSILON  # the budget reached, not exceeded
    assert spent_epsilon(0.97 * sigma, q, steps) > EPSILON  # and no more noise than it needs
    assert spent_epsilon(sigma, q, 2 * steps) > EPSILON  # one round's steps alone would not do
    assert sigma == pytest.approx({300: 6.52, 480: 8.20}[steps], abs=0.01)  # docs/fedplvm.md's values


@pytest.mark.parametrize("preset,run_epsilon", [("fedplvm-digit5", 30.5), ("fedplvm-office10", 41.5)])
@pytest.mark.slow
def test_noise_multiplier_of_a_round_budget(preset, run_epsilon):
    """dp_budget="round": a round's 6 steps (2 epochs of 3 batches of 32 of 100 images) within (epsilon, delta),
    sigma 1.38; the run's 50 (80) rounds then spend epsilon 30.5 (41.5), docs/fedplvm.md's values."""
    cfg = RunConfig.from_preset(preset, method="fedplvm_dp_model", hparams={"dp_budget": "round"})
    q, steps = cfg.batch_size / 100, cfg.local_epochs * (100 // cfg.batch_size)
    sigma = noise_multiplier(EPSILON, DELTA, q, steps)
    assert EPSILON - 0.01 <= spent_epsilon(sigma, q, steps) <= EPSILON
    assert sigma == pytest.approx(1.38, abs=0.01)
    assert spent_epsilon(sigma, q, cfg.rounds * steps) == pytest.approx(run_epsilon, abs=0.05)


def images(n: int, seed: int = 0) -> torch.Tensor:
    """32 x 32 (the protocol's are 64 x 64; the model pools its features globally): a quarter of the time."""
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def dp_client(**hp) -> FedPLVMClient:
    torch.manual_seed(0)
    hparams = {**METHODS["fedplvm_dp_both"].defaults, **hp}
    module = FedPLVMClient(build_model("resnet10_plvm", 10, **model_options(hparams)), hparams,
                           lr=0.01, momentum=0.5, weight_decay=1e-5)
    module.transform = DATASET_SPECS["digit5"].transform
    return module


def payload(dtype=torch.float32) -> FedPLVMRound:
    """Round 1's prototypes (non-negative like the post-ReLU features): the alpha-sparsity contrast and the
    correction."""
    g = torch.Generator().manual_seed(1)
    return FedPLVMRound(prototypes=torch.rand(6, 512, generator=g, dtype=dtype),
                        prototype_labels=torch.tensor([0, 0, 1, 2, 2, 3]))


def test_clipped_per_sample_gradients_are_per_sample_autograd_clipped():
    """One DP-SGD step without noise on FedPLVM's whole loss: the gradient is (1/B) sum_i g_i min(1, C / |g_i|),
    g_i each sample's gradient by autograd on that sample alone; C between the samples' norms, so that some are
    clipped and some are not."""
    module = dp_client().double()
    module.start_round(1, payload(torch.float64), module.net.state_dict())
    before = copy.deepcopy(module)
    x = module.transform.train(images(4)).double()
    y = torch.tensor([0, 1, 2, 1])
    params = list(before.net.parameters())
    per_sample = []
    for i in range(4):
        xi, yi = x[i:i + 1], y[i:i + 1]
        grads = torch.autograd.grad(before.compute_loss(xi, yi, *before.net(xi)), params)
        per_sample.append(grads)
    norms = torch.stack([torch.sqrt(sum((g ** 2).sum() for g in gs)) for gs in per_sample])
    c = float(norms.sort().values[1:3].mean())  # two clipped, two not
    expected = [sum(gs[j] * min(1.0, c / (float(n) + 1e-6)) for gs, n in zip(per_sample, norms)) / 4
                for j in range(len(params))]

    module.on_train_epoch_start()
    module.train()
    dp = DPSGD(module.net, module.configure_optimizers(), noise_multiplier=0.0, max_grad_norm=c, batch_size=4,
               generator=torch.Generator())
    seen = {}
    dp.optimizer.attach_step_hook(lambda opt: seen.update(grads=[p.grad.clone() for p in module.net.parameters()]))
    loss = module.training_step((x, y), 0)
    dp.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    dp.optimizer.step()
    dp.close()
    for got, want in zip(seen["grads"], expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert (norms > c).sum() == 2 and torch.sqrt(sum((g ** 2).sum() for g in seen["grads"])) <= c


@pytest.mark.parametrize("budget,budget_steps", [("run", 6), ("round", 3)])
@pytest.mark.slow
def test_a_runs_clipped_per_sample_gradients_never_exceed_the_bound(monkeypatch, budget, budget_steps):
    """Two rounds through fit_local (round 0 CE alone, round 1 FedPLVM's loss), batch 1: each step's summed clipped
    gradient is that sample's clipped gradient, read before the noise is added; the noise multiplier is the
    accountant's for the run's 6 steps at sample rate 1/3 (`dp_budget` "run"), or for a round's 3 ("round", which
    then spends more than epsilon over the run)."""
    steps = []

    def add_noise(opt):
        clipped = torch.sqrt(sum((p.summed_grad ** 2).sum() for p in opt.params))
        raw = torch.sqrt(sum((p.grad_sample ** 2).sum() for p in opt.params))
        steps.append((float(clipped), float(raw), opt.noise_multiplier, opt.max_grad_norm))
        original(opt)

    original = DPOptimizer.add_noise
    monkeypatch.setattr(DPOptimizer, "add_noise", add_noise)
    module = dp_client(dp_max_grad_norm=0.5, dp_budget=budget)
    module.run_rounds = 2
    x, y = images(3, seed=2), torch.tensor([0, 1, 1])
    start = {k: v.clone() for k, v in module.net.state_dict().items()}
    for r, p in ((0, None), (1, payload())):
        module.start_round(r, p, module.net.state_dict())
        fit_local(module, x, y, epochs=1, batch_size=1, generator=torch.Generator().manual_seed(r), drop_last=True)
    sigma = noise_multiplier(EPSILON, DELTA, 1 / 3, budget_steps)
    assert len(steps) == 6 and {(s, c) for *_, s, c in steps} == {(sigma, 0.5)}
    assert all(clipped <= 0.5 * (1 + 1e-4) for clipped, *_ in steps)  # (float32 sums of 4.9M squares)
    assert all(raw > 0.5 for _, raw, *_ in steps)  # every step was clipped: the bound did bind
    assert EPSILON - 0.01 <= spent_epsilon(sigma, 1 / 3, budget_steps) <= EPSILON
    assert (spent_epsilon(sigma, 1 / 3, 6) > EPSILON) == (budget == "round")
    assert any(not torch.equal(v, module.net.state_dict()[k]) for k, v in start.items())  # it trained
    # the fit leaves no Opacus hooks nor per-sample gradients on the model
    assert all(not m._forward_hooks and not m._backward_hooks for m in module.net.modules())
    assert all(not hasattr(p, "grad_sample") for p in module.net.parameters())


def test_dp_model_is_opacus_groupnorm_fix():
    """`norm="group"` is what Opacus's ModuleValidator.fix makes of the BatchNorm model (GroupNorm, 32 groups),
    which Opacus validates; the same initial weights, without BatchNorm's running statistics."""
    torch.manual_seed(0)
    bn = ResNet10PLVM(10)
    torch.manual_seed(0)
    gn = ResNet10PLVM(10, norm="group")
    fixed = ModuleValidator.fix(bn)
    assert ModuleValidator.validate(bn) and not ModuleValidator.validate(gn)
    assert [(n, repr(m)) for n, m in fixed.named_modules()] == [(n, repr(m)) for n, m in gn.named_modules()]
    norms = [m for m in gn.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert len(norms) == 12 and {m.num_groups for m in norms} == {32}
    gs, bs = gn.state_dict(), bn.state_dict()
    assert set(bs) - set(gs) == {k for k in bs if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    assert all(torch.equal(gs[k], bs[k]) for k in gs)
    assert model_options(METHODS["fedplvm_dp_model"].defaults) == {"norm": "group"}
    assert model_options(METHODS["fedplvm_dp_protos"].defaults) == model_options(METHODS["fedplvm"].defaults) == {}


def test_prototype_noise_by_hand():
    """(1 - p) P + s N(0, 1), the noise drawn class by class in increasing class order from the generator."""
    protos = {3: torch.tensor([[1.0, -2.0, 0.5], [0.0, 4.0, 2.0]]), 1: torch.tensor([[10.0, 0.0, -1.0]])}
    out = perturb_prototypes(protos, 0.05, 0.1, torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)
    n1, n3 = torch.randn(1, 3, generator=g), torch.randn(2, 3, generator=g)
    torch.testing.assert_close(out[1], torch.tensor([[9.0, 0.0, -0.9]]) + 0.05 * n1, rtol=0, atol=1e-7)
    torch.testing.assert_close(out[3], torch.tensor([[0.9, -1.8, 0.45], [0.0, 3.6, 1.8]]) + 0.05 * n3,
                               rtol=0, atol=1e-7)
    assert torch.equal(perturb_prototypes(protos, 0.0, 0.1, torch.Generator())[3], 0.9 * protos[3])
    big = perturb_prototypes({0: torch.zeros(200, 512)}, 0.05, 0.1, torch.Generator().manual_seed(0))[0]
    assert float(big.std()) == pytest.approx(0.05, rel=0.01) and abs(float(big.mean())) < 1e-3


def test_fedplvm_uploads_its_clustered_prototypes_perturbed():
    """`proto_noise`: the client's FINCH prototypes, perturbed from its generator; without it, as they are."""
    module = dp_client(dp_sgd=False)
    x, y = images(12, seed=3), torch.tensor([0, 1, 2] * 4)
    clean = FedPLVMClient(module.net, {**module.hparams, "proto_noise": False})
    clean.transform = module.transform
    plain = clean.local_prototypes(x, y, torch.Generator().manual_seed(5))
    noisy = module.local_prototypes(x, y, torch.Generator().manual_seed(5))
    assert sorted(noisy) == [0, 1, 2]
    want = perturb_prototypes(plain, 0.05, 0.1, torch.Generator().manual_seed(5))
    for k in plain:
        torch.testing.assert_close(noisy[k], want[k])
        assert not torch.allclose(noisy[k], plain[k])


def test_the_fused_engine_refuses_dp_sgd():
    with pytest.raises(ConfigError, match="ENGINE=sequential"):
        RunConfig.from_preset("fedplvm-digit5", method="fedplvm_dp_both", engine="fused")
    # prototype noise: either engine
    RunConfig.from_preset("fedplvm-digit5", method="fedplvm_dp_protos", engine="fused")
    hp = METHODS["fedplvm_dp_model"].defaults
    assert resolve_engine("auto", torch.device("cuda"), hp) == "sequential"
    assert resolve_engine("auto", torch.device("cuda"), METHODS["fedplvm"].defaults) == "fused"
    with pytest.raises(ValueError, match="ENGINE=sequential"):
        fit_fused(dp_client(), lambda i: None, [(images(2), torch.tensor([0, 1]))] * 2, 1, 2, [torch.Generator()] * 2)


def test_table11_variants_and_checks():
    base = METHODS["fedplvm"].defaults
    assert base["dp_sgd"] is False and base["proto_noise"] is False
    assert (base["dp_epsilon"], base["dp_delta"], base["proto_noise_scale"], base["proto_noise_coefficient"]) == (
        4.0, 1e-5, 0.05, 0.1)
    for name, dp, noise in (("fedplvm_dp_both", True, True), ("fedplvm_dp_model", True, False),
                            ("fedplvm_dp_protos", False, True)):
        m = METHODS[name]
        assert m.variant_of == "fedplvm" and m.defaults == {**base, "dp_sgd": dp, "proto_noise": noise}
    assert base["dp_budget"] == "run"  # the "over the whole run"
    for name, value in (("dp_budget", "epoch"), ("dp_delta", 1.0), ("dp_epsilon", 0), ("dp_max_grad_norm", -1.0),
                        ("proto_noise_coefficient", 1.5),
                        ("proto_noise", "yes")):
        with pytest.raises(ValueError, match=name):
            RunConfig(method="fedplvm", hparams={name: value})


def test_a_run_recorded_before_dp_budget_existed_spent_it_over_the_run(tmp_path):
    """FedPLVM's runs recorded before `dp_budget` existed (their hparams lack it) are complete for "run", the only
    budget there was, and not for "round"."""
    import json

    from benchmark.results import is_complete, protocol

    cfg = RunConfig.from_preset("fedplvm-digit5", method="fedplvm_dp_model")
    old = protocol(cfg)
    old["hparams"] = {k: v for k, v in old["hparams"].items() if k != "dp_budget"}
    (tmp_path / "summary.json").write_text(json.dumps({"complete": True, "protocol": old}))
    assert is_complete(tmp_path, protocol(cfg))
    assert not is_complete(tmp_path, protocol(RunConfig.from_preset("fedplvm-digit5", method="fedplvm_dp_model",
                                                                     hparams={"dp_budget": "round"})))
