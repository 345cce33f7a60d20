"""Cache instances: write-behind to the PFS, read-through, and `predict` on a cache instance."""

import copy
import json
from pathlib import Path

import pytest

from bbsim import cli
from bbsim.cache import FLUSH_SIZE, FLUSHES_PER_SERVER, write_back_start, write_burst
from bbsim.errors import InputError
from bbsim.ior import IorSpec
from bbsim.layout import load_snapshot, parse_snapshot, predict
from bbsim.machine import load_machine
from bbsim.units import GB

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CACHE_SNAPSHOT = EXAMPLES / "spillway-layout-trinity-cache.json"
MiB, GiB, TiB = 1024**2, 1024**3, 1024**4


def with_pfs(write=10.0, read=12.0, **more):
    settings = [("pfs.bandwidth.write", write), ("pfs.bandwidth.read", read)]
    settings += [(f"pfs.{k}", v) for k, v in more.items()]
    return load_machine("trinity", tuple(settings))


@pytest.fixture(scope="module")
def snap():
    return load_snapshot(CACHE_SNAPSHOT)


# -- the burst's fluid model, alone -------------------------------------------------------------

def test_burst_under_the_watermark_goes_at_burst_buffer_speed():
    cap = 1 * TiB
    r = write_burst(100 * GiB, b=50.0, during=5.0, throttled=5.0, alone=8.0, capacity=cap, start=0.45 * cap)
    assert r["job_gbps"] == pytest.approx(50.0)
    assert r["throttled_bytes"] == 0 and r["flushed_during_job"] == 0
    assert r["dirty_at_job_end"] == 100 * GiB
    assert r["drain_seconds_after_job"] == pytest.approx(100 * GiB / GB / 8.0)


def test_burst_far_larger_than_the_cache_goes_at_the_drain_rate():
    cap = 1 * TiB
    r = write_burst(1000 * TiB, b=50.0, during=5.0, throttled=4.0, alone=8.0, capacity=cap, start=0.45 * cap)
    assert r["job_gbps"] == pytest.approx(4.0, rel=2e-3)
    assert r["dirty_at_job_end"] == cap
    assert r["drain_seconds_after_job"] == pytest.approx(cap / GB / 8.0)


def test_burst_phases_add_up():
    cap, b, during = 1000 * GB, 40.0, 10.0
    start = 450 * GB
    r = write_burst(3000 * GB, b=b, during=during, throttled=6.0, alone=12.0, capacity=cap, start=start)
    # 450 GB at 40 GB/s; then dirty grows at 30 GB/s from 450 to 1000 GB: 18.33 s, 733.3 GB written;
    # the remaining 1816.7 GB at 6 GB/s
    t_fill = (cap - start) / GB / (b - during)
    bb = start + t_fill * b * GB
    assert r["bb_speed_bytes"] == pytest.approx(bb)
    assert r["job_seconds"] == pytest.approx(start / GB / b + t_fill + (3000 * GB - bb) / GB / 6.0)
    assert r["dirty_at_job_end"] == cap


def test_a_drain_as_fast_as_the_job_never_fills_the_cache():
    cap = 100 * GB
    r = write_burst(10 * TiB, b=20.0, during=25.0, throttled=5.0, alone=30.0, capacity=cap, start=45 * GB)
    assert r["job_gbps"] == pytest.approx(20.0) and r["throttled_bytes"] == 0
    assert r["dirty_at_job_end"] == 45 * GB


def test_write_back_starts_at_the_watermark_or_at_the_files_threshold():
    cap = 1000 * GiB
    # 2048 files of 256 MiB on 8 servers: 32 MiB per file per server, under 64 MiB: the watermark
    assert write_back_start(cap, 45, 64 * MiB, 2048, 256 * MiB, 8) == pytest.approx(min(0.45 * cap, 2048 * 256 * MiB))
    # files of 8 GiB: each server keeps 64 MiB of each dirty, 2048 x 8 x 64 MiB = 1 TiB > 45%
    assert write_back_start(cap, 45, 64 * MiB, 2048, 8 * GiB, 8) == pytest.approx(0.45 * cap)
    # few large files: write-back starts long before the watermark
    assert write_back_start(cap, 45, 64 * MiB, 4, 100 * GiB, 8) == pytest.approx(4 * 8 * 64 * MiB)


# -- predict on a cache instance ----------------------------------------------------------------

