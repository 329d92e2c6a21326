"""FedPer: federated learning with personalisation layers. The body (base layers) is averaged, each client keeps
its own head (personalisation layers) from round to round.

Manoj Ghuhan Arivazhagan, Vinay Aggarwal, Aaditya Kumar Singh, Sunav Choudhary. "Federated Learning with
Personalization Layers." arXiv:1912.00818, 2019. FedProto's Table 1 baseline (PROTOCOL.md section 4).

Client (`FedPerClient`): CE, as FedAvg's; it starts each round from the global body and its own head (the head is
its client state, `client_state`; in round 0, before it has one, the global initialisation's head) and is tested
with them (`personalise`). Server (`FedPerServer`): the mean of the clients' bodies (weighted as the protocol's
`aggregation` says: by sample count, or each client alike under FedProto's); the head never leaves a client
(`travelling`: the body is all that is uploaded, averaged and sent back).

`head` (hyperparameter): `classifier` (default) keeps the model's classifier on the clients, everything below it
(the `features` part) is the body. `fc` keeps every fully connected layer, fc1 and the classifier of FedProto's CNN
(the official FedProto code's `average_weights_per` averages only the keys not starting with `fc`, and the paper's
106k parameters per round are 20 x its 5,280 convolution weights: FedProto's protocol, `PRESET_HPARAMS`):
docs/deviations.md, 40.
"""
from __future__ import annotations

from lightning_modules.base import ClientModule
from lightning_modules.server import ServerRule, State, cast_like

HEADS = {"classifier": ("classifier.",), "fc": ("fc", "classifier.")}  # head -> prefixes of its state_dict keys


def is_head(key: str, head: str) -> bool:
    """Whether a state_dict key belongs to the part the clients keep (`head`: a key of HEADS)."""
    return key.startswith(HEADS[head])


class FedPerClient(ClientModule):
    def start_round(self, round_idx, payload, global_state, client_state=None):
        super().start_round(round_idx, payload, self.personalise(global_state, client_state), client_state)

    def personalise(self, state, client_state):
        return state if client_state is None else {**state, **client_state}

    def client_state(self):
        return {k: v.detach().clone() for k, v in self.net.state_dict().items() if is_head(k, self.hparams["head"])}


class FedPerServer(ServerRule):
    """The next global model: the weighted mean of the bodies, the head left as it was (the initialisation's,
    which a client uses only in round 0)."""

    personal_models = True

    @staticmethod
    def travelling(hparams: dict, state: State) -> State:
        return {k: v for k, v in state.items() if not is_head(k, hparams["head"])}

    def aggregate(self, global_state, mean64, round_idx, share=1.0):
        return {**global_state, **cast_like(mean64, global_state)}

    def payload(self, client_protos, round_idx):
        return None
