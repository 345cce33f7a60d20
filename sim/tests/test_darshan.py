"""Darshan ingestion on the real logs shipped inside the darshan wheel."""

import numpy as np
import pytest

from bbsim import cli
from bbsim.darshan_ingest import read_darshan
from bbsim.errors import InputError

WITH_POSIX = ["sample-badost.darshan", "example.darshan", "sample-goodost.darshan", "dxt.darshan",
              "ior_hdf5_example.darshan", "sample-dxt-simple.darshan",
              "shane_macsio_id29959_5-22-32552-7035573431850780836_1590156158.darshan",
              "pq_app_readAB_writeC_id71326_7-31-5658-2037904274838284930_55623.darshan"]


def posix_counters(path):
    """Independent read of the POSIX counters with PyDarshan."""
    import darshan
    report = darshan.DarshanReport(str(path), read_all=False)
    report.mod_read_all_records("POSIX")
    frames = report.records["POSIX"].to_df()
    return frames["counters"], frames["fcounters"]


@pytest.mark.parametrize("name", WITH_POSIX)
def test_bytes_are_conserved(wheel_logs, name):
    counters, _ = posix_counters(wheel_logs[name])
    job = read_darshan(wheel_logs[name], ranks_per_node=24)
    got = job.phase_bytes()
    assert got["write"] == pytest.approx(float(counters["POSIX_BYTES_WRITTEN"].sum()), rel=1e-12)
    assert got["read"] == pytest.approx(float(counters["POSIX_BYTES_READ"].sum()), rel=1e-12)
    assert sum(p.bytes for p in job.phases) > 0


@pytest.mark.parametrize("name", WITH_POSIX)
def test_phase_windows_lie_within_the_logged_timestamps(wheel_logs, name):
    _, f = posix_counters(wheel_logs[name])
    starts = np.concatenate([f[c].to_numpy() for c in ("POSIX_F_OPEN_START_TIMESTAMP", "POSIX_F_READ_START_TIMESTAMP",
                                                       "POSIX_F_WRITE_START_TIMESTAMP")])
    ends = np.concatenate([f[c].to_numpy() for c in ("POSIX_F_CLOSE_END_TIMESTAMP", "POSIX_F_READ_END_TIMESTAMP",
                                                     "POSIX_F_WRITE_END_TIMESTAMP")])
    first, last = starts[starts > 0].min(initial=0.0), ends.max()
    job = read_darshan(wheel_logs[name], ranks_per_node=24)
    for p in job.phases:
        assert first - 1e-6 <= p.start <= p.end <= last + 1e-6


def test_file_per_process_log_has_one_phase_per_node(wheel_logs):
    job = read_darshan(wheel_logs["sample-badost.darshan"], ranks_per_node=24)
    assert job.nprocs == 2048 and job.nodes == 86
    assert len(job.phases) == 86
    assert sum(p.streams for p in job.phases) == 2048
    # the dominant access size of this IOR run is 4 MiB
    assert np.median([p.transfer_size for p in job.phases]) == 4 * 1024 * 1024


def test_shared_record_is_divided_over_the_ranks(wheel_logs):
    job = read_darshan(wheel_logs["example.darshan"], ranks_per_node=32)
    assert job.nodes == 64 and all(p.shared for p in job.phases)
    sizes = {round(p.bytes) for p in job.phases}
    assert len(sizes) == 1                          # 2048 ranks on 64 full nodes: equal shares


def test_dxt_segments_give_the_timing(wheel_logs):
    dxt = read_darshan(wheel_logs["ior_hdf5_example.darshan"], ranks_per_node=1)
    plain = read_darshan(wheel_logs["ior_hdf5_example.darshan"], ranks_per_node=1, use_dxt=False)
    assert dxt.used_dxt and not plain.used_dxt
    assert len(dxt.phases) > len(plain.phases)
    assert dxt.phase_bytes() == pytest.approx(plain.phase_bytes())


def test_path_prefix_filters_files(wheel_logs):
    job = read_darshan(wheel_logs["dxt.darshan"], ranks_per_node=1, path_prefix="/no/such/dir")
    assert job.phases == [] and job.posix_bytes == {"write": 0.0, "read": 0.0}


def test_missing_log():
    with pytest.raises(InputError, match="no such Darshan log"):
        read_darshan("/no/such.darshan", 4)


def test_text_file_is_not_a_log(tmp_path):
    bad = tmp_path / "notes.darshan"
    bad.write_text("not a darshan log\n")
    with pytest.raises(InputError) as info:
        read_darshan(bad, 4)
    assert str(bad) in str(info.value) and "not a readable Darshan log" in str(info.value)


@pytest.mark.parametrize("keep", [2000, 50000])
def test_truncated_log_is_a_clear_error(wheel_logs, tmp_path, keep):
    data = wheel_logs["sample-badost.darshan"].read_bytes()
    bad = tmp_path / "cut.darshan"
    bad.write_bytes(data[:keep])
    with pytest.raises(InputError) as info:
        read_darshan(bad, 24)
    assert str(bad) in str(info.value) and "fix:" in str(info.value)


def test_log_without_posix_records(wheel_logs):
    with pytest.raises(InputError, match="no POSIX records"):
        read_darshan(wheel_logs["noposix.darshan"], 4)


def test_cli_bad_log_exits_2_without_traceback(tmp_path, capsys):
    bad = tmp_path / "x.darshan"
    bad.write_bytes(b"\0" * 64)
    assert cli.main(["replay", str(bad), "--no-matrix"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err


@pytest.mark.parametrize("name", WITH_POSIX)
def test_access_sizes_account_for_every_byte(wheel_logs, name):
    job = read_darshan(wheel_logs[name], ranks_per_node=24)
    for p in job.phases:
        assert sum(b for _, b in p.sizes) == pytest.approx(p.bytes, rel=1e-12)
        assert all(size > 0 for size, _ in p.sizes)
        assert [b for _, b in p.sizes] == sorted((b for _, b in p.sizes), reverse=True)


def test_access_counters_give_the_sizes(wheel_logs):
    # VPIC: 16,384 writes of 128 MiB carry the data; 12 small HDF5 metadata writes
    job = read_darshan(wheel_logs["example.darshan"], ranks_per_node=32, use_dxt=False)
    sizes = dict(job.phases[0].sizes)
    assert job.phases[0].access_size == 128 * 1024 * 1024
    assert {272.0, 544.0, 328.0} <= set(sizes)
    total = sum(sizes.values())
    assert sizes[128 * 1024 * 1024] / total == pytest.approx(16384 * 2**27 / 2199023259968)
    assert job.access_sizes()["write"][0] == (128 * 1024 * 1024, pytest.approx(1.0, abs=1e-8))


def test_dxt_segment_lengths_give_the_sizes(wheel_logs):
    job = read_darshan(wheel_logs["ior_hdf5_example.darshan"], ranks_per_node=1)
    assert job.used_dxt
    writes = [p for p in job.phases if p.op == "write"]
    assert all(p.access_size == 262144 for p in writes if p.bytes > 1e6)


def test_a_record_that_reads_and_writes_counts_at_its_mean_size(wheel_logs):
    # MACSio's data file both reads and writes: its access counters mix the two ops
    name = [n for n in WITH_POSIX if n.startswith("shane_macsio")][0]
    job = read_darshan(wheel_logs[name], ranks_per_node=16, use_dxt=False)
    write = max((p for p in job.phases if p.op == "write"), key=lambda p: p.bytes)
    assert write.access_size == pytest.approx(54579416 / 7699)