def test_predict_small_burst_is_burst_buffer_speed(snap):
    m = with_pfs()
    r = predict(m, snap, "5151", IorSpec(nodes=1, block_size=64 * MiB))
    c = r["cache"]
    assert c["bytes_written"] == 64 * 32 * 64 * MiB < 0.45 * c["capacity"]
    assert c["job_gbps"] == pytest.approx(r["gbps"]) and c["bb_gbps"] == r["gbps"]
    assert c["throttled_bytes"] == 0 and c["dirty_at_job_end"] == c["bytes_written"]
    assert c["drain_seconds_after_job"] == pytest.approx(c["bytes_written"] / GB / c["drain_gbps"])


def test_predict_huge_burst_is_the_drain_rate(snap):
    m = with_pfs(write=5.0)
    r = predict(m, snap, "5151", IorSpec(nodes=1, block_size=1 * TiB))
    c = r["cache"]
    # a 5 GB/s PFS is the slowest part of the drain; a full cache throttles the job to it
    assert c["pfs"]["gbps"] == 5.0 and c["pfs"]["limited_by"] == "PFS bandwidth"
    assert c["drain_gbps"] == pytest.approx(5.0) and c["drain_limited_by"] == "PFS path"
    assert c["throttled_gbps"] == pytest.approx(5.0)
    assert c["job_gbps"] == pytest.approx(5.0, rel=0.01) and c["job_gbps"] < r["gbps"]
    assert c["dirty_at_job_end"] == c["capacity"]
    assert c["drain_seconds_after_job"] == pytest.approx(c["capacity"] / GB / 5.0)


def test_drain_of_a_fast_pfs_is_the_servers_read_bandwidth(snap):
    m = with_pfs(write=1e4, read=1e4, reach="direct", server_link=100.0)
    c = predict(m, snap, "5151", IorSpec(nodes=1, block_size=1 * GiB))["cache"]
    k = len(snap.instances[104]["fragments"])
    per_server = m.profile.peak["read"] * m.profile.size_factor(FLUSH_SIZE) * float(m.profile.stream_factor(FLUSHES_PER_SERVER))
    assert c["drain_gbps"] == pytest.approx(k * per_server) and c["drain_limited_by"] == "server bandwidth"
    assert c["pfs"]["limited_by"] == "servers' PFS links" and c["pfs"]["gbps"] == pytest.approx(k * 100.0)
    assert c["pfs"]["reach"] == "direct"


def test_lnet_routers_limit_the_pfs_path(snap):
    m = with_pfs(write=1e4, read=1e4, lnet_node_bandwidth=0.01)
    c = predict(m, snap, "5151", IorSpec(nodes=1))["cache"]
    assert c["pfs"]["limited_by"] == "LNET routers"
    assert c["pfs"]["gbps"] == pytest.approx(len(m.lnet_nids) * 0.01)


def test_throttled_rate_shares_the_servers_between_job_and_drain(snap):
    # a fast PFS: the servers' time is what the job's writes and the drain's reads share
    m = with_pfs(write=1e4, read=1e4, reach="direct", server_link=100.0)
    r = predict(m, snap, "5151", IorSpec(nodes=1, block_size=1 * TiB))
    c = r["cache"]
    assert c["throttled_limited_by"] in ("server bandwidth", "burst buffer")
    assert c["throttled_gbps"] <= min(r["gbps"], c["drain_gbps"]) + 1e-9
    assert c["job_gbps"] == pytest.approx(c["throttled_gbps"], rel=0.05)


def test_reads_warm_at_burst_buffer_speed_cold_through_the_pfs(snap):
    slow = predict(with_pfs(read=3.0), snap, "5151", IorSpec(nodes=1, op="read"))
    assert slow["cache"]["warm_gbps"] == slow["gbps"]
    assert slow["cache"]["cold_gbps"] == pytest.approx(3.0) and slow["cache"]["cold_limited_by"] == "PFS path"
    fast = predict(with_pfs(read=1e4), snap, "5151", IorSpec(nodes=1, op="read"))
    assert fast["cache"]["cold_gbps"] <= fast["gbps"] + 1e-9


