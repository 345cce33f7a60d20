"""Max-min solver against answers worked out by hand."""

import numpy as np
import pytest
import scipy.sparse as sp

from bbsim.solver import BOUND_BY_CAP, Factored, max_min_fair

INF = np.inf


def solve(usage, capacity, caps=None, mult=None, weight=None):
    usage = np.asarray(usage, float)
    n = usage.shape[0]
    return max_min_fair(capacity, usage, np.full(n, INF) if caps is None else caps,
                        np.ones(n) if mult is None else mult, weight)


def test_one_bottleneck_is_shared_equally():
    a = solve([[1], [1], [1]], [9.0])
    assert np.allclose(a.rate, 3.0)
    assert (a.binding == 0).all()


def test_parking_lot():
    # one long flow over links 0..2, one short flow on each link; capacities 1, 1, 3
    usage = [[1, 1, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1]]
    a = solve(usage, [1.0, 1.0, 3.0])
    assert np.allclose(a.rate, [0.5, 0.5, 0.5, 2.5])
    assert a.iterations == 2


def test_caps_below_fair_share_free_capacity_for_others():
    a = solve([[1], [1], [1]], [9.0], caps=np.array([1.0, INF, INF]))
    assert np.allclose(a.rate, [1.0, 4.0, 4.0])
    assert a.binding[0] == BOUND_BY_CAP and a.binding[1] == 0


def test_weights_split_in_proportion():
    a = solve([[1], [1]], [3.0], weight=np.array([1.0, 2.0]))
    assert np.allclose(a.rate, [1.0, 2.0])


def test_usage_coefficients_scale_consumption():
    # flow 0 uses 2 units of the link per unit of rate: it gets the same rate, twice the load
    a = solve([[2], [1]], [3.0])
    assert np.allclose(a.rate, [1.0, 1.0])
    assert np.isclose(a.load[0], 3.0)


def test_class_aggregation_equals_unrolled_flows():
    rng = np.random.default_rng(7)
    classes, resources = 12, 9
    usage = sp.random(classes, resources, density=0.4, random_state=3, data_rvs=lambda n: rng.uniform(0.2, 1.0, n))
    usage = usage.tocsr() + sp.eye(classes, resources, format="csr") * 0.1   # every class uses something
    mult = rng.integers(1, 6, classes).astype(float)
    caps = np.where(rng.random(classes) < 0.3, rng.uniform(0.05, 0.5, classes), INF)
    weight = rng.uniform(0.5, 2.0, classes)
    cap = rng.uniform(1.0, 5.0, resources)
    grouped = max_min_fair(cap, usage, caps, mult, weight)
    rows = np.repeat(np.arange(classes), mult.astype(int))
    unrolled = max_min_fair(cap, usage[rows], caps[rows], np.ones(len(rows)), weight[rows])
    assert np.allclose(unrolled.rate, grouped.rate[rows])
    assert np.allclose(unrolled.load, grouped.load)


def test_factored_usage_equals_multiplied_out():
    rng = np.random.default_rng(1)
    left = sp.random(10, 4, density=0.5, random_state=1).tocsr() + sp.eye(10, 4, format="csr")
    right = sp.random(4, 6, density=0.6, random_state=2).tocsr() + sp.eye(4, 6, format="csr")
    cap = rng.uniform(1, 3, 6)
    caps = np.full(10, INF)
    a = max_min_fair(cap, Factored(left, right), caps, np.ones(10))
    b = max_min_fair(cap, (left @ right).toarray(), caps, np.ones(10))
    assert np.allclose(a.rate, b.rate)


def test_split_path_conservation():
    # one flow split 0.3 / 0.7 over two parallel paths of two links each, into one sink link
    usage = [[0.3, 0.3, 0.7, 0.7, 1.0]]
    a = solve(usage, [10, 10, 10, 10, 4.0])
    assert np.isclose(a.rate[0], 4.0)
    assert np.isclose(a.load[0] + a.load[2], a.rate[0])      # the cut between the paths carries it all
    # the 0.7 path binds when it is the weak one
    b = solve(usage, [10, 10, 1.4, 10, 100])
    assert np.isclose(b.rate[0], 2.0) and b.binding[0] == 2


def test_unbounded_flow_is_an_error():
    with pytest.raises(ValueError):
        solve([[0.0]], [1.0])


def test_zero_multiplicity_classes_get_nothing():
    a = solve([[1], [1]], [4.0], mult=np.array([0.0, 1.0]))
    assert a.rate[0] == 0 and np.isclose(a.rate[1], 4.0)
