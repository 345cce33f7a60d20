"""Shipped machine files and the errors a planner gets from a broken one."""

from pathlib import Path

import pytest
import yaml

from bbsim import cli
from bbsim.errors import InputError
from bbsim.machine import load_machine, shipped_dir, shipped_machines


def numeric_leaves(data, path=()):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from numeric_leaves(v, path + (str(k),))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from numeric_leaves(v, path + (str(i),))
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        yield ".".join(path)


def covered(path, sources):
    parts = path.split(".")
    return any(".".join(parts[:i]) in sources for i in range(1, len(parts) + 1))


@pytest.mark.parametrize("name", ["trinity", "cori-p1", "cori", "cray-264"])
def test_shipped_machine_loads_and_every_number_has_a_source(name):
    m = load_machine(name)
    data = yaml.safe_load((shipped_dir() / f"{name}.yaml").read_text())
    missing = [p for p in numeric_leaves(data) if p != "bbsim_machine" and not covered(p, data["sources"])]
    assert not missing, f"numbers without a source: {missing}"
    assert m.counts()["compute"] > 0


def test_profile_numbers_have_sources():
    data = yaml.safe_load((shipped_dir() / "profiles" / "datawarp-2xP3608.yaml").read_text())
    missing = [p for p in numeric_leaves(data) if p != "bbsim_server_profile" and not covered(p, data["sources"])]
    assert not missing


def test_the_four_machines_are_shipped():
    assert set(shipped_machines()) >= {"trinity", "cori-p1", "cori", "cray-264"}


TRINITY = (shipped_dir() / "trinity.yaml").read_text()


def line_of(text):
    """1-based line number of the first line of trinity.yaml equal to `text`."""
    return TRINITY.splitlines().index(text) + 1


def broken(tmp_path, old, new):
    assert old in TRINITY
    path = tmp_path / "machine.yaml"
    path.write_text(TRINITY.replace(old, new, 1))
    return path


def error_of(path):
    with pytest.raises(InputError) as info:
        load_machine(str(path))
    return str(info.value)


def test_malformed_yaml_names_the_line(tmp_path):
    path = broken(tmp_path, "  groups: 57\n", "  groups: [57\n")
    msg = error_of(path)
    assert str(path) in msg and "line" in msg and "malformed YAML" in msg and "fix:" in msg


def test_misspelt_key_is_named_with_its_line(tmp_path):
    path = broken(tmp_path, "  groups: 57", "  grups: 57")
    msg = error_of(path)
    assert "missing field 'topology.groups'" in msg and f"'grups' (line {line_of('  groups: 57')})" in msg
    assert "rename 'grups' to 'groups'" in msg


def test_unknown_key_is_rejected(tmp_path):
    path = broken(tmp_path, "  groups: 57\n", "  groups: 57\n  colour: blue\n")
    msg = error_of(path)
    assert "unknown key 'colour'" in msg and f"line {line_of('  groups: 57') + 1}" in msg and "known keys here" in msg
    path = broken(tmp_path, "  valiant_fraction: 0.0", "  valiant_fractoin: 0.0")
    assert "did you mean 'valiant_fraction'" in error_of(path)


def test_missing_field(tmp_path):
    path = broken(tmp_path, "  green: 5.25\n", "")
    msg = error_of(path)
    assert "missing field 'bandwidth.green'" in msg and "add 'green:'" in msg


def test_negative_bandwidth(tmp_path):
    path = broken(tmp_path, "  global: 18.75", "  global: -18.75")
    msg = error_of(path)
    assert "must be positive" in msg and "bandwidth.global" in msg and "line" in msg


def test_placement_index_out_of_range(tmp_path):
    path = broken(tmp_path, "slots: [0-4], ports: [0, 1]}", "slots: [1-20], ports: [0, 1]}")
    assert "out of range" in error_of(path)


def test_not_enough_global_ports(tmp_path):
    path = broken(tmp_path, "  global_ports_per_router: 3", "  global_ports_per_router: 0")
    assert "at least 1" in error_of(path)
    path = broken(tmp_path, "  global_links_per_pair: 2", "  global_links_per_pair: 6")
    assert "needs 336 global ports" in error_of(path) and "has 288" in error_of(path)


def test_duplicate_key(tmp_path):
    path = broken(tmp_path, "  groups: 57\n", "  groups: 57\n  groups: 58\n")
    assert "duplicate key 'groups'" in error_of(path)


def test_source_for_a_key_that_does_not_exist(tmp_path):
    path = broken(tmp_path, "  topology.groups:", "  topology.grups:")
    assert "not a key of this file" in error_of(path)


def test_unknown_server_profile(tmp_path):
    path = broken(tmp_path, "profile: datawarp-2xP3608", "profile: no-such-profile")
    assert "no server profile named 'no-such-profile'" in error_of(path)


def test_cli_reports_bad_machine_without_traceback(tmp_path, capsys):
    path = broken(tmp_path, "  green: 5.25", "  green: -1")
    assert cli.main(["machine", str(path)]) == 2
    err = capsys.readouterr().err
    assert "must be positive" in err and "Traceback" not in err


def test_missing_machine_file(capsys):
    assert cli.main(["ior", "--machine", "no/such/file.yaml", "--nodes", "1"]) == 2
    assert "no such" in capsys.readouterr().err


def test_set_override_changes_the_machine():
    m = load_machine("trinity", (("routing.valiant_fraction", 0.25),))
    assert m.valiant_fraction == 0.25
    with pytest.raises(InputError):
        load_machine("trinity", (("routing.valiant_fraction", 2),))


def test_the_documented_example_machine_loads(tmp_path):
    """The annotated machine in docs/bbsim.md is a working file (planners copy it)."""
    import re
    doc = Path(__file__).resolve().parents[2] / "docs" / "bbsim.md"
    if not doc.exists():
        pytest.skip("docs/bbsim.md is not beside this checkout")
    block = re.search(r"```yaml\n(bbsim_machine: 1.*?)```", doc.read_text(), re.S).group(1)
    path = tmp_path / "lab-xc.yaml"
    path.write_text(block)
    m = load_machine(str(path))
    counts = m.counts()
    assert counts["burst_buffer"] == 4 * 4 * 2 and counts["lnet"] == 2
    assert m.hostname_map == {"bbserver01": 4, "bbserver02": 5}
    assert m.pfs.bandwidth == {"write": 100.0, "read": 120.0} and m.pfs.reach == "lnet"


@pytest.mark.parametrize("path", sorted(shipped_dir().glob("*.yaml")) + sorted((shipped_dir() / "profiles").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_cited_reference_is_defined_in_the_file(path):
    """Sources cite references as [tag ...]; each tag is defined in the file's header as
    '# [tag] authors, title (where)'. 'seed NNN' points into shared/seeds directly."""
    import re
    text = path.read_text()
    defined = set(re.findall(r"^# \[([a-z][a-z0-9-]*)\] \S", text, re.M))
    data = yaml.safe_load(text)
    cited = set()
    for citation in data["sources"].values():
        cited |= set(re.findall(r"\[([a-z][a-z0-9-]*)\b", str(citation)))
        cited |= set(re.findall(r"\b(peng2018|cray-dw|kaust|nersc-[a-z]+)\b", str(citation)))
    cited.discard("seed")
    assert cited, "the sources cite nothing"
    assert cited <= defined, f"cited but not defined in the header: {sorted(cited - defined)}"
