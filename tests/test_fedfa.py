"""FedFA (Zhou and Konukoglu, ICLR 2023; tfzhou/FedFA): the FFA layer against a straightforward per-sample,
per-channel re-implementation of its equations (values and gradients), identity in eval mode, its hooks on
ResNet-10's stages, its random stream, and the server's client-sharing statistics by hand."""
from __future__ import annotations


import pytest
import torch

from benchmark.models import ResNet10PLVM
from lightning_modules.fedfa import (FedFAClient, FedFARound, FedFAServer, counter_normals, counter_uniforms,
                                     feature_augmentation, variance_fusion)
from lightning_modules.registry import METHODS
from ray_jobs.config import RunConfig

EPS = 1e-6


def make_client(**hp):
    torch.manual_seed(0)
    return FedFAClient(ResNet10PLVM(10), {**METHODS["fedfa"].defaults, **hp}).double()


def test_registry_defaults():
    m = METHODS["fedfa"]
    assert m.client is FedFAClient and m.server is FedFAServer and m.variant_of is None
    assert m.defaults == {"p": 0.5, "momentum": 0.99, "eps": 1e-6, "client_variance": "channel"}
    with pytest.raises(ValueError, match=r"^unknown client_variance value 'per-channel' \(did you mean channel\?\); "
                                         r"choose one of: channel, all\.$"):
        RunConfig(method="fedfa", hparams={"client_variance": "per-channel"})
    with pytest.raises(ValueError, match=r"p must be a number in \[0, 1\]"):
        RunConfig(method="fedfa", hparams={"p": 1.5})


def reference_layer(x, noise_mean, noise_std, var_mean, var_std, eps=EPS):
    """The layer written out sample by sample and channel by channel, with the unbiased variances of the code."""
    B, C, H, W = x.shape
    n = H * W
    mu = [[x[b, c].sum() / n for c in range(C)] for b in range(B)]
    sigma = [[(((x[b, c] - mu[b][c]) ** 2).sum() / (n - 1) + eps).sqrt() for c in range(C)] for b in range(B)]

    def batch_var(v, c):
        m = sum(v[b][c] for b in range(B)) / B
        return sum((v[b][c] - m) ** 2 for b in range(B)) / (B - 1) + eps

    def fusion(var):
        t = [1 / (1 + 1 / (var[c] + eps)) for c in range(C)]
        return [C * t[c] / sum(t) for c in range(C)]

    g_mu, g_sigma = fusion(var_mean), fusion(var_std)
    out = torch.zeros_like(x)
    for b in range(B):
        for c in range(C):
            beta = mu[b][c] + noise_mean[b, c] * ((g_mu[c] + 1) * batch_var(mu, c)).sqrt()
            gamma = sigma[b][c] + noise_std[b, c] * ((g_sigma[c] + 1) * batch_var(sigma, c)).sqrt()
            out[b, c] = (x[b, c] - mu[b][c]) / sigma[b][c] * gamma + beta
    return out


def test_layer_equals_a_straightforward_implementation_values_and_gradients():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 3, 5, 5, generator=g, dtype=torch.float64) * 2 + 1
    nm, ns = (torch.randn(4, 3, generator=g, dtype=torch.float64) for _ in range(2))
    vm, vs = (torch.rand(3, generator=g, dtype=torch.float64) for _ in range(2))
    w = torch.randn(4, 3, 5, 5, generator=g, dtype=torch.float64)  # a fixed weighting of the outputs
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours, mean, std = feature_augmentation(xa, nm, ns, vm, vs, EPS)
    ref = reference_layer(xb, nm, ns, vm, vs)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mean, x.mean(dim=(2, 3)))
    torch.testing.assert_close(std, (x.var(dim=(2, 3)) + EPS).sqrt())
    (ours * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-10, atol=1e-12)
    # without noise the layer only re-normalises: mu and sigma come back
    same, _, _ = feature_augmentation(x, torch.zeros(4, 3, dtype=torch.float64),
                                      torch.zeros(4, 3, dtype=torch.float64), vm, vs)
    torch.testing.assert_close(same, x)


def test_variance_fusion_by_hand():
    # t = 1 / (1 + 1 / V): V = 1 -> 1/2, V = 3 -> 3/4; gamma = C t / sum t = 2 * (0.5, 0.75) / 1.25
    torch.testing.assert_close(variance_fusion(torch.tensor([1.0, 3.0], dtype=torch.float64), 0.0),
                               torch.tensor([0.8, 1.2], dtype=torch.float64))
    # the code's form (one variance for every channel) gives gamma = 1 whatever the variance
    torch.testing.assert_close(variance_fusion(torch.full((5,), 0.3), EPS), torch.ones(5))


