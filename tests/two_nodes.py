"""A two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`, token authentication on), run in its own
process by tests/test_cluster.py (the test session's own Ray instance stays as it is): a run whose client actors
are spread over both nodes, then the same run with the second node's raylet killed after its first round.

    RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=FILE python tests/two_nodes.py DATA_ROOT OUT_DIR

(Ray reads its authentication mode when it is imported: both variables come from the caller.)

Writes OUT_DIR/two_nodes (the complete run), OUT_DIR/killed (the run that lost a node, resumed from its
checkpoint when it stopped) and OUT_DIR/nodes.json (the nodes' ids and what happened)."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from benchmark import checkpoint
from ray_jobs.config import RunConfig
from ray_jobs.run import RunError, run

# 5 clients in 2 actors (1 CPU each) and the driver (1 CPU): the head fits all three, so a run that loses the
# second node can go on (or resume) on the head alone
RUN = dict(method="feddyn", dataset="office_caltech", domains=["webcam", "dslr"], rounds=4, local_epochs=1,
           client_fraction=0.1, eval_max=30, num_actors=2, driver_cpus=1, cpus_per_actor=1, executor="ray",
           spread=True)


def main(data_root: str, out_dir: str) -> None:
    out_dir = Path(out_dir)
    if os.environ.get("RAY_AUTH_MODE") != "token" or not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        sys.exit("set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH: the cluster runs with token authentication")
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=3, resources={"head_node": 1},
                                                                include_dashboard=False))
    second = cluster.add_node(num_cpus=2, resources={"second_node": 1})
    cluster.wait_for_nodes()
    os.environ["RAY_ADDRESS"] = cluster.address  # the entry point connects to it as to any cluster
    info = {"head": cluster.head_node.node_id, "second": second.node_id}
    try:
        cfg = RunConfig(**RUN, data_root=data_root, out=str(out_dir / "two_nodes"))
        run(cfg, quiet=True)
        info["resources"] = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}

        killed = dataclasses.replace(cfg, out=str(out_dir / "killed"))
        result = {}

        def go():
            try:
                run(killed, quiet=True)
                result["outcome"] = "continued"
            except RunError as e:
                result["outcome"], result["message"] = "stopped", str(e)

        thread = threading.Thread(target=go)
        thread.start()
        t0 = time.monotonic()
        while not checkpoint.listing(Path(killed.out) / checkpoint.DIR) and time.monotonic() - t0 < 120:
            time.sleep(0.05)  # round 0 done and its checkpoint written: kill while round 1 trains
        prov = json.loads((Path(killed.out) / "config.json").read_text())["provenance"]
        info["killed_placement"] = {"driver": prov["driver"]["ray_node"],
                                    "actors": [a["ray_node"] for a in prov["actors"]]}
        info["checkpoints_at_kill"] = [p.name for p in checkpoint.listing(Path(killed.out) / checkpoint.DIR)]
        cluster.remove_node(second)  # its raylet and every process on it killed
        thread.join(timeout=300)
        info.update(result)
        if result.get("outcome") == "stopped":  # resume on what is left: the head
            run(killed, quiet=True, resume=True)
            info["resumed"] = True
    finally:
        (out_dir / "nodes.json").write_text(json.dumps(info, indent=2))
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
