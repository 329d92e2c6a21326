"""tools/bn_statistics.py: the BatchNorm statistics re-estimated over some batches are the plain averages of each
batch's mean and unbiased variance of the BatchNorm's input (computed here apart, from hooks), weights untouched;
and the tool's table on a finished run."""
from __future__ import annotations

import json

import pytest
import tool_script
import torch
from tiny_net import TinyNet

from benchmark.data import domain_test_set, load_domain, to_tensor_images
from benchmark.figures import load_model
from benchmark.protocols import DATASET_SPECS
from ray_jobs.config import RunConfig
from ray_jobs.run import run

bn_statistics = tool_script.load("bn_statistics")


def test_reestimated_statistics_are_the_batches_average_mean_and_unbiased_variance():
    torch.manual_seed(0)
    model = TinyNet(10).eval()
    batches = [torch.randn(n, 3, 8, 8) * 2 + 1 for n in (5, 7, 3)]
    seen = []
    hook = model.bn.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    with torch.no_grad():
        for x in batches:
            model(x)
    hook.remove()
    mean = torch.stack([z.mean((0, 2, 3)) for z in seen]).mean(0)
    var = torch.stack([z.transpose(0, 1).flatten(1).var(1, unbiased=True) for z in seen]).mean(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    new = bn_statistics.reestimated(model, batches)
    torch.testing.assert_close(new.bn.running_mean, mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(new.bn.running_var, var, rtol=1e-5, atol=1e-6)
    assert not new.training and int(new.bn.num_batches_tracked) == 3
    for k, v in new.state_dict().items():  # the weights as they were, in the copy and in the original
        if "running" not in k and "num_batches" not in k:
            assert torch.equal(v, before[k]), k
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_the_table_of_a_finished_run_starts_from_its_summary(data_root, tmp_path, capsys, monkeypatch):
    """A 2-round FedPLVM-protocol FedAvg run on USPS: the aggregated column is the summary's final accuracy (the
    run's own test, recomputed from model.pt: float16 weights, so within one test image); the own-domain column
    is recomputed here from model.pt (in the tool's test batches of 500)."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "run"
    run(RunConfig.from_preset("fedplvm-digit5", method="fedavg", domains=["usps"], rounds=2, local_epochs=1,
                              executor="local", data_root=str(data_root), out=str(out)), quiet=True)
    capsys.readouterr()
    assert bn_statistics.main([str(out), "--data-root", str(data_root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["domain", "summary", "aggregated", "own", "domain", "pooled"]
    name, summary, aggregated, own, pooled = lines[2].split()
    assert name == "usps" and float(summary) == json.loads((out / "summary.json").read_text())["final"]["usps"]
    assert abs(float(aggregated) - float(summary)) <= 0.1  # 1,000 test images: one image is 0.1
    assert float(own) == float(pooled)  # one domain: its own statistics are the pooled ones
    # "own": the final model with its statistics re-estimated over USPS's training images of the protocol (not its
    # test images), in the protocol's batches of 32, tested on the run's test set
    dspec = DATASET_SPECS["digit5"]
    dom = load_domain(data_root, "digit5", "usps", per_class=dspec.per_class)
    x_train = to_tensor_images(dom.train_x, dspec.image_size, dspec.channels)
    model = bn_statistics.reestimated(load_model(out), [dspec.transform.eval(x_train[i:i + 32])
                                                        for i in range(0, len(x_train), 32)])
    x, y = domain_test_set(dom, dspec, None)
    with torch.no_grad():
        predicted = torch.cat([model(dspec.transform.eval(x[i:i + 500]))[0].argmax(1) for i in range(0, len(x), 500)])
    assert own == f"{100 * float((predicted == y).float().mean()):.2f}"
