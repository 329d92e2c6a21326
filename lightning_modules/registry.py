"""The method registry: a name -> one client LightningModule and one server rule (both in
`lightning_modules/<method>.py`), the defaults of its hyperparameters, their check, a description.

Hyperparameter defaults are PROTOCOL.md's; each is overridable on the command line
(`--hp name=value`), reaches the client module and the server rule as `hparams`, and is
recorded in config.json. A paper's ablations are named variants of its method: the same client
module and server rule, other switches; `register` marks them (`variant_of`, the method
registered first with that pair), and tables of every method, `make table-all`, leave them out. "dev. N" is
deviation N of docs/deviations.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from benchmark.protocols import unknown_name
from lightning_modules.fedapc import FedAPCClient, FedAPCServer
from lightning_modules.fedavg import FedAvgClient, FedAvgServer
from lightning_modules.feddyn import FedDynClient, FedDynServer
from lightning_modules.fedfa import FedFAClient, FedFAServer
from lightning_modules.fedopt import FedOptServer
from lightning_modules.fedpcl import FedPCLClient, FedPCLServer
from lightning_modules.fedper import HEADS, FedPerClient, FedPerServer
from lightning_modules.fedplvm import FedPLVMClient, FedPLVMServer
from lightning_modules.fedproc import FedProcClient, FedProcServer
from lightning_modules.fedproto import FedProtoClient, FedProtoServer
from lightning_modules.fedproto_orig import FedProtoOrigServer, fedproto_mh_model
from lightning_modules.fedprox import FedProxClient
from lightning_modules.fedrep import FedRepClient
from lightning_modules.fesem import FeSEMServer
from lightning_modules.fpl import FPLClient, FPLServer
from lightning_modules.local import LocalServer
from lightning_modules.moon import MOONClient
from lightning_modules.prototypes import CLUSTERINGS


class HyperparameterError(ValueError):
    pass


def _number(names, within, words: str, null_words: str | None):
    """A check that each named hyperparameter is a number `within(v)` says is allowed (`words`), or, where
    `null_words` is given, null (what null means)."""
    def check(hp):
        for n in names:
            v = hp[n]
            if null_words is not None and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not within(v):
                raise HyperparameterError(f"{n} must be a number {words}"
                                          f"{'' if null_words is None else f', or null {null_words}'} (got {v!r}).")
    return check


def _positive(*names, optional=False):
    """A check that each named hyperparameter is a number above 0 (or, `optional`, null: off)."""
    return _number(names, lambda v: v > 0, "> 0", "for none" if optional else None)


def _fraction(*names, optional=False):
    """A check that each named hyperparameter is a number in [0, 1) (or, `optional`, null: the protocol's)."""
    return _number(names, lambda v: 0 <= v < 1, "in [0, 1)", "for the protocol" if optional else None)


def _positive_int(*names):
    def check(hp):
        for n in names:
            v = hp[n]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise HyperparameterError(f"{n} must be an integer >= 1 (got {v!r}).")
    return check


def _choices(**allowed):
    """A check that each named hyperparameter is one of its allowed values."""
    def check(hp):
        for n, values in allowed.items():
            if hp[n] not in values:
                raise HyperparameterError(unknown_name(f"{n} value", hp[n], values))
    return check


def _boolean(*names):
    def check(hp):
        for n in names:
            if not isinstance(hp[n], bool):
                raise HyperparameterError(f"{n} must be true or false (got {hp[n]!r}).")
    return check


def _all(*checks):
    def check(hp):
        for c in checks:
            c(hp)
    return check


def _check_fedopt(hp):
    _positive("server_lr")(hp)
    _choices(weighting=("uniform", "samples"), step_from=("mean", "global"))(hp)
    _fraction("server_momentum")(hp)


def _check_fpl(hp):
    _positive("tau", "lambda")(hp)
    _boolean("cpcl", "upcr")(hp)
    _choices(upcr_target=("unbiased", "global"), cpcl_protos=("cluster", "global"), upcr_reduction=("mean", "sum"))(hp)


@dataclass(frozen=True)
class Method:
    name: str
    client: type  # a ClientModule subclass
    server: type  # a ServerRule subclass
    defaults: dict = field(default_factory=dict)  # the method's hyperparameters (hparams) and their defaults
    validate: Callable[[dict], None] = lambda hparams: None  # raises HyperparameterError naming a bad value
    description: str = ""
    # a client's model options by client id (build_model's kwargs), for methods whose clients differ
    # in architecture (FedProto-mh); None: every client has the dataset's model as it is
    client_model: Callable[[int], dict] | None = None
    variant_of: str | None = None  # an ablation: the method it varies (None: a method of its own; `register` sets it)


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add `method` to the registry. One with the same client module and server rule as a method registered
    before it is a variant of that method (an ablation: other switches), unless it names what it varies."""
    if method.variant_of is None:
        same = [m.name for m in METHODS.values() if (m.client, m.server) == (method.client, method.server)]
        if same:
            method = dataclasses.replace(method, variant_of=same[0])
    METHODS[method.name] = method
    return method


register(Method(
    name="fedavg", client=FedAvgClient, server=FedAvgServer,
    description="weighted FedAvg",
))
register(Method(
    name="fedprox", client=FedProxClient, server=FedAvgServer,
    defaults=dict(
        mu=0.01,  # weight of (mu/2)||w - w_global||^2 (dev. 8: as stated, not the official code's 5e-5)
    ),
    validate=_positive("mu"), description="FedProx, mu 0.01",
))
register(Method(
    name="moon", client=MOONClient, server=FedAvgServer,
    defaults=dict(
        mu=5.0,  # weight of the model-contrastive term
        temperature=0.5,  # of the cosine similarities
        frozen_mode="train",  # the frozen global/previous models in training mode, as RethinkFL's code, or "eval"
                              # (dev. 12)
        initial_previous="own",  # round 0's previous model: the client's own initialisation, or the "global" one
                                 # (dev. 12)
        double_forward=True,  # BatchNorm running statistics move twice per step, as the code's two passes (dev. 18)
    ),
    validate=_all(_positive("mu", "temperature"),
                  _choices(frozen_mode=("train", "eval"), initial_previous=("own", "global")),
                  _boolean("double_forward")),
    description="MOON",
))
register(Method(
    name="feddyn", client=FedDynClient, server=FedDynServer,
    defaults=dict(
        alpha=0.01,  # dynamic regulariser weight, scaled per client by its data share as Acar et al.'s code (dev. 9)
        max_grad_norm=None,  # each local step's gradients clipped to this L2 norm (Acar et al.: 10); None: not (dev. 9)
        momentum=None,  # the local SGD's momentum (Acar et al.: 0); None: the protocol's (FPL's 0.9) (dev. 9)
    ),
    validate=_all(_positive("alpha"), _positive("max_grad_norm", optional=True), _fraction("momentum", optional=True)),
    description="FedDyn",
))
register(Method(
    name="fedopt", client=FedAvgClient, server=FedOptServer,
    defaults=dict(
        server_lr=0.5,  # server SGD learning rate on the pseudo-gradient (dev. 10)
        server_momentum=0.9,  # server SGD momentum
        weighting="uniform",  # the client mean: unweighted as RethinkFL's mean(dim=0), or by "samples" (dev. 10)
        # where the server step starts: the clients' "mean" (RethinkFL's code, FPL's protocol) or the "global" model
        # (Reddi et al.; the other papers' presets, benchmark.protocols.PRESET_HPARAMS) (dev. 10)
        step_from="mean",
    ),
    validate=_check_fedopt, description="FedOpt (server SGD with momentum)",
))
register(Method(
    name="fedproc", client=FedProcClient, server=FedProcServer,
    defaults=dict(
        temperature=1.0,  # of the prototype InfoNCE (dev. 11: round 0 trains CE alone)
    ),
    validate=_positive("temperature"), description="FedProc",
))
register(Method(
    name="fedproto", client=FedProtoClient, server=FedProtoServer,
    defaults=dict(
        mu=2.0,  # weight of the MSE to the global prototype of the sample's class
        double_forward=True,  # BatchNorm running statistics move twice per step, as the code's two passes (dev. 18)
    ),
    validate=_all(_positive("mu"), _boolean("double_forward")), description="FedProto with parameter averaging",
))

FEDPROTO_ORIG_DEFAULTS = dict(
    mu=1.0,  # the paper's lambda (the code's --ld): weight of the MSE to the global prototype of y (MNIST: 1)
    double_forward=False,  # the official code runs the model once per step (and the MNIST CNN has no BatchNorm)
)
register(Method(
    name="fedproto_orig", client=FedProtoClient, server=FedProtoOrigServer, defaults=FEDPROTO_ORIG_DEFAULTS,
    validate=_all(_positive("mu"), _boolean("double_forward")),
    description="FedProto as published (AAAI 2022): prototypes only, each client keeps its own model",
))
register(Method(
    name="fedproto_mh", client=FedProtoClient, server=FedProtoOrigServer, defaults=FEDPROTO_ORIG_DEFAULTS,
    validate=_all(_positive("mu"), _boolean("double_forward")), client_model=fedproto_mh_model,
    description="FedProto-mh: fedproto_orig with conv2 widths 18 / 20 / 22 for clients 0-6 / 7-13 / 14-19",
))
register(Method(
    name="local", client=FedAvgClient, server=LocalServer,
    description="Local: each client trains its own model alone, no communication",
))
# FedProto's Table 1 baselines that personalise: FedPer, FedRep (a head per client), FeSEM (a centre per cluster)
register(Method(
    name="fedper", client=FedPerClient, server=FedPerServer,
    defaults=dict(
        # kept on each client: the classifier, or every fully connected layer "fc" (FedProto's protocol: dev. 40)
        head="classifier",
    ),
    validate=_choices(head=tuple(HEADS)), description="FedPer: the body averaged, a head per client",
))
register(Method(
    name="fedrep", client=FedRepClient, server=FedPerServer,
    defaults=dict(
        head="classifier",  # kept on each client, as FedPer's
        rep_epochs=0.5,  # the body trains the last rep_epochs epochs of a round, the head before (dev. 41: not 1)
    ),
    validate=_all(_choices(head=tuple(HEADS)), _positive("rep_epochs")),
    description="FedRep: the head trained first with the body frozen, then the body; the body averaged",
))
register(Method(
    name="fesem", client=FedAvgClient, server=FeSEMServer,
    defaults=dict(
        clusters=4,  # K centre models (the reference's config; FedProto's protocol: 2, its code's: dev. 42)
        distance="weights",  # L2 over every parameter (the paper), or the "classifier" weight only (the reference)
    ),
    validate=_all(_positive_int("clusters"), _choices(distance=("weights", "classifier"))),
    description="FeSEM: K centres, clients assigned by the L2 distance of their weights",
))

FPL_DEFAULTS = dict(
    tau=0.02,  # CPCL temperature (dev. 5: tau = 0.01 overflows and stops the run, as in Fig. 4)
    cpcl=True,  # Table 1: the cluster prototype contrastive term on/off
    upcr=True,  # Table 1: the unbiased prototype consistency term on/off
    upcr_target="unbiased",  # Table 3: UPCR towards the unbiased (U) or the plain mean "global" (G) prototypes
                             # (dev. 13)
    cpcl_protos="cluster",  # Fig. 5: CPCL against the FINCH cluster (dev. 6) or the "global" mean prototypes
    upcr_reduction="mean",  # UPCR over the feature dimensions: the code's "mean" or the paper's Eq. 10 "sum" (dev. 17)
    # weight of CPCL + UPCR against CE: 1, FPL's loss CE + CPCL + UPCR; FedPLVM's Figure 4 sweeps it (dev. 38)
    **{"lambda": 1.0},
)


def fpl_variant(name: str, description: str, **switches) -> Method:
    """FPL with some of its switches changed: the paper's ablations."""
    return register(Method(name=name, client=FPLClient, server=FPLServer, defaults={**FPL_DEFAULTS, **switches},
                           validate=_check_fpl, description=description))


fpl_variant("fpl", "FPL: CPCL + UPCR")
fpl_variant("fpl_cpcl_only", "Table 1: CPCL only", upcr=False)
fpl_variant("fpl_upcr_only", "Table 1 / Table 3 U: UPCR only", cpcl=False)
fpl_variant("fpl_upcr_global", "Table 3 G: consistency to the global (mean) prototypes", cpcl=False,
            upcr_target="global")
fpl_variant("fpl_cpcl_global", "Fig. 5: CPCL against global instead of cluster prototypes", upcr=False,
            cpcl_protos="global")



def _check_fedplvm(hp):
    _positive("alpha", "tau", "lambda")(hp)
    if hp["alpha"] > 1:
        raise HyperparameterError(f"alpha must be a number in (0, 1] (got {hp['alpha']!r}).")
    _boolean("contrast", "correction")(hp)
    _choices(local_protos=("cluster", "mean"), global_protos=("cluster", "mean", "all"),
             correction_form=("code", "paper"), clustering=CLUSTERINGS, dp_budget=("run", "round"))(hp)
    k = hp["kmeans_k"]
    if k != "adaptive" and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise HyperparameterError(f"kmeans_k must be adaptive or an integer >= 1 (got {k!r}).")
    _boolean("dp_sgd", "proto_noise")(hp)
    _positive("dp_epsilon", "dp_delta", "dp_max_grad_norm", "proto_noise_scale")(hp)
    if hp["dp_delta"] >= 1:
        raise HyperparameterError(f"dp_delta must be a number in (0, 1) (got {hp['dp_delta']!r}).")
    c = hp["proto_noise_coefficient"]
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c <= 1:
        raise HyperparameterError(f"proto_noise_coefficient must be a number in [0, 1] (got {c!r}).")


FEDPLVM_DEFAULTS = dict(
    alpha=0.25,  # the sparsity power of the cosine, cos^alpha (cosine clamped at 1e-6 first: dev. 23)
    tau=0.07,  # temperature of the alpha-sparsity contrast
    # weight of contrast + correction (100 on Digit-5 and Office-10, 1 on DomainNet); "lambda" on the command line
    **{"lambda": 100.0},
    contrast=True,  # Table 5: the alpha-sparsity contrastive term on/off
    correction=True,  # Table 5: the correction term on/off
    correction_form="code",  # the code's 2 * mean (1 - cos(z, g_y))^2, or the paper's Eq. 8 (dev. 24)
    local_protos="cluster",  # Table 3: a client's prototypes: FINCH clusters of its features, or the class "mean"
    global_protos="cluster",  # Table 3/4: FINCH over the local ones, their "mean", or "all" sent (no global clustering)
    clustering="finch",  # Table 9: both levels' clustering, FINCH or scikit-learn's "kmeans" (random_state 0)
    kmeans_k="adaptive",  # K-Means' K: "adaptive" (as many clusters as FINCH's partition) or a number
    # Table 11 (lightning_modules/privacy.py, dev. 36-37): local training by DP-SGD (Opacus; the model then has
    # GroupNorm for BatchNorm), the noise multiplier from Opacus's accountant for (dp_epsilon, dp_delta) over the run
    dp_sgd=False,
    dp_epsilon=4.0,
    dp_delta=1e-5,
    dp_budget="run",  # (dp_epsilon, dp_delta) spent over the client's whole run, or "round": each round's fit alone
    dp_max_grad_norm=1.0,  # DP-SGD's per-sample clipping bound C (the paper states none: Opacus's usual 1.0)
    # Table 11: each uploaded local prototype P as (1 - coefficient) P + N(0, scale^2) (FedPCL's add_noise_proto)
    proto_noise=False,
    proto_noise_scale=0.05,  # the paper's scale s
    proto_noise_coefficient=0.1,  # the paper's perturbation coefficient p
)


def fedplvm_variant(name: str, description: str, **switches) -> Method:
    """FedPLVM with some of its switches changed: the paper's ablations (Tables 3-5)."""
    return register(Method(name=name, client=FedPLVMClient, server=FedPLVMServer,
                           defaults={**FEDPLVM_DEFAULTS, **switches}, validate=_check_fedplvm, description=description))


fedplvm_variant("fedplvm", "FedPLVM: dual-level clustering, alpha-sparsity contrast + correction")
fedplvm_variant("fedplvm_avg_avg", "Table 3 avg/avg: class means locally, their mean globally",
                local_protos="mean", global_protos="mean")
fedplvm_variant("fedplvm_avg_cluster", "Table 3 avg/cluster: class means locally, FINCH globally", local_protos="mean")
fedplvm_variant("fedplvm_no_global_clustering", "Table 4 w/o: every local clustered prototype sent",
                global_protos="all")
fedplvm_variant("fedplvm_no_loss", "Table 5: neither contrast nor correction (CE only)", contrast=False,
                correction=False)
fedplvm_variant("fedplvm_contrast_only", "Table 5: the alpha-sparsity contrast only", correction=False)
fedplvm_variant("fedplvm_correction_only", "Table 5: the correction term only", contrast=False)
fedplvm_variant("fedplvm_cluster_avg", "Table 12: FINCH clusters locally, their mean globally (one per class)",
                global_protos="mean")
fedplvm_variant("fedplvm_kmeans_adaptive", "Table 9: K-Means at both levels, K = FINCH's cluster count",
                clustering="kmeans", kmeans_k="adaptive")
fedplvm_variant("fedplvm_kmeans2", "Table 9: K-Means at both levels, K = 2", clustering="kmeans", kmeans_k=2)
fedplvm_variant("fedplvm_kmeans5", "Table 9: K-Means at both levels, K = 5", clustering="kmeans", kmeans_k=5)
fedplvm_variant("fedplvm_dp_both", "Table 11 w/ w/: DP-SGD local training and noisy local prototypes",
                dp_sgd=True, proto_noise=True)
fedplvm_variant("fedplvm_dp_model", "Table 11 w/ w/o: DP-SGD local training (epsilon 4, delta 1e-5)", dp_sgd=True)
fedplvm_variant("fedplvm_dp_protos", "Table 11 w/o w/: Gaussian noise on the local prototypes (s 0.05, p 0.1)",
                proto_noise=True)


def _check_fedfa(hp):
    _positive("eps")(hp)
    for n in ("p", "momentum"):
        v = hp[n]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise HyperparameterError(f"{n} must be a number in [0, 1] (got {v!r}).")
    _choices(client_variance=("channel", "all"))(hp)


register(Method(
    name="fedfa", client=FedFAClient, server=FedFAServer,
    defaults=dict(
        p=0.5,  # probability that an FFA layer re-styles a training batch (one draw per layer and step, as the code)
        momentum=0.99,  # of the running channel mean and std each client keeps (the code's momentum1)
        eps=1e-6,  # added to every variance, as the code
        # the server's variance of the clients' running statistics: per "channel" (the paper's equations) or over
        # "all" channels and clients at once (the code's torch.var, then broadcast: gamma = 1) (dev. 30)
        client_variance="channel",
    ),
    validate=_check_fedfa, description="FedFA: feature-statistics augmentation after each convolutional stage",
))

register(Method(
    name="fedpcl", client=FedPCLClient, server=FedPCLServer,
    defaults=dict(
        tau=0.07,  # temperature of the prototype contrastive loss (the code's ConLoss, base temperature 0.07)
        proj_dim=256,  # output of the projection head Linear(feature, proj_dim) -> ReLU -> L2 normalisation
        global_term=False,  # also contrast against the global prototypes (the paper's term; the code has none)
                            # (dev. 31)
    ),
    validate=_all(_positive("tau"), _positive_int("proj_dim"), _boolean("global_term")),
    description="FedPCL: prototype contrast against every client's prototypes, prototypes only, "
                "no pre-trained backbone",
))


def _check_fedapc(hp):
    _positive("tau")(hp)
    _boolean("augment")(hp)
    _positive_int("n_views")(hp)
    _choices(prototypes=("after", "last_epoch"))(hp)
    if hp["prototypes"] == "last_epoch" and (not hp["augment"] or hp["n_views"] != FEDAPC_DEFAULTS["n_views"]):
        raise HyperparameterError("augment and n_views shape the pass after training (prototypes=after); "
                                  "prototypes=last_epoch takes the training batches as the protocol makes them: "
                                  "leave augment and n_views at their defaults (fedapc, not fedapc_noaug).")


FEDAPC_DEFAULTS = dict(  # the paper states none of these; docs/fedapc.md gives the reasons
    n_views=4,  # augmented views averaged per image for its prototype feature (Eq. 2)
    tau=0.02,  # temperature of L_APC, CPCL's (FPL's code) since L_APC is CPCL's form
    augment=True,  # Table II: False = prototypes from the un-augmented images (one view)
    prototypes="after",  # a pass after local training (the text); "last_epoch": the last epoch's batches (Alg. 1)
)
register(Method(
    name="fedapc", client=FedAPCClient, server=FedAPCServer, defaults=FEDAPC_DEFAULTS, validate=_check_fedapc,
    description="FedAPC: augmented prototypes, CPCL-form contrast to their global means",
))
register(Method(
    name="fedapc_noaug", client=FedAPCClient, server=FedAPCServer, defaults={**FEDAPC_DEFAULTS, "augment": False},
    validate=_check_fedapc, description="FedAPC Table II: prototypes without augmentation",
))

TABLE2_METHODS = ["fedavg", "fedprox", "moon", "feddyn", "fedopt", "fedproc", "fedproto", "fpl"]
