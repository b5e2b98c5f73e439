"""The simulator's loss model on spot: checkpoints that take longer for larger jobs, notices
shorter than a checkpoint, and each of Shoal's loss features switched on and off."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from scheduler.model import Node
from scheduler.simulate import cli, engine, inputs

#: A checkpoint takes 10 s plus 10 GB per GPU at 2.5 GB/s: 74 s for a 16-GPU job.
SIZED = engine.Settings(
    checkpoint_seconds=10,
    checkpoint_gb_per_gpu=10,
    storage_gb_per_second=2.5,
    restart_seconds=30,
    checkpoint_interval=1000,
)


def _nodes(tmp_path: Path, **group: object) -> list[Node]:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"node_groups": [group]}))
    return inputs.build_nodes(inputs.load_cluster(path))


def _jobs(tmp_path: Path, rows: list[str]) -> list[inputs.JobSpec]:
    path = tmp_path / "jobs.csv"
    path.write_text("submit,duration,gpus,min_pods,max_pods,priority\n" + "\n".join(rows) + "\n")
    return inputs.load_jobs(path, node_gpus=8)


def _spot(tmp_path: Path, text: str) -> list[inputs.SpotEvent]:
    path = tmp_path / "spot.csv"
    path.write_text(text)
    return inputs.load_spot(path)


def test_checkpoint_time_grows_with_the_jobs_gpus() -> None:
    job = inputs.JobSpec("j", 0, 100, 8, 1, 2)
    assert SIZED.checkpoint_time(job) == 10 + 16 * 10 / 2.5
    assert SIZED.checkpoint_time(inputs.JobSpec("k", 0, 100, 1, 1, 1)) == 14
    # Without a state size every checkpoint takes the fixed part (the simulator's old model).
    assert engine.Settings().checkpoint_time(job) == 20


def _revoked(tmp_path: Path, notice: float) -> engine.Result:
    # One 16-GPU job (two 8-GPU members, min 1) on an on-demand and a spot node; the spot node
    # goes at 2500 s. The job runs from 30 (restart) at full size; checkpoints every 1000 s.
    nodes = _nodes(tmp_path, count=2, gpus=8, spot_fraction=0.5)
    jobs = _jobs(tmp_path, ["0,4000,16,1,2,0"])
    spot = _spot(tmp_path, "0,add,n1\n2500000,remove,n1\n")
    settings = dataclasses.replace(SIZED, notice_seconds=notice)
    return engine.Simulation(nodes, jobs, spot, "shoal", settings).run()


def test_a_notice_shorter_than_the_checkpoint_rolls_the_gang_back_to_its_last_one(
    tmp_path: Path,
) -> None:
    # 30 s notice (at 2470) < 74 s checkpoint: the surplus member leaves without one and the
    # whole gang rolls back to its checkpoint at 2000 (1970 s of work): 2440 - 1970 = 470 s at
    # 16 GPUs = 7520 GPU-s lost. 120 s notice: the checkpoint finishes, nothing is lost.
    short = _revoked(tmp_path, 30).summary()
    aws = _revoked(tmp_path, 120).summary()
    assert short["lost_gpu_hours_total"] == round(7520 / 3600, 2)
    assert aws["lost_gpu_hours_total"] == 0
    # Only the surplus member was on the spot node: the gang kept its minimum.
    assert short["revoked_pods"] == short["revoked_surplus_pods"] == 1
    assert short["quorum_revocations"] == aws["quorum_revocations"] == 0
    assert short["goodput"] < aws["goodput"] < 1


def test_a_revocation_that_takes_a_gang_below_its_minimum_is_a_quorum_revocation(
    tmp_path: Path,
) -> None:
    nodes = _nodes(tmp_path, count=1, gpus=8, spot_fraction=1.0)
    jobs = _jobs(tmp_path, ["0,4000,8,1,1,0"])
    spot = _spot(tmp_path, "0,add,n1\n2500000,remove,n1\n3000000,add,n2\n")
    s = engine.Simulation(nodes, jobs, spot, "shoal", SIZED).run().summary()
    assert s["revocations_affecting_jobs"] == s["quorum_revocations"] == 1
    assert s["revoked_surplus_pods"] == 0


def _reclaimed(tmp_path: Path, features: frozenset[str]) -> engine.Result:
    # Five 8-GPU nodes. A (16 GPUs, 1-2 members) starts at 0, B (same) at 900; C (16 GPUs, 2
    # members) arrives at 2000 and needs one of their surplus members. A checkpointed at 1800
    # (interval 1800), B has none yet. Victims leave after the 30 s grace, too soon for a 74 s
    # checkpoint: their gang rolls back.
    nodes = _nodes(tmp_path, count=5, gpus=8)
    jobs = _jobs(tmp_path, ["0,9000,16,1,2,0", "900,9000,16,1,2,0", "2000,600,16,2,2,0"])
    settings = dataclasses.replace(SIZED, checkpoint_interval=1800, features=features)
    return engine.Simulation(nodes, jobs, [], "shoal", settings).run()


def test_least_loss_reclaim_takes_the_member_with_the_newest_checkpoint(tmp_path: Path) -> None:
    # Without progress reports the youngest member goes (B's): B loses all it did, 2030 - 930 =
    # 1100 s at 16 GPUs. With them, A's member goes: A loses 230 s since its checkpoint at 1800.
    youngest = _reclaimed(tmp_path, frozenset()).summary()
    least = _reclaimed(tmp_path, frozenset({"least-loss"})).summary()
    assert youngest["reclaimed_pods"] == least["reclaimed_pods"] == 1
    assert youngest["reclaim_lost_gpu_hours"] == round(1100 * 16 / 3600, 2)
    assert least["reclaim_lost_gpu_hours"] == round(230 * 16 / 3600, 2)


def test_patience_waits_for_the_victims_next_checkpoint(tmp_path: Path) -> None:
    # A's member is asked at A's next checkpoint (3600) and leaves 30 s later: 30 s at 16 GPUs.
    run = _reclaimed(tmp_path, frozenset({"least-loss", "patience"}))
    s = run.summary()
    assert s["reclaimed_pods"] == 1
    assert s["reclaim_lost_gpu_hours"] == round(30 * 16 / 3600, 2)
    waits = {j["id"]: j["wait"] for j in run.jobs}
    assert waits["job-3"] == pytest.approx(3630 - 2000)


def _warned(tmp_path: Path, features: frozenset[str]) -> engine.Result:
    # As _revoked with a 30 s notice, a warning 1000 s before the removal (at 1500), and a free
    # on-demand node where a member moved off the warned node fits.
    nodes = _nodes(tmp_path, count=3, gpus=8, spot_fraction=0.34)
    jobs = _jobs(tmp_path, ["0,4000,16,1,2,0"])
    spot = _spot(tmp_path, "0,add,n1\n2500000,remove,n1\n")
    settings = dataclasses.replace(
        SIZED, notice_seconds=30, warning_seconds=1000, features=features
    )
    return engine.Simulation(nodes, jobs, spot, "shoal", settings).run()


def test_an_early_warning_moves_the_surplus_member_at_its_next_checkpoint(tmp_path: Path) -> None:
    # Without the feature the warning only cordons: the notice costs 470 s at 16 GPUs, as in
    # _revoked. With it the surplus member is asked at the checkpoint at 2000 and leaves at
    # 2030: 30 s at 16 GPUs; its replacement starts on the free node; the revocation then hits
    # no job.
    ignored = _warned(tmp_path, frozenset()).summary()
    moved = _warned(tmp_path, frozenset({"least-loss", "early-warning"})).summary()
    assert ignored["lost_gpu_hours_total"] == round(7520 / 3600, 2)
    assert ignored["moved_pods"] == 0
    assert moved["moved_pods"] == 1
    assert moved["revocations_affecting_jobs"] == 0
    assert moved["lost_gpu_hours_total"] == moved["moved_lost_gpu_hours"] == round(480 / 3600, 2)


def test_cli_compares_each_feature_on_and_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cluster.json").write_text(
        json.dumps({"node_groups": [{"count": 4, "gpus": 8, "spot_fraction": 0.5}]})
    )
    (tmp_path / "jobs.csv").write_text("submit,duration,gpus\n0,4000,16\n5,3000,8\n")
    (tmp_path / "spot.csv").write_text("0,add,a\n0,add,b\n2500000,remove,a\n")
    code = cli.main(
        [
            *("--cluster", str(tmp_path / "cluster.json")),
            *("--jobs", str(tmp_path / "jobs.csv")),
            *("--spot-trace", str(tmp_path / "spot.csv")),
            *("--cloud", "gcp", "--checkpoint-gb-per-gpu", "10", "--compare-features"),
            *("--policies", "shoal,best-fit", "--processes", "2", "--out", str(tmp_path / "out")),
        ]
    )
    assert code == 0
    runs = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"]
    every = "least-loss+patience+early-warning+risk+quorum-bound+member-bound"
    assert [(r["policy"], r["features"]) for r in runs] == [
        ("shoal", "none"),
        ("shoal", "patience+early-warning+risk+quorum-bound+member-bound"),
        ("shoal", "least-loss+early-warning+risk+quorum-bound+member-bound"),
        ("shoal", "least-loss+patience+risk+quorum-bound+member-bound"),
        ("shoal", "least-loss+patience+early-warning+quorum-bound+member-bound"),
        ("shoal", "least-loss+patience+early-warning+risk+member-bound"),
        ("shoal", "least-loss+patience+early-warning+risk+quorum-bound"),
        ("shoal", every),
        ("best-fit", "none"),
    ]
    printed = capsys.readouterr().out
    assert "| policy | features | notice | goodput | GPU-h lost |" in printed
    assert f"| shoal | {every} | 30 s |" in printed


def test_cli_refuses_an_unknown_feature(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cluster.json").write_text(json.dumps({"node_groups": [{"count": 1}]}))
    (tmp_path / "jobs.csv").write_text("submit,duration,gpus\n0,10,8\n")
    code = cli.main(
        [
            *("--cluster", str(tmp_path / "cluster.json")),
            *("--jobs", str(tmp_path / "jobs.csv")),
            *("--features", "least-loss,luck", "--out", str(tmp_path / "out")),
        ]
    )
    assert code == 2
    assert "unknown features ['luck']" in capsys.readouterr().err


def _quorum_node(tmp_path: Path, revoked: str) -> str:
    # Two spot pools (zones a and b), one 8-GPU node each. Instance x takes a-0000 and y b-0000
    # at 0; one of them is revoked at 1000 and replaced at 1100 on the same node. A one-member
    # gang arrives at 2000, when both nodes are free (the first, short job only sets the
    # clock's start): where does its quorum go?
    path = tmp_path / "cluster.json"
    groups = [
        {"count": 1, "gpus": 8, "spot_fraction": 1.0, "prefix": "a"},
        {"count": 1, "gpus": 8, "spot_fraction": 1.0, "prefix": "b"},
    ]
    path.write_text(json.dumps({"node_groups": groups}))
    nodes = inputs.build_nodes(inputs.load_cluster(path))
    jobs = _jobs(tmp_path, ["0,10,8,1,1,0", "2000,600,8,1,1,0"])
    spot = _spot(tmp_path, f"0,add,x\n0,add,y\n1000000,remove,{revoked}\n1100000,add,z\n")
    settings = dataclasses.replace(SIZED, features=frozenset({"risk"}), record_effects=True)
    result = engine.Simulation(nodes, jobs, spot, "shoal", settings).run()
    return next(d for _, kind, pod, d in result.effects if kind == "bind" and pod == "job-2-0")


def test_with_risk_aware_placement_a_quorum_avoids_the_pool_that_was_revoked(
    tmp_path: Path,
) -> None:
    assert _quorum_node(tmp_path, "x") == "b-0000"
    assert _quorum_node(tmp_path, "y") == "a-0000"


def test_cli_runs_shoal_once_per_feature_set(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(json.dumps({"node_groups": [{"count": 2}]}))
    (tmp_path / "jobs.csv").write_text("submit,duration,gpus\n0,100,8\n")
    code = cli.main(
        [
            *("--cluster", str(tmp_path / "cluster.json")),
            *("--jobs", str(tmp_path / "jobs.csv")),
            *("--feature-sets", "none;least-loss,risk;all", "--policies", "shoal,best-fit"),
            *("--out", str(tmp_path / "out")),
        ]
    )
    assert code == 0
    runs = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"]
    assert [(r["policy"], r["features"]) for r in runs] == [
        ("shoal", "none"),
        ("shoal", "least-loss+risk"),
        ("shoal", "least-loss+patience+early-warning+risk+quorum-bound+member-bound"),
        ("best-fit", "none"),
    ]


def _bound_run(tmp_path: Path, features: frozenset[str]) -> engine.Result:
    # An on-demand and a spot node (8 GPUs each); the spot instance is revoked at 1000 (a
    # 30 s notice) and replaced at 1100. Job 2 takes the on-demand node from 1500 to 2130; job
    # 3 (8 GPUs: a 42 s checkpoint, longer than the notice) arrives at 2000, when only the spot
    # node is free. Job 1 only sets the clock's start.
    nodes = _nodes(tmp_path, count=2, gpus=8, spot_fraction=0.5)
    jobs = _jobs(tmp_path, ["0,10,8,1,1,0", "1500,600,8,1,1,0", "2000,600,8,1,1,0"])
    spot = _spot(tmp_path, "0,add,x\n1000000,remove,x\n1100000,add,z\n")
    settings = dataclasses.replace(
        SIZED, notice_seconds=30, max_quorum_risk=0.01, features=features, record_effects=True
    )
    return engine.Simulation(nodes, jobs, spot, "shoal", settings).run()


def test_a_gang_that_cannot_checkpoint_within_the_notice_waits_for_safe_capacity(
    tmp_path: Path,
) -> None:
    def where(result: engine.Result) -> tuple[float, str]:
        return next((t, d) for t, kind, pod, d in result.effects if pod == "job-3-0")

    risky = _bound_run(tmp_path, frozenset({"risk"}))
    bound = _bound_run(tmp_path, frozenset({"risk", "quorum-bound"}))
    assert where(risky) == (2000, "g0-0001")
    # It waits for the on-demand node, freed when job 2 ends (1500 + 30 s restart + 600 s).
    assert where(bound) == (2130, "g0-0000")


def _member_run(tmp_path: Path, features: frozenset[str]) -> dict[str, object]:
    # An on-demand and a spot node (8 GPUs each); the spot instance is revoked at 1000 (a 30 s
    # notice: the risk ledger learns the spot pool) and replaced at 1100 by one revoked at
    # 3000. Job 2 (16 GPUs: two 8-GPU members, minimum 1; a 74 s checkpoint, longer than the
    # notice) arrives at 2000, when both nodes are free. Job 1 only sets the clock's start.
    nodes = _nodes(tmp_path, count=2, gpus=8, spot_fraction=0.5)
    jobs = _jobs(tmp_path, ["0,10,8,1,1,0", "2000,3000,16,1,2,0"])
    spot = _spot(tmp_path, "0,add,x\n1000000,remove,x\n1100000,add,z\n3000000,remove,z\n")
    settings = dataclasses.replace(
        SIZED, notice_seconds=30, max_member_risk=0.01, features=features
    )
    return engine.Simulation(nodes, jobs, spot, "shoal", settings).run().summary()


def test_a_gang_that_cannot_checkpoint_within_the_notice_keeps_its_surplus_off_risky_capacity(
    tmp_path: Path,
) -> None:
    risky = _member_run(tmp_path, frozenset({"risk"}))
    bound = _member_run(tmp_path, frozenset({"risk", "member-bound"}))
    # Without the bound its surplus member takes the spot node; the revocation rolls the
    # whole gang back to its start (no checkpoint yet): 940 s of work on 16 GPUs.
    assert risky["revoked_surplus_pods"] == 1
    assert risky["lost_gpu_hours_total"] == round(940 * 16 / 3600, 2)
    # With it, the surplus member never goes to spot: nothing is revoked, nothing lost.
    assert bound["spot_binds_surplus"] == 0
    assert bound["revoked_pods"] == 0
    assert bound["lost_gpu_hours_total"] == 0
