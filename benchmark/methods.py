"""The method registry: a method is one client LightningModule and one server rule, by name.

Hyperparameter defaults are PROTOCOL.md's; each is overridable on the command line
(`--hp name=value`) and recorded in config.json. The FPL ablations of the paper
are named variants of FPL (same client module and server rule, other switches).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from benchmark import server
from lightning_modules.fedavg import FedAvgClient
from lightning_modules.feddyn import FedDynClient
from lightning_modules.fedproc import FedProcClient
from lightning_modules.fedprox import FedProxClient
from lightning_modules.fedproto import FedProtoClient
from lightning_modules.fpl import FPLClient
from lightning_modules.moon import MOONClient


class HyperparameterError(ValueError):
    pass


def _positive(*names):
    def check(hp):
        for n in names:
            v = hp[n]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise HyperparameterError(f"{n} must be a number > 0 (got {v!r}).")
    return check


def _check_fedopt(hp):
    _positive("server_lr")(hp)
    m = hp["server_momentum"]
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < 1:
        raise HyperparameterError(f"server_momentum must be a number in [0, 1) (got {m!r}).")


def _check_fpl(hp):
    _positive("tau")(hp)
    for n in ("cpcl", "upcr"):
        if not isinstance(hp[n], bool):
            raise HyperparameterError(f"{n} must be true or false (got {hp[n]!r}).")
    if hp["upcr_target"] not in ("unbiased", "global"):
        raise HyperparameterError(f"upcr_target must be unbiased or global (got {hp['upcr_target']!r}).")
    if hp["cpcl_protos"] not in ("cluster", "global"):
        raise HyperparameterError(f"cpcl_protos must be cluster or global (got {hp['cpcl_protos']!r}).")


@dataclass(frozen=True)
class Method:
    name: str
    client: type
    server: type
    defaults: dict = field(default_factory=dict)
    validate: Callable[[dict], None] = lambda hp: None
    description: str = ""


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    METHODS[method.name] = method
    return method


FPL_DEFAULTS = {"tau": 0.02, "cpcl": True, "upcr": True, "upcr_target": "unbiased", "cpcl_protos": "cluster"}

register(Method("fedavg", FedAvgClient, server.ServerRule, description="weighted FedAvg"))
register(Method("fedprox", FedProxClient, server.ServerRule, {"mu": 0.01}, _positive("mu"), "FedProx, mu 0.01"))
register(Method("moon", MOONClient, server.ServerRule, {"mu": 5.0, "temperature": 0.5}, _positive("mu", "temperature"), "MOON"))
register(Method("feddyn", FedDynClient, server.FedDynServer, {"alpha": 0.01}, _positive("alpha"), "FedDyn"))
register(Method("fedopt", FedAvgClient, server.FedOptServer, {"server_lr": 0.5, "server_momentum": 0.9},
                _check_fedopt, "FedOpt (server SGD with momentum)"))
register(Method("fedproc", FedProcClient, server.FedProcServer, {"temperature": 1.0}, _positive("temperature"), "FedProc"))
register(Method("fedproto", FedProtoClient, server.MeanPrototypeServer, {"mu": 2.0}, _positive("mu"),
                "FedProto with parameter averaging"))
register(Method("fpl", FPLClient, server.FPLServer, FPL_DEFAULTS, _check_fpl, "FPL: CPCL + UPCR"))
# FPL ablations (Table 1, Table 3, Fig. 5)
register(Method("fpl_cpcl_only", FPLClient, server.FPLServer, {**FPL_DEFAULTS, "upcr": False}, _check_fpl,
                "Table 1: CPCL only"))
register(Method("fpl_upcr_only", FPLClient, server.FPLServer, {**FPL_DEFAULTS, "cpcl": False}, _check_fpl,
                "Table 1 / Table 3 U: UPCR only"))
register(Method("fpl_upcr_global", FPLClient, server.FPLServer, {**FPL_DEFAULTS, "cpcl": False, "upcr_target": "global"},
                _check_fpl, "Table 3 G: consistency to the global (mean) prototypes"))
register(Method("fpl_cpcl_global", FPLClient, server.FPLServer, {**FPL_DEFAULTS, "upcr": False, "cpcl_protos": "global"},
                _check_fpl, "Fig. 5: CPCL against global instead of cluster prototypes"))

TABLE2_METHODS = ["fedavg", "fedprox", "moon", "feddyn", "fedopt", "fedproc", "fedproto", "fpl"]
