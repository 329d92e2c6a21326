"""Does a domain fail for its BatchNorm statistics? A finished run's final global model (model.pt) tested on each
domain's test set as the run tested it, with the BatchNorm running statistics (a) as the server aggregated them,
(b) re-estimated on that domain's training images alone, (c) re-estimated on every domain's training images pooled.
Only the statistics change (weights as trained); (b) far above (a) says the averaged statistics suit the domain
badly (docs/gaps.md, the SYN hypothesis).

    python tools/bn_statistics.py results/runs/<run>      # a run folder with model.pt (kept locally, not committed)
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmark.data import domain_test_set, load_domain, resolve_data_root, to_tensor_images  # noqa: E402
from benchmark.figures import FigureError, _config, load_model  # noqa: E402
from benchmark.protocols import DATASET_SPECS  # noqa: E402


def reestimated(model: nn.Module, batches) -> nn.Module:
    """A copy of `model` whose BatchNorm running statistics are the plain averages over `batches` (each normalised
    input's batch mean and unbiased variance, weighted equally per batch: momentum None), weights unchanged."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for x in batches:
            model(x)
    return model.eval()


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, transform) -> float:
    with torch.no_grad():
        logits = torch.cat([model(transform(x[i:i + 500]))[0] for i in range(0, len(x), 500)])
    return 100 * float((logits.argmax(1) == y).float().mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--batch", type=int, default=32, help="images per re-estimation batch (the protocol's batch)")
    args = ap.parse_args(argv)
    try:
        model = load_model(args.run)
    except FigureError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = _config(args.run)
    spec = DATASET_SPECS[cfg["dataset"]]
    root = resolve_data_root(args.data_root or cfg.get("data_root"))
    domains = {}
    for d in cfg["domains"]:
        dom = load_domain(root, cfg["dataset"], d, per_class=spec.per_class)  # the protocol's images, as the run
        x_test, y_test = domain_test_set(dom, spec, cfg.get("eval_max"))
        x_train = to_tensor_images(dom.train_x, spec.image_size, spec.channels)
        domains[d] = ([spec.transform.eval(x_train[i:i + args.batch]) for i in range(0, len(x_train), args.batch)],
                      x_test, y_test)
    pooled = reestimated(model, [b for batches, _, _ in domains.values() for b in batches])
    final = json.loads((args.run / "summary.json").read_text())["final"]
    print(f"{args.run.name}: accuracy (%) on each domain's test set with the BatchNorm statistics")
    print(f"{'domain':8s} {'summary':>8s} {'aggregated':>11s} {'own domain':>11s} {'pooled':>8s}")
    for d, (batches, x, y) in domains.items():
        own = reestimated(model, batches)
        print(f"{d:8s} {final[d]:8.2f} {accuracy(model, x, y, spec.transform.eval):11.2f} "
              f"{accuracy(own, x, y, spec.transform.eval):11.2f} {accuracy(pooled, x, y, spec.transform.eval):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
