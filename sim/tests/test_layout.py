"""Spillway layout snapshots: schema, errors, mapping and predict."""

import copy
import json

import pytest

from bbsim import cli
from bbsim.errors import InputError
from bbsim.ior import IorSpec
from bbsim.layout import load_snapshot, map_hostnames, parse_snapshot, predict, schema

from pathlib import Path

EXAMPLE_SNAPSHOT = Path(__file__).resolve().parents[1] / "examples" / "spillway-layout-trinity.json"


@pytest.fixture
def example():
    return json.loads(EXAMPLE_SNAPSHOT.read_text())


def test_example_validates_against_the_schema(example):
    import jsonschema
    jsonschema.Draft202012Validator.check_schema(schema())
    jsonschema.validate(example, schema())
    snap = load_snapshot(EXAMPLE_SNAPSHOT)
    assert set(snap.sessions) == {"4242", "4243", "shared-data"}


def test_predict_names_bandwidth_and_limit(trinity):
    snap = load_snapshot(EXAMPLE_SNAPSHOT)
    r = predict(trinity, snap, "4242", IorSpec(nodes=1))
    online = [f for f in snap.instances[101]["fragments"] if snap.nodes[f["node"]]["online"]]
    assert r["gbps"] == pytest.approx(len(online) * trinity.server_bandwidth("write", 1 << 20, 64 * 32 / len(online)))
    assert r["binding"] == "server bandwidth"
    assert any("offline" in w for w in r["warnings"])


def test_striping_is_even_whatever_the_fragments_capacity(trinity, example, tmp_path):
    # Spillway's stripe map puts 1/K of every file on each of K fragments: a fragment holding
    # three grains serves no more of a file than one holding one.
    data = copy.deepcopy(example)
    inst = next(i for i in data["instances"] if i["id"] == 103)
    caps = [3 * (1 << 30), 1 << 30, 1 << 30, 1 << 30]
    for f, c in zip(inst["fragments"], caps):
        f["capacity"] = c
    inst["capacity"] = sum(caps)
    uneven = tmp_path / "uneven.json"
    uneven.write_text(json.dumps(data))
    even = predict(trinity, load_snapshot(EXAMPLE_SNAPSHOT), "shared-data", IorSpec(nodes=1), nodes=64)
    skewed = predict(trinity, load_snapshot(uneven), "shared-data", IorSpec(nodes=1), nodes=64)
    assert skewed["gbps"] == pytest.approx(even["gbps"])
    assert skewed["binding"] == even["binding"]


def test_concurrent_session_lowers_the_prediction(trinity):
    snap = load_snapshot(EXAMPLE_SNAPSHOT)
    alone = predict(trinity, snap, "4242", IorSpec(nodes=1))["gbps"]
    both = predict(trinity, snap, "4242", IorSpec(nodes=1), concurrent=["4243"])
    assert both["gbps"] < alone and both["concurrent"]["4243"] > 0


def err(data):
    with pytest.raises(InputError) as info:
        parse_snapshot(data, "snap.json")
    return str(info.value)


def test_missing_field(example):
    bad = copy.deepcopy(example)
    del bad["instances"][0]["fragments"][1]["node"]
    msg = err(bad)
    assert "instances[0].fragments[1]" in msg and "add the field 'node'" in msg


def test_unknown_field(example):
    bad = copy.deepcopy(example)
    bad["nodes"][0]["colour"] = "blue"
    assert "nodes[0]" in err(bad) and "x_" in err(bad)
    ok = copy.deepcopy(example)
    ok["nodes"][0]["x_rack"] = "r12"                 # extension fields are allowed
    parse_snapshot(ok)


def test_wrong_version_and_negative_capacity(example):
    bad = copy.deepcopy(example)
    bad["version"] = 3
    assert "field version" in err(bad) and "versions 1 and 2" in err(bad)
    bad = copy.deepcopy(example)
    bad["nodes"][0]["capacity"] = -1
    assert "nodes[0].capacity" in err(bad) and ">= 0" in err(bad)


def test_references_must_resolve(example):
    bad = copy.deepcopy(example)
    bad["instances"][0]["fragments"][0]["node"] = "nid99999"
    assert "unknown storage node 'nid99999'" in err(bad)
    bad = copy.deepcopy(example)
    bad["instances"][0]["session"] = "nope"
    assert "no session with token 'nope'" in err(bad)