def test_identity_in_eval_mode_and_the_layers_sit_after_each_stage():
    client = make_client(p=1.0)
    plain = ResNet10PLVM(10).double()
    plain.load_state_dict(client.net.state_dict())
    assert [layer.channels for layer in client.ffa] == [64, 64, 128, 256, 512]  # stem, then the 4 stages
    client.start_round(0, None, client.net.state_dict(), client.initial_client_state(0, {"id": 1}))
    x = torch.randn(6, 3, 64, 64, dtype=torch.float64)
    client.eval(), plain.eval()
    torch.testing.assert_close(client.net(x)[0], plain(x)[0], rtol=0, atol=0)
    assert client.ffa_step == 0 and all(float(layer.running_mean.abs().sum()) == 0 for layer in client.ffa)
    # training mode: with p = 0 never, with p = 1 always augmented (every layer's running statistics move)
    client.train(), plain.train()
    off = make_client(p=0.0)
    off.start_round(0, None, client.net.state_dict(), off.initial_client_state(0, {"id": 1}))
    off.train()
    torch.testing.assert_close(off.net(x)[0], plain(x)[0])
    assert all(torch.equal(layer.running_mean, torch.zeros(layer.channels, dtype=torch.float64))  # never fired:
               and torch.equal(layer.running_std, torch.ones(layer.channels, dtype=torch.float64)) for layer in off.ffa)
    assert float((client.net(x)[0] - plain(x)[0]).detach().abs().max()) > 1e-3
    assert client.ffa_step == 1 and all(float(layer.running_mean.abs().sum()) > 0 for layer in client.ffa)


def test_each_layer_restyles_its_stage_output_with_the_clients_draws():
    """Hook 0 re-styles the stem's output with the normals of (seed, client, round, step 1, layer 0), hook k the
    output of stage k with those of layer k; the features are the mean of the last one's; each layer's running
    statistics move by hand."""
    client = make_client(p=1.0)
    client.start_round(2, None, client.net.state_dict(), client.initial_client_state(5, {"id": 3}))
    client.train()
    x = torch.randn(4, 3, 64, 64, dtype=torch.float64)
    seen = {}
    client.net.layers[0].register_forward_pre_hook(lambda m, args: seen.setdefault("in", args[0].detach().clone()))
    client.net.layers[1].register_forward_pre_hook(lambda m, args: seen.setdefault("in1", args[0].detach().clone()))
    net = client.net
    stem = net.pool(torch.relu(net.bn1(net.conv1(x)))).detach()
    _, z = client.net(x)
    key = torch.tensor([5, 3, 2, 1, 0, 1])  # seed, client, round, step, layer, noise stream
    noise = counter_normals(key, 2 * 4 * 64).double()
    want, _, _ = feature_augmentation(stem, noise[:256].view(4, 64), noise[256:].view(4, 64),
                                      torch.ones(64, dtype=torch.float64), torch.ones(64, dtype=torch.float64))
    # the BatchNorm of the stem ran once more above (running statistics), not its output in training mode
    torch.testing.assert_close(seen["in"], want)
    # its running statistics moved from the round's start (0, 1) by momentum 0.99 towards the batch's mean of the
    # per-sample channel means and stds (unbiased variance over the pixels, + eps 1e-6), by hand
    flat = stem.flatten(2)  # B x C x HW
    mu = flat.sum(dim=2) / flat.shape[2]
    sigma = (((flat - mu[..., None]) ** 2).sum(dim=2) / (flat.shape[2] - 1) + 1e-6).sqrt()
    torch.testing.assert_close(client.ffa[0].running_mean, 0.01 * mu.mean(dim=0))
    torch.testing.assert_close(client.ffa[0].running_std, 0.99 + 0.01 * sigma.mean(dim=0))
    # layers 1 to 4 re-style the output of stages 1 to 4 (post-hooks whose results the forward pass goes on with),
    # each with its own draws: chained by hand, stage 1's result is stage 2's input and stage 4's gives the features
    h = seen["in"]
    for k, block in enumerate(net.layers, start=1):
        out = block.forward(h).detach()  # (`forward` itself: without the hooks)
        b, c = out.shape[:2]
        noise = counter_normals(torch.tensor([5, 3, 2, 1, k, 1]), 2 * b * c).double()
        h, mu, sigma = feature_augmentation(out, noise[:b * c].view(b, c), noise[b * c:].view(b, c),
                                            torch.ones(c, dtype=torch.float64), torch.ones(c, dtype=torch.float64))
        if k == 1:
            torch.testing.assert_close(seen["in1"], h)
        torch.testing.assert_close(client.ffa[k].running_mean, 0.01 * mu.mean(dim=0))
        torch.testing.assert_close(client.ffa[k].running_std, 0.99 + 0.01 * sigma.mean(dim=0))
    torch.testing.assert_close(z, h.mean(dim=(2, 3)))