def test_two_cache_instances_split_the_pfs(snap, tmp_path):
    data = json.loads(CACHE_SNAPSHOT.read_text())
    data["configurations"][1].update(type="cache")        # instance 102 of session 4243
    path = tmp_path / "two.json"
    path.write_text(json.dumps(data))
    r = predict(with_pfs(write=8.0), load_snapshot(path), "5151", IorSpec(nodes=1), concurrent=["4243"])
    assert r["cache"]["pfs"]["gbps"] == pytest.approx(4.0) and r["cache"]["pfs"]["cache_instances_sharing"] == 2


def test_scratch_instances_have_no_cache_block(snap):
    assert "cache" not in predict(with_pfs(), snap, "4242", IorSpec(nodes=1))


def test_a_machine_without_a_pfs_is_named(snap, trinity):
    with pytest.raises(InputError, match="describes no PFS") as info:
        predict(trinity, snap, "5151", IorSpec(nodes=1))
    assert "--set pfs.bandwidth.write" in str(info.value)


def test_settings_missing_from_the_snapshot_take_spillways_defaults(tmp_path):
    data = json.loads(CACHE_SNAPSHOT.read_text())
    del data["configurations"][3]["cache"]
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(data))
    c = predict(with_pfs(), load_snapshot(path), "5151", IorSpec(nodes=1))["cache"]
    assert (c["high_watermark"], c["low_watermark"], c["modified_threshold"]) == (45, 20, 1024 * MiB)
    assert "pfs_directory" not in c


def test_the_settings_of_the_snapshot_are_used(snap):
    c = predict(with_pfs(), snap, "5151", IorSpec(nodes=1))["cache"]
    assert c["pfs_directory"] == "/lustre/scratch/me/run42" and c["pfs"]["reach"] == "lnet"
    data = json.loads(CACHE_SNAPSHOT.read_text())
    data["configurations"][3]["cache"]["high_watermark"] = 10
    c10 = predict(with_pfs(), parse_snapshot(data), "5151", IorSpec(nodes=1, block_size=256 * MiB))["cache"]
    assert c10["write_back_starts_at"] == pytest.approx(0.10 * c10["capacity"])


# -- the snapshot's version 2 and the machine's pfs section -------------------------------------

def err(data):
    with pytest.raises(InputError) as info:
        parse_snapshot(data, "snap.json")
    return str(info.value)


def test_cache_settings_need_version_2():
    data = json.loads(CACHE_SNAPSHOT.read_text())
    parse_snapshot(copy.deepcopy(data))
    v1 = copy.deepcopy(data)
    v1["version"] = 1
    assert "configurations[3]" in err(v1) and '"version": 2' in err(v1)
    v1 = copy.deepcopy(v1)
    del v1["configurations"][3]["cache"]
    parse_snapshot(v1)                                      # a cache type alone is version 1
    bad = copy.deepcopy(data)
    bad["configurations"][3]["cache"]["high_watermark"] = 120
    assert "high_watermark" in err(bad) and "<= 100" in err(bad)
    bad = copy.deepcopy(data)
    bad["version"] = 3
    assert "unsupported format version 3" in err(bad)


def test_pfs_section_errors(tmp_path):
    with pytest.raises(InputError, match="reach"):
        load_machine("trinity", (("pfs.bandwidth.write", 1.0), ("pfs.bandwidth.read", 1.0), ("pfs.reach", "nfs")))
    with pytest.raises(InputError, match="bandwidth"):
        load_machine("trinity", (("pfs.share", 0.5),))
    with pytest.raises(InputError, match="no lnet|has none"):
        load_machine("trinity", (("pfs.bandwidth.write", 1.0), ("pfs.bandwidth.read", 1.0),
                                 ("placement.rules", [{"kind": "burst_buffer", "chassis": [0], "slots": [1],
                                                       "ports": [0]}])))


def test_cli_prints_the_cache_figures(capsys):
    assert cli.main(["predict", str(CACHE_SNAPSHOT), "--session", "5151", "--op", "write",
                     "--set", "pfs.bandwidth.write=5", "--set", "pfs.bandwidth.read=6", "--block", "1TiB"]) == 0
    out = capsys.readouterr().out
    assert "cache instance of" in out and "throttled to 5.0 GB/s" in out and "to drain after the job" in out
    assert cli.main(["predict", str(CACHE_SNAPSHOT), "--session", "5151", "--op", "read", "--json",
                     "--set", "pfs.bandwidth.write=5", "--set", "pfs.bandwidth.read=6"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cache"]["cold_gbps"] == pytest.approx(6.0)
