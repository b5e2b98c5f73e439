"""The simulator runs the live core on a virtual clock: gangs finish, checkpoint-on-notice
saves the work a revocation would otherwise cost, and Shoal's placement keeps gangs in a rack
where spreading does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    nodes = inputs.build_nodes(_cluster(tmp_path, count=4, gpus=8, racks_per_zone=2))
    # A small job takes a corner of rack 0; then a gang of two 8-GPU members arrives. Only
    # rack 1 can hold it whole; least-allocated takes the emptiest nodes wherever they are.
    jobs = _jobs(tmp_path, ["0,3600,2,1,1,0", "10,600,16,2,2,0"])
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
