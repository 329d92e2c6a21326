"""Two Ray nodes on this machine (`ray.cluster_utils.Cluster`, token authentication on, each node with its own CPUs
and a custom resource), in a process of their own (tests/two_nodes.py) beside this session's one-node instance:
client actors spread over both nodes give the metrics of the same run in one process, and a run that loses a
node's raylet mid-run goes on on the other node, or stops saying so and resumes from its checkpoint, with the
same metrics again."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark.results import read_jsonl
from ray_jobs.config import RunConfig
from ray_jobs.run import run

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from two_nodes import RUN  # noqa: E402


def recorded(out: Path) -> list:
    """metrics.jsonl without its timings."""
    return [{k: v for k, v in r.items() if k != "time_s"} for r in read_jsonl(out / "metrics.jsonl")]


@pytest.fixture(scope="module")
def cluster_runs(slow_setup, isolated_env, data_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("two_nodes")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "PYTHONPATH": str(PROJECT)}  # the session's token file
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, str(PROJECT / "tests" / "two_nodes.py"), str(data_root), str(out)],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "nodes.json").read_text())


@pytest.fixture(scope="module")
def one_process(slow_setup, data_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("one_process")
    run(RunConfig(**{**RUN, "executor": "local", "spread": False}, data_root=str(data_root), out=str(out)), quiet=True)
    return recorded(out)


def test_actors_on_two_nodes_give_the_metrics_of_one_process(cluster_runs, one_process):
    out, nodes = cluster_runs
    head, second = nodes["head"], nodes["second"]
    assert nodes["resources"][head]["head_node"] == 1 and nodes["resources"][head]["CPU"] == 3
    assert nodes["resources"][second]["second_node"] == 1 and nodes["resources"][second]["CPU"] == 2
    config = json.loads((out / "two_nodes" / "config.json").read_text())
    assert config["spread"] is True
    prov = config["provenance"]
    assert {a["ray_node"] for a in prov["actors"]} == {head, second}  # SPREAD: one client actor on each node
    assert prov["driver"]["ray_node"] in (head, second)
    for a in prov["actors"]:  # what each actor holds, as Ray assigned it (no GPU here)
        assert a["ray_resources"] == {"CPU": RUN["cpus_per_actor"]} and a["ray_gpu_ids"] == []
    assert recorded(out / "two_nodes") == one_process
    assert json.loads((out / "two_nodes" / "summary.json").read_text())["complete"]


def test_a_node_killed_mid_run_continues_or_resumes_to_the_same_metrics(cluster_runs, one_process):
    out, nodes = cluster_runs
    assert nodes["checkpoints_at_kill"] == ["round_0000.pt"]  # killed after round 0, before the run's end
    placement = nodes["killed_placement"]
    assert nodes["second"] in placement["actors"]  # the node killed held a client actor
    if placement["driver"] == nodes["second"]:  # the driver went with the node: the run stopped, then resumed
        assert nodes["outcome"] == "stopped" and nodes["resumed"]
        assert "the run's driver actor was lost" in nodes["message"] and "--resume" in nodes["message"]
    else:  # Ray restarted the lost client actor on the head; the run went on
        assert nodes["outcome"] == "continued"
    assert recorded(out / "killed") == one_process
    assert json.loads((out / "killed" / "summary.json").read_text())["complete"]
