"""The simulator runs the live core on a virtual clock: gangs finish, checkpoint-on-notice
saves the work a revocation would otherwise cost, and Shoal's placement keeps gangs in a rack
where spreading does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contracts import names
from scheduler.simulate import cli, engine, inputs


def _cluster(tmp_path: Path, **group: object) -> list[inputs.NodeGroup]:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"node_groups": [group]}))
    return inputs.load_cluster(path)


def _jobs(tmp_path: Path, rows: list[str]) -> list[inputs.JobSpec]:
    path = tmp_path / "jobs.csv"
    path.write_text("submit,duration,gpus,min_pods,max_pods,priority\n" + "\n".join(rows) + "\n")
    return inputs.load_jobs(path, node_gpus=8)


def test_every_job_finishes_and_no_node_is_overcommitted(tmp_path: Path) -> None:
    nodes = inputs.build_nodes(_cluster(tmp_path, count=2, gpus=8))
    jobs = _jobs(tmp_path, ["0,3600,16,1,2,0", "10,600,8,1,1,0", "20,600,4,1,1,0"])
    result = engine.Simulation(nodes, jobs, [], "shoal").run()
    summary = result.summary()
    assert summary["jobs_finished"] == 3
    assert all(0.0 <= alloc <= 1.0 for _t, alloc, _f, _w in result.samples)
    # The 16-GPU job took the whole cluster at full size, so the others waited for it to
    # shrink or finish; nobody started before their submit time.
    waits = {j["id"]: j["wait"] for j in result.jobs}
    assert all(w is not None and w >= 0 for w in waits.values())


def test_checkpoint_on_notice_loses_no_work_where_periodic_checkpoints_do(tmp_path: Path) -> None:
    nodes = inputs.build_nodes(_cluster(tmp_path, count=2, gpus=8, spot_fraction=0.5))
    jobs = _jobs(tmp_path, ["0,7200,16,1,2,0"])
    spot_file = tmp_path / "spot.csv"
    spot_file.write_text("0,add,node1\n2400000,remove,node1\n")
    spot = inputs.load_spot(spot_file)
    settings = engine.Settings(checkpoint_interval=1800)
    on_notice = engine.Simulation(nodes, jobs, spot, "shoal", settings).run().summary()
    periodic = (
        engine.Simulation(
            nodes,
            jobs,
            spot,
            "shoal",
            engine.Settings(checkpoint_interval=1800, checkpoint_on_notice=False),
        )
        .run()
        .summary()
    )
    assert on_notice["revocations_affecting_jobs"] == 1
    assert periodic["revocations_affecting_jobs"] == 1
    assert on_notice["lost_gpu_hours"] == 0
    assert periodic["lost_gpu_hours"] > 0
    assert on_notice["jobs_finished"] == periodic["jobs_finished"] == 1
    assert on_notice["makespan_s"] < periodic["makespan_s"]


def test_shoal_keeps_a_gang_in_one_rack_where_spreading_does_not(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    # Rack a-rack-0 holds two 8-GPU nodes; the 16-GPU nodes b-0000 and b-0001 are in racks of
    # their own. A gang of two 8-GPU members fits in one rack either way; least-allocated takes
    # the two emptiest nodes, which are in different racks.
    groups = [
        {"count": 2, "gpus": 8, "prefix": "a"},
        {"count": 2, "gpus": 16, "racks_per_zone": 2, "prefix": "b"},
    ]
    path.write_text(json.dumps({"node_groups": groups}))
    nodes = inputs.build_nodes(inputs.load_cluster(path))
    jobs = _jobs(tmp_path, ["0,600,16,2,2,0"])
    shoal = engine.Simulation(nodes, jobs, [], "shoal").run().summary()
    spread = engine.Simulation(nodes, jobs, [], "least-allocated").run().summary()
    assert shoal["gangs_in_one_rack"] == 1.0
    assert spread["gangs_in_one_rack"] == 0.0


def test_cli_writes_summary_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cluster.json").write_text(
        json.dumps({"node_groups": [{"count": 4, "gpus": 8, "racks_per_zone": 2}]})
    )
    (tmp_path / "jobs.csv").write_text("submit,duration,gpus\n0,100,8\n5,50,2\n")
    code = cli.main(
        [
            "--cluster",
            str(tmp_path / "cluster.json"),
            "--jobs",
            str(tmp_path / "jobs.csv"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [r["policy"] for r in summary["runs"]] == list(engine.POLICIES)
    assert (tmp_path / "out" / "allocation.png").stat().st_size > 0
    # The comparison is printed as a table, one row per policy.
    printed = capsys.readouterr().out
    assert "| policy | checkpoints | GPU alloc |" in printed
    assert all(f"| {policy} | on notice |" in printed for policy in engine.POLICIES)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"node_groups": []}', "at least one group"),
        ('{"node_groups": [{"count": 2, "gpu": 8}]}', "unknown fields ['gpu']"),
        ("not json", "not JSON"),
    ],
)
def test_bad_cluster_files_say_what_is_wrong(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(content)
    with pytest.raises(inputs.InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        inputs.load_cluster(path)


def test_bad_rows_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("submit,duration,gpus\n0,100,8\n5,soon,2\n")
    with pytest.raises(inputs.InputError, match=r"jobs.csv:3: 'soon' is not a number"):
        inputs.load_jobs(path, node_gpus=8)


def test_a_repeated_spot_trace_starts_each_replay_afresh() -> None:
    trace = [
        inputs.SpotEvent(0.0, "add", "node1"),
        inputs.SpotEvent(0.0, "add", "node2"),
        inputs.SpotEvent(100.0, "remove", "node1"),
    ]
    out = inputs.repeat_spot(trace, until=150.0)
    assert [(e.time, e.kind, e.node) for e in out] == [
        (0.0, "add", "node1#0"),
        (0.0, "add", "node2#0"),
        (100.0, "remove", "node1#0"),
        (100.5, "remove", "node2#0"),
        (101.0, "add", "node1#1"),
        (101.0, "add", "node2#1"),
        (201.0, "remove", "node1#1"),
        (201.5, "remove", "node2#1"),
    ]


# -- metrics on cases small enough to check by hand ---------------------------------------------


def test_metrics_of_two_nodes_and_three_jobs_match_a_hand_computation(tmp_path: Path) -> None:
    # Two nodes of 8 GPUs in one rack, islands of 4 GPUs; no restart cost, so times are exact.
    #   j1: t=0,   8 GPUs, 1000 s  -> one 8-GPU pod, starts at 0 on one node, ends at 1000.
    #   j2: t=0,  16 GPUs,  500 s, min 2 max 2 -> needs both nodes whole: waits.
    #   j3: t=100, 4 GPUs, 1000 s  -> one 4-GPU pod, starts at 100 on the other node, ends 1100.
    # j2 can start only when both nodes are empty: at 1100 (j1 left at 1000, j3 at 1100); it
    # ends at 1600.
    # GPUs in use: 8 on [0,100), 12 on [100,1000), 4 on [1000,1100), 16 on [1100,1600):
    #   allocation = (8*100 + 12*900 + 4*100 + 16*500) / (16*1600) = 20000/25600 = 0.78125;
    #   j2 waits on [0,1100): while it waits (8*100 + 12*900 + 4*100) / (16*1100) = 0.6818.
    # Fragmentation while j2 waits (its members need 8 GPUs):
    #   [0,100): free 8 on one node, usable -> 0;  [100,1000): the 4 free GPUs next to j3 are
    #   stranded -> 1;  [1000,1100): 4 stranded of 12 free -> 1/3.
    #   mean over the 1100 waiting seconds = (0*100 + 1*900 + 1/3*100) / 1100 = 0.8485;
    #   over the whole run (0 when nothing waits) = 933.3 / 1600 = 0.5833.
    # Waits 0, 1100, 0 (mean 366.7); completion times 1000, 1600, 1000 (mean 1200).
    # j2's quorum (2 members) lands in the one rack, which had room for it: share 1 and 1.
    # Multi-GPU pods: j1's 8 and j2's two 8s cannot fit an island of 4; j3's 4 can and does:
    #   in one island 1/4 of all, 1/1 where some node had such an island free.
    nodes = inputs.build_nodes(_cluster(tmp_path, count=2, gpus=8, island_size=4))
    jobs = _jobs(tmp_path, ["0,1000,8,1,1,0", "0,500,16,2,2,0", "100,1000,4,1,1,0"])
    settings = engine.Settings(restart_seconds=0, sample_every=100)
    result = engine.Simulation(nodes, jobs, [], "shoal", settings).run()
    s = result.summary()

    assert s["jobs_finished"] == 3
    assert s["gpu_allocation_mean"] == pytest.approx(0.7812, abs=1e-4)
    assert s["gpu_allocation_while_jobs_wait"] == pytest.approx(0.6818, abs=1e-4)
    assert s["fragmentation_while_jobs_wait"] == pytest.approx(0.8485, abs=1e-4)
    assert s["fragmentation_mean"] == pytest.approx(0.5833, abs=1e-4)
    assert {j["id"]: j["wait"] for j in result.jobs} == {"job-1": 0, "job-2": 1100, "job-3": 0}
    assert s["job_wait_mean_s"] == pytest.approx(366.6667, abs=1e-3)
    assert s["jct_mean_s"] == 1200
    assert s["makespan_s"] == 1600
    assert s["gangs_in_one_rack"] == 1.0
    assert s["gangs_in_one_rack_when_possible"] == 1.0
    assert s["multi_gpu_pods_in_one_island"] == 0.25
    assert s["multi_gpu_pods_in_one_island_when_possible"] == 1.0
    # Samples for the plot are taken after the scheduler acted on that instant.
    assert [(t, a) for t, a, _f, _w in result.samples[:3]] == [(0, 0.5), (100, 0.75), (200, 0.75)]


def test_one_rack_share_counts_a_gang_split_only_when_one_rack_could_hold_it(
    tmp_path: Path,
) -> None:
    # Two racks of one 8-GPU node each. A gang of two 8-GPU members cannot fit one rack: it is
    # split (share 0) but not counted against the policy (no rack could hold it).
    nodes = inputs.build_nodes(_cluster(tmp_path, count=2, gpus=8, racks_per_zone=2))
    jobs = _jobs(tmp_path, ["0,100,16,2,2,0"])
    s = engine.Simulation(nodes, jobs, [], "shoal").run().summary()
    assert s["gangs_in_one_rack"] == 0.0
    assert s["gangs_in_one_rack_when_possible"] is None


def _revoked_run(tmp_path: Path, *, on_notice: bool) -> engine.Result:
    nodes = inputs.build_nodes(_cluster(tmp_path, count=2, gpus=8, spot_fraction=0.5))
    jobs = _jobs(tmp_path, ["0,4000,16,1,2,0"])
    spot_file = tmp_path / "spot.csv"
    spot_file.write_text("0,add,n1\n2500000,remove,n1\n")
    settings = engine.Settings(
        notice_seconds=120,
        checkpoint_seconds=20,
        restart_seconds=30,
        checkpoint_interval=1000,
        checkpoint_on_notice=on_notice,
    )
    spot = inputs.load_spot(spot_file)
    return engine.Simulation(nodes, jobs, spot, "shoal", settings).run()


def test_work_lost_to_a_revocation_with_and_without_notice_matches_a_hand_computation(
    tmp_path: Path,
) -> None:
    # One 16-GPU job (two 8-GPU members, min 1) on an on-demand node and a spot node; the spot
    # node is revoked at 2500 s. The job starts at 0 and makes progress from 30 (restart).
    # Periodic checkpoints only (every 1000 s of the run since 0): at 2500 it has done 2470 s of
    # full-size work, its last checkpoint (at 2000) holds 1970: 500 s x 16 GPUs = 8000 GPU-s
    # lost, and 30 s (restart) without progress. It resumes at 2530 on one member (half speed)
    # from 1970: (4000 - 1970) * 2 = 4060 s, done at 6590.
    # Checkpoint on notice (120 s before, at 2380): work 2350 is saved, nothing is lost; the job
    # pauses 20 s (checkpoint) + 30 s (restart) and resumes at 2430 at half speed from 2350:
    # (4000 - 2350) * 2 = 3300 s, done at 5730.
    periodic = _revoked_run(tmp_path, on_notice=False)
    noticed = _revoked_run(tmp_path, on_notice=True)
    p, n = periodic.summary(), noticed.summary()
    assert [round(r.lost_gpu_seconds, 6) for r in periodic.revocations] == [8000]
    assert [r.downtime_seconds for r in periodic.revocations] == [30]
    assert [(r.lost_gpu_seconds, r.downtime_seconds) for r in noticed.revocations] == [(0, 50)]
    assert p["lost_gpu_hours"] == round(8000 / 3600, 2)
    assert p["lost_gpu_seconds_per_revocation"] == pytest.approx(8000)
    assert n["lost_gpu_seconds_per_revocation"] == 0
    assert n["downtime_seconds_per_revocation"] == 50
    assert p["makespan_s"] == pytest.approx(6590)
    assert n["makespan_s"] == pytest.approx(5730)


def test_a_waiting_gang_takes_room_from_surplus_the_way_the_live_loop_reclaims(
    tmp_path: Path,
) -> None:
    # j1 (16 GPUs, min 1, max 2) fills both nodes at 0. j2 (8 GPUs) arrives at 10: its minimum
    # does not fit, the cycle names j1's surplus member as the victim; it is asked to leave and
    # goes 30 s later (the live grace), at 40, after a checkpoint: j2 starts at 40 and ends at
    # 640. j1: 40 s of work at full speed, paused 20 s (checkpoint), then half speed on [60, 640):
    # 40 + 290 = 330; it grows back at 640 and ends at 640 + 3270 = 3910.
    nodes = inputs.build_nodes(_cluster(tmp_path, count=2, gpus=8))
    jobs = _jobs(tmp_path, ["0,3600,16,1,2,0", "10,600,8,1,1,0"])
    settings = engine.Settings(restart_seconds=0, checkpoint_seconds=20)
    result = engine.Simulation(nodes, jobs, [], "shoal", settings).run()
    finished = {j["id"]: (j["wait"], j["finished"]) for j in result.jobs}
    assert finished == {"job-1": (0, pytest.approx(3910)), "job-2": (30, 640)}
    assert result.summary()["reclaimed_pods"] == 1
    assert result.summary()["reclaim_lost_gpu_hours"] == 0


# -- the simulator runs the live scheduler's code, not a copy -------------------------------------


def test_the_simulator_uses_the_live_cycle_and_placement_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler import cycle, reclaim, runner, step, topology
    from scheduler.placement import search

    # The very step the live loop runs (tests/unit/scheduler/test_step.py compares what the
    # two do with it).
    assert vars(engine)["step"] is vars(runner)["step"] is step.step
    assert vars(engine)["Ledgers"] is vars(runner)["Ledgers"]
    assert vars(cycle)["place"] is search.place
    assert vars(engine)["topology"] is topology
    # And they are what runs: spy on the live modules' placement search and reclaim planner.
    calls: dict[str, int] = {"place": 0, "plan": 0}
    real_place, real_plan = search.place, reclaim.plan

    def spy_place(*args: Any, **kwargs: Any) -> Any:
        calls["place"] += 1
        return real_place(*args, **kwargs)

    def spy_plan(*args: Any, **kwargs: Any) -> Any:
        calls["plan"] += 1
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(cycle, "place", spy_place)
    monkeypatch.setattr(reclaim, "plan", spy_plan)
    nodes = inputs.build_nodes(_cluster(tmp_path, count=2, gpus=8))
    jobs = _jobs(tmp_path, ["0,3600,16,1,2,0", "10,600,8,1,1,0"])
    result = engine.Simulation(nodes, jobs, [], "shoal").run()
    assert result.summary()["jobs_finished"] == 2
    assert calls["place"] >= 3  # j1's minimum and surplus, j2's minimum (at least)
    assert calls["plan"] >= 1  # j2's reclaim


# -- trace formats --------------------------------------------------------------------------------


def test_a_tiresias_cluster_shape_reads_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "n32g4.csv"
    path.write_text(
        "num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n2,16,4,40,256\n"
    )
    nodes = inputs.build_nodes(inputs.load_cluster(path))
    assert len(nodes) == 32
    assert {n.allocatable.gpu for n in nodes} == {4}
    racks = {n.labels[names.RACK_LABEL] for n in nodes}
    assert len(racks) == 2  # a switch is a rack


def test_pollux_workloads_become_gangs_of_one_gpu_members(tmp_path: Path) -> None:
    path = tmp_path / "workload-1.csv"
    path.write_text(
        "name,time,application,num_replicas,batch_size\n"
        "cifar10-0,107,cifar10,6,2048\nncf-2,135,ncf,1,32768\n"
    )
    jobs = inputs.load_jobs(path, node_gpus=8)
    assert [(j.submit, j.pod_gpus, j.min_pods, j.max_pods, j.duration) for j in jobs] == [
        (0, 1, 3, 6, inputs.POLLUX_DURATIONS["cifar10"]),
        (28, 1, 1, 1, inputs.POLLUX_DURATIONS["ncf"]),
    ]
    assert [j.id for j in inputs.load_jobs(path, node_gpus=8, min_gpus=2)] == ["pollux-cifar10-0"]
