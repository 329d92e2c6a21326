"""The server side shared by every method: float64 partial sums of client weights, and the rule interface.

A method's `ServerRule` declares how much each client counts in the mean
(`client_weight`: its sample count, or 1 for an unweighted mean); each client group
returns `accumulate`d sums of its clients' state_dicts with those weights; the
driver adds them (`add_sums`) and divides by the total weight (`weighted_mean`);
the rule turns that mean into the next global state_dict (`aggregate`), builds
what the clients get with it (`payload`) and names the model the driver tests
(`evaluated_state`: the global state, except for FedDyn). The rules themselves live with their client modules,
one file per method under `lightning_modules/`.

A rule with `averages_weights = False` (`LocalModelsRule`: FedProto as published, Local) averages no
weights: no weights travel, the client groups send no sums, each client keeps its own model (which
may differ in architecture from the others') and the driver holds no global model.

Personalised rules (`personal_models`): each client ends a round with a model of its own, tested on
its own test samples (or its domain's) in its client group. FedPer and FedRep keep a part of the model
on the clients (`travelling`: only the rest is uploaded, averaged and sent back; the client module
puts its kept part back, `ClientModule.personalise`); FeSEM's rule takes every client's weights apart
(`per_client`: `aggregate_clients`) and gives each client a model of its own (its cluster's centre).
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod

import torch

State = dict[str, torch.Tensor]


def accumulate(acc: State | None, state: State, weight: float) -> State:
    """acc + weight * state over every key (BatchNorm buffers included), in float64 on the state's device."""
    if acc is None:
        acc = {k: torch.zeros(v.shape, dtype=torch.float64, device=v.device) for k, v in state.items()}
    for k, v in state.items():
        acc[k].add_(v.detach().to(torch.float64), alpha=float(weight))
    return acc


def add_sums(a: State | None, b: State) -> State:
    if a is None:
        return b
    return {k: a[k] + b[k] for k in a}


def weighted_mean(sums: list[State | None], weights: list[float]) -> State:
    """The weighted mean (float64) from partial sums and the total weight behind each (None: a client group
    none of whose clients trained this round, weight 0)."""
    total, acc = float(sum(weights)), None
    for s in sums:
        if s is not None:
            acc = add_sums(acc, s)
    return {k: v / total for k, v in acc.items()}


def cast_like(state64: State, like: State) -> State:
    """float64 state back to the dtypes of `like` (integer buffers rounded)."""
    out = {}
    for k, v in state64.items():
        dtype = like[k].dtype
        out[k] = (v.round() if not dtype.is_floating_point else v).to(dtype)
    return out


@dataclasses.dataclass(frozen=True)
class RoundPayload:
    """Base of the per-method round state sent with the global weights (a frozen dataclass of tensors)."""

    def to(self, device, dtype: torch.dtype | None = None) -> RoundPayload:
        """A copy with every tensor field on `device`, the floating ones in `dtype` when given."""
        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, dtype) if dtype is not None and t.is_floating_point() else t.to(device)

        moved = {f.name: move(getattr(self, f.name))
                 for f in dataclasses.fields(self) if torch.is_tensor(getattr(self, f.name))}
        return dataclasses.replace(self, **moved)

    def test_prototypes(self, client_id: int) -> torch.Tensor | None:
        """The prototypes (num_classes x d, NaN rows: classes without one) a client that keeps its own model is
        tested with by the nearest-prototype rule: the round's `global_protos` when it has them (FedProto), the
        client's own (FedPCL); None: the classifier only."""
        return getattr(self, "global_protos", None)