def test_counter_stream():
    a = counter_uniforms(torch.tensor([0, 1, 2, 3, 4]), 1000)
    assert torch.equal(a, counter_uniforms(torch.tensor([0, 1, 2, 3, 4]), 1000))  # a pure function of its key
    b = counter_uniforms(torch.tensor([0, 2, 2, 3, 4]), 1000)  # another client
    assert 0 < float(a.min()) and float(a.max()) < 1 and float((a - b).abs().mean()) > 0.2
    z = counter_normals(torch.tensor([9, 9, 9, 9, 9]), 200_000)
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    assert abs(float((z[1:] * z[:-1]).mean())) < 0.01  # neighbouring draws uncorrelated
    assert abs(float((z > 1.96).double().mean()) - 0.025) < 0.002


def stats(mean: list[float], std: list[float]) -> torch.Tensor:
    return torch.tensor([mean, std])


def test_server_statistics_by_hand():
    """Three clients, one layer of two channels: channel means 1, 3, 2 (mean 2, unbiased variance 1) and 2, 2, 5
    (mean 3, variance 3); stds 1, 1, 1 (variance 0) and 1, 3, 2 (variance 1)."""
    protos = {0: {0: stats([1, 2], [1, 1])}, 1: {0: stats([3, 2], [1, 3])}, 2: {0: stats([2, 5], [1, 2])}}
    rule = FedFAServer(METHODS["fedfa"].defaults, 10, 512, 10, [])
    p = rule.payload(protos, 0)
    torch.testing.assert_close(p.running, torch.tensor([[2.0, 3.0], [1.0, 2.0]]))
    torch.testing.assert_close(p.shared_var, torch.tensor([[1.0, 3.0], [0.0, 1.0]]))
    # the code's form: one variance over both channels and all clients, broadcast: means 1,2,3,2,2,5 (mean 2.5,
    # squared deviations summing to 9.5, / 5 = 1.9); stds 1,1,1,3,1,2 (mean 1.5, 3.5 / 5 = 0.7)
    code = FedFAServer({**METHODS["fedfa"].defaults, "client_variance": "all"}, 10, 512, 10, []).payload(protos, 0)
    torch.testing.assert_close(code.shared_var, torch.tensor([[1.9, 1.9], [0.7, 0.7]]))
    torch.testing.assert_close(code.running, p.running)


def test_a_round_starts_from_the_servers_statistics():
    client = make_client()
    channels = sum(layer.channels for layer in client.ffa)
    running = torch.stack([torch.arange(channels), torch.arange(channels) + 0.5]).double()
    shared = running + 100
    client.start_round(1, FedFARound(running=running, shared_var=shared), client.net.state_dict(),
                       client.initial_client_state(0, {"id": 2}))
    last = client.ffa[-1]  # the last 512 channels
    torch.testing.assert_close(last.running_mean, running[0, -512:])
    torch.testing.assert_close(last.shared_var_std, shared[1, -512:])
    assert client.client_state().tolist() == [0, 2]
    up = client.local_prototypes()
    assert sorted(up) == [0, 1, 2, 3, 4] and up[4].shape == (2, 512)
    torch.testing.assert_close(up[1], running[:, 64:128])


def test_one_client_has_no_spread():
    rule = FedFAServer(METHODS["fedfa"].defaults, 10, 512, 10, [])
    p = rule.payload({4: {0: stats([1, 2], [3, 4])}}, 0)
    assert torch.equal(p.shared_var, torch.zeros(2, 2))  # no NaN from one client's unbiased variance
    assert torch.equal(p.running, stats([1, 2], [3, 4]))  # the mean over one client is its statistics