def test_malformed_json_names_the_line(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{\n  "format": "spillway-layout",\n  "version": 1,,\n}')
    with pytest.raises(InputError, match="line 3"):
        load_snapshot(path)


def test_hostnames_outside_the_rule_are_named(trinity):
    with pytest.raises(InputError, match="'bb01'"):
        map_hostnames(trinity, ["bb01"], ["cn1"])
    placed = map_hostnames(trinity, ["bb01", "bb02"], ["cn2", "cn10"], rule="ordered")
    assert placed["bb01"] == trinity.bb_nids[0] and placed["cn2"] == trinity.compute_nids[0]
    assert placed["cn10"] == trinity.compute_nids[1]       # natural order: cn2 before cn10


def test_cli_predict_json(capsys):
    assert cli.main(["predict", str(EXAMPLE_SNAPSHOT), "--machine", "trinity", "--session", "4242",
                     "--op", "read", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["op"] == "read" and out["gbps"] > 0 and out["bottlenecks"]


def test_cli_unknown_session(capsys):
    assert cli.main(["predict", str(EXAMPLE_SNAPSHOT), "--session", "nope"]) == 2
    assert "no session with that token" in capsys.readouterr().err


def test_duplicate_ids_are_named(example):
    bad = copy.deepcopy(example)
    bad["configurations"][1]["id"] = bad["configurations"][0]["id"]
    msg = err(bad)
    assert "configurations[1].id" in msg and "duplicate configuration id 201" in msg
    bad = copy.deepcopy(example)
    bad["instances"][1]["fragments"][2]["id"] = 1001          # also fragment 0 of instance 0
    msg = err(bad)
    assert "instances[1].fragments[2].id" in msg and "instances[0].fragments[0].id" in msg
    bad = copy.deepcopy(example)
    bad["sessions"][2]["id"] = 11
    assert "duplicate session id 11" in err(bad)


def test_type_errors_say_what_to_write(example):
    bad = copy.deepcopy(example)
    bad["nodes"][0]["capacity"] = "3TiB"
    msg = err(bad)
    assert "nodes[0].capacity" in msg and "a whole number" in msg and "byte counts" in msg
    bad = copy.deepcopy(example)
    bad["instances"][0]["fragments"] = []
    assert "instances[0].fragments" in err(bad) and "instance without fragments" in err(bad)


def test_session_without_client_nodes_needs_a_node_count(trinity):
    snap = load_snapshot(EXAMPLE_SNAPSHOT)
    with pytest.raises(InputError, match="--nodes N"):
        predict(trinity, snap, "shared-data", IorSpec(nodes=1))
    r = predict(trinity, snap, "shared-data", IorSpec(nodes=1, ppn=1), nodes=3)
    assert r["jobs"][0]["client_nodes"] == 3 and r["jobs"][0]["client_nodes_from"] == "--nodes"
    # 3 single-stream clients are held by their stream caps, far below 4 servers' bandwidth
    assert r["gbps"] == pytest.approx(3 * trinity.stream_cap["write"])
    assert r["binding"] == "client stream cap"


def test_modelled_nodes_avoid_the_other_jobs_nodes(trinity):
    snap = load_snapshot(EXAMPLE_SNAPSHOT)
    # the first compute nids are free; job 4242 uses nid00124-nid00187
    alone = predict(trinity, snap, "shared-data", IorSpec(nodes=1), nodes=200)
    both = predict(trinity, snap, "shared-data", IorSpec(nodes=1), nodes=200, concurrent=["4242"])
    first = trinity.hostname(trinity.compute_nids[0])
    assert alone["jobs"][0]["modelled_nodes"][:2] == [first, trinity.hostname(trinity.compute_nids[1])]
    modelled = both["jobs"][0]["modelled_nodes"]
    assert len(modelled) == len(set(modelled)) == 200
    assert not set(modelled) & set(snap.sessions["4242"]["client_nodes"])
    assert set(alone["jobs"][0]["modelled_nodes"]) & set(snap.sessions["4242"]["client_nodes"])
    assert both["concurrent"]["4242"] > 0


def test_predict_rejects_zero_streams(trinity):
    snap = load_snapshot(EXAMPLE_SNAPSHOT)
    with pytest.raises(InputError, match="--ppn"):
        predict(trinity, snap, "4242", IorSpec(nodes=1, ppn=0))


def test_loadbalance_instance_predicts_reads_only(example, tmp_path, capsys):
    data = copy.deepcopy(example)
    data["configurations"][0]["access_mode"] = "loadbalance"          # instance 101, session 4242
    path = tmp_path / "lb.json"
    path.write_text(json.dumps(data))
    assert cli.main(["predict", str(path), "--session", "4242", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["op"] == "read" and out["jobs"][0]["access_mode"] == "loadbalance"
    assert cli.main(["predict", str(path), "--session", "4242", "--op", "write"]) == 2
    assert "instance 101 is loadbalance" in capsys.readouterr().err