class ServerRule(ABC):
    """How one method's server makes the next global model and the clients' round state.

    One instance lives in the driver for the whole run, so a rule may keep state
    across rounds (FedOpt's momentum, FedDyn's drift): such a rule names the attributes
    that hold it in `state_attrs`, and `state_dict` / `load_state_dict` carry them through
    the run's checkpoints (a resumed run continues with them).
    """

    state_attrs: tuple[str, ...] = ()  # attributes changed across rounds (tensors, dicts of tensors, numbers, None)
    averages_weights = True  # False: no weights travel, every client keeps its own model (`LocalModelsRule`; no
                             # weights counted)
    # True: each client ends a round with a model of its own (its own, a head of its own, its cluster's centre): the
    # client groups test each client with it, on its own test samples or its domain's; no global model is tested
    personal_models = False
    # True: the rule takes each client's trained weights apart (`aggregate_clients`, not `aggregate`) and gives
    # each client its own model to start the next round from (FeSEM); the driver's global state is then a dict
    # client id -> state_dict
    per_client = False

    def __init__(self, hparams: dict, num_classes: int, feature_dim: int, rounds: int, param_keys: list[str]):
        self.hparams = hparams  # the method's hyperparameters (RunConfig.hparams)
        self.num_classes, self.feature_dim, self.rounds = num_classes, feature_dim, rounds
        self.param_keys = param_keys  # keys of trainable parameters (not buffers)

    def state_dict(self) -> dict:
        """What the rule keeps across rounds (its `state_attrs`), for the checkpoint."""
        return {a: getattr(self, a) for a in self.state_attrs}

    def load_state_dict(self, state: dict) -> None:
        missing = sorted(set(self.state_attrs) - set(state))
        if missing:
            raise KeyError(f"the checkpoint's server state lacks {missing}")
        for a in self.state_attrs:
            setattr(self, a, state[a])

    @staticmethod
    def client_weight(hparams: dict, num_samples: int) -> float:
        """A client's weight in the mean the rule aggregates from (the client groups accumulate with it):
        its sample count unless the rule overrides it."""
        return float(num_samples)

    @staticmethod
    def travelling(hparams: dict, state: State) -> State:
        """The part of a model's state_dict that travels between a client and the server (uploaded, averaged, sent
        back): all of it, unless the rule keeps a part on the clients (FedPer's and FedRep's head)."""
        return state

    def aggregate_clients(self, states: dict[int, State], weights: dict[int, float],
                          round_idx: int) -> dict[int, State]:
        """A `per_client` rule's aggregation: the state_dict each client starts its next round from, from the
        trained state_dicts of the clients that trained in round `round_idx` (client id -> state) and their weights
        (`client_weight`). Clients it returns no entry for keep theirs."""
        raise NotImplementedError(f"{type(self).__name__} is not a per-client rule (per_client is False).")

    def evaluated_state(self, global_state: State) -> State:
        """The model the driver tests after the round: the global state the clients get next."""
        return global_state

    def round_record(self, global_state: State) -> dict:
        """Figures of the rule's own state after a round's aggregation (`global_state`: the state it made), recorded
        with the round in metrics.jsonl: none unless the rule has some worth reading (FedDyn's norms)."""
        return {}

    @abstractmethod
    def aggregate(self, global_state: State, mean64: State, round_idx: int, share: float = 1.0) -> State:
        """The next global state_dict (dtypes of `global_state`) from the current one and the float64
        `client_weight`-weighted mean of the trained state_dicts of the clients that trained in round `round_idx`,
        `share` of all the run's clients (1: every client; below 1 under `--participation`)."""

    @abstractmethod
    def payload(self, client_protos: dict[int, dict[int, torch.Tensor]], round_idx: int) -> RoundPayload | None:
        """The round state sent with the next global weights, from the clients' local prototypes
        (client id -> class -> feature mean) of round `round_idx`.

        Round-index convention: the payload built at the end of round r is what the clients
        train with in round r + 1. Round 0 gets None ("no prototypes yet"): a client module
        whose payload is None trains without its method's term. Methods that send nothing
        (FedAvg and the other weight-only rules) always return None.
        """


class LocalModelsRule(ServerRule):
    """A rule that averages no weights: each client trains its own model from round to round (its own
    initialisation in round 0) and only the payload (prototypes, or nothing) travels."""

    averages_weights = False
    personal_models = True

    def aggregate(self, global_state, mean64, round_idx, share=1.0):
        raise TypeError(f"{type(self).__name__} averages no weights; the driver must not call aggregate.")
