"""The command line: help, JSON and files."""

import json

import pytest

from bbsim import cli

COMMANDS = ["ior", "replay", "validate", "predict", "machine"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: bbsim " + command) and "--json" in out


def test_top_level_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert all(c in out for c in COMMANDS) and "Exit status" in out


def test_ior_writes_csv_json_png(tmp_path, capsys):
    code = cli.main(["ior", "--machine", "trinity", "--servers", "230", "--nodes", "64,512,2048",
                     "--variant", "rr:topology.global_port_assignment=round_robin", "--out", str(tmp_path)])
    assert code == 0
    text = capsys.readouterr().out
    assert "client node cap" in text and "green" in text and "server bandwidth" in text
    rows = (tmp_path / "ior.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 3
    data = json.loads((tmp_path / "ior.json").read_text())
    assert {p["variant"] for p in data["points"]} == {"base", "rr"}
    assert (tmp_path / "ior.png").read_bytes()[:4] == b"\x89PNG"


def test_ior_json(capsys):
    assert cli.main(["ior", "--nodes", "16", "--op", "read", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["points"][0]["gbps"] == pytest.approx(32.0)


def test_bad_options_are_clear(capsys):
    assert cli.main(["ior", "--nodes", "16", "--transfer", "1XB"]) == 2
    assert "unknown unit" in capsys.readouterr().err
    assert cli.main(["ior", "--nodes", "999999"]) == 2
    assert "compute nodes" in capsys.readouterr().err
    assert cli.main(["ior", "--nodes", "16", "--op", "append"]) == 2


def test_replay_json_and_files(wheel_logs, tmp_path, capsys):
    logs = [str(wheel_logs["sample-badost.darshan"]), str(wheel_logs["example.darshan"]) + ":32"]
    assert cli.main(["replay", *logs, "--ranks-per-node", "24", "--align", "--out", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["jobs"]) == 2 and len(data["slowdown"]["slowdown"]) == 2
    assert (tmp_path / "timeline.png").exists() and (tmp_path / "timeline.csv").exists()


def test_validate_json(capsys):
    assert cli.main(["validate", "--only", "S1,S2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and {r["id"] for r in data["rows"]} == {"S1", "S2"}


def test_machine_summary(capsys):
    assert cli.main(["machine", "trinity"]) == 0
    out = capsys.readouterr().out
    assert "20520 compute" in out and "570 burst buffer" in out
    assert cli.main(["machine", "--list"]) == 0


def test_classes_are_named_in_text_and_json(capsys):
    assert cli.main(["ior", "--nodes", "6", "--op", "write", "--ppn", "4", "--classes"]) == 0
    out = capsys.readouterr().out
    assert "class (router)" in out and "g0:c0s6" in out and "client stream cap (0.41 GB/s per stream)" in out
    assert cli.main(["ior", "--nodes", "6", "--op", "write", "--classes", "--json"]) == 0
    point = json.loads(capsys.readouterr().out)["points"][0]
    # nids 20-23 on router g0:c0s5 (slots 0-4 hold DataWarp nodes); the next compute nids are
    # ports 2-3 of the LNET router g0:c0s6
    assert [(c["router"], c["nodes"]) for c in point["classes"]] == [("g0:c0s5", 4), ("g0:c0s6", 2)]
    assert {c["bound_by"] for c in point["classes"]} == {"client node cap (0.0625 GB/s per stream)"}
    assert cli.main(["ior", "--nodes", "6", "--op", "write", "--json"]) == 0
    assert "classes" not in json.loads(capsys.readouterr().out)["points"][0]


def test_set_errors_name_the_option_not_a_file_line(capsys):
    assert cli.main(["machine", "trinity", "--set", "topology.groups=abc"]) == 2
    err = capsys.readouterr().err
    assert "field topology.groups (from --set topology.groups=abc)" in err and "expected an integer" in err
    assert "line" not in err.split("fix:")[0]


def test_loadbalance_is_read_only(capsys):
    assert cli.main(["ior", "--nodes", "4", "--access-mode", "loadbalance", "--op", "write"]) == 2
    assert "read-only" in capsys.readouterr().err
    assert cli.main(["ior", "--nodes", "4", "--access-mode", "loadbalance", "--json"]) == 0
    assert [p["op"] for p in json.loads(capsys.readouterr().out)["points"]] == ["read"]


def test_variant_job_settings_are_checked(capsys):
    assert cli.main(["ior", "--nodes", "4", "--variant", "x:access_mode=stripy"]) == 2
    err = capsys.readouterr().err
    assert "--variant" in err and "'stripy' is not one of: striped, private, loadbalance" in err
    assert cli.main(["ior", "--nodes", "4", "--variant", "x:ppn=0"]) == 2
    assert "ppn" in capsys.readouterr().err


def test_replay_warns_when_a_log_has_nothing_to_replay(wheel_logs, capsys):
    log = str(wheel_logs["sample-badost.darshan"])
    assert cli.main(["replay", log, "--path-prefix", "/no/such/dir", "--no-matrix"]) == 0
    assert "no POSIX reads or writes to replay under /no/such/dir" in capsys.readouterr().err


def test_json_results_record_what_produced_them(wheel_logs, capsys):
    import hashlib
    from pathlib import Path
    assert cli.main(["ior", "--nodes", "4", "--op", "write", "--set", "routing.valiant_fraction=0.1", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["run"]
    assert run["command"][:3] == ["bbsim", "ior", "--nodes"] and "routing.valiant_fraction=0.1" in run["command"]
    machine = next(f for f in run["inputs"] if f["kind"] == "machine")
    assert machine["file"].endswith("trinity.yaml")
    assert machine["sha256"] == hashlib.sha256(Path(machine["file"]).read_bytes()).hexdigest()
    log = str(wheel_logs["sample-goodost.darshan"])
    assert cli.main(["replay", log, "--no-matrix", "--json"]) == 0
    inputs = json.loads(capsys.readouterr().out)["run"]["inputs"]
    assert [f["kind"] for f in inputs] == ["machine", "server profile", "darshan log"]
    assert inputs[2]["sha256"] == hashlib.sha256(Path(log).read_bytes()).hexdigest()
