"""Weighted max-min fair rates by progressive filling. Pure: arrays in, arrays out, no I/O.

A *class* is a set of identical flows (same route fractions, same per-flow cap): `multiplicity`
flows, each getting the same rate. Class c puts `usage[c, r]` units of load on resource r per
unit of rate of each of its flows; resource r holds `capacity[r]`. Every flow also has its own
cap `flow_cap[c]` (np.inf for none).

Progressive filling: all unfrozen flows grow together, flow c at speed `weight[c]`; when a
resource fills, every class using it freezes (that resource is its bottleneck); when a flow
reaches its cap, its class freezes (bound by its own cap). One iteration per distinct
bottleneck level, each O(nnz of usage).

`usage` can be any matrix (dense or scipy.sparse) or a `Factored` product kept in two parts,
which is how full machines stay small: classes x route units, route units x resources.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

BOUND_BY_CAP = -1        # binding value: the flow's own cap
NOT_RUN = -2             # binding value: class had no flows


class Factored:
    """usage = left @ right, never multiplied out."""

    def __init__(self, left, right):
        self.left = sp.csr_matrix(left)
        self.right = sp.csr_matrix(right)
        self._right_csc = None
        self.shape = (self.left.shape[0], self.right.shape[1])

    def loads(self, x):
        """Resource loads for per-class totals x: usage.T @ x."""
        return self.right.T @ (self.left.T @ x)

    def touches(self, resource_mask):
        """Per class: does it put load on any resource in the mask?"""
        return (self.left @ (self.right @ resource_mask.astype(float))) > 0

    def block(self, rows, cols):
        """Dense usage[rows][:, cols]."""
        if self._right_csc is None:
            self._right_csc = self.right.tocsc()
        return np.asarray((self.left[rows] @ self._right_csc[:, cols]).todense())

    def select(self, rows):
        """The usage of a subset of classes."""
        return Factored(self.left[rows], self.right)


class Plain(Factored):
    """An ordinary matrix in the Factored interface."""

    def __init__(self, matrix):
        matrix = sp.csr_matrix(matrix)
        super().__init__(sp.identity(matrix.shape[0], format="csr"), matrix)


@dataclass
class Allocation:
    rate: np.ndarray        # GB/s per flow of each class
    binding: np.ndarray     # per class: resource index, BOUND_BY_CAP or NOT_RUN
    load: np.ndarray        # per resource
    iterations: int


def max_min_fair(capacity, usage, flow_cap, multiplicity, weight=None, *, rtol=1e-9) -> Allocation:
    """Weighted max-min fair rate of every class's flows (see module docstring)."""
    if not isinstance(usage, Factored):
        usage = Plain(usage)
    capacity = np.asarray(capacity, dtype=float)
    flow_cap = np.asarray(flow_cap, dtype=float)
    multiplicity = np.asarray(multiplicity, dtype=float)
    n = usage.shape[0]
    weight = np.ones(n) if weight is None else np.asarray(weight, dtype=float)
    if (capacity < 0).any() or (multiplicity < 0).any() or (weight <= 0).any() or (flow_cap < 0).any():
        raise ValueError("capacities, multiplicities and caps must be >= 0 and weights > 0")

    rate = np.zeros(n)
    binding = np.full(n, NOT_RUN, dtype=np.int64)
    active = multiplicity > 0
    residual = capacity.copy()
    floor = rtol * np.maximum(capacity, 1e-300)
    iterations = 0
    while active.any():
        iterations += 1
        growth = usage.loads(np.where(active, multiplicity * weight, 0.0))
        used = np.flatnonzero(growth > 0)
        dt_resource, tightest = np.inf, -1
        if used.size:
            ratios = np.maximum(residual[used], 0.0) / growth[used]
            tightest = int(used[np.argmin(ratios)])
            dt_resource = float(ratios.min())
        act = np.flatnonzero(active)
        headroom = (flow_cap[act] - rate[act]) / weight[act]
        dt_cap = float(headroom.min())
        dt = min(dt_resource, dt_cap)
        if not np.isfinite(dt):
            raise ValueError("unbounded rate: a class uses no resource and has no cap")
        dt = max(dt, 0.0)
        rate[act] += weight[act] * dt
        residual -= growth * dt

        saturated = np.zeros(len(capacity), dtype=bool)
        saturated[used] = residual[used] <= floor[used]
        if dt_resource <= dt_cap and tightest >= 0:
            saturated[tightest] = True
        capped = np.zeros(n, dtype=bool)
        capped[act] = rate[act] >= flow_cap[act] * (1 - rtol)
        if dt_cap <= dt_resource:
            capped[act[np.argmin(headroom)]] = True
        hit = active & ~capped & usage.touches(saturated) if saturated.any() else np.zeros(n, bool)

        binding[capped] = BOUND_BY_CAP
        if hit.any():
            rows, cols = np.flatnonzero(hit), np.flatnonzero(saturated)
            share = usage.block(rows, cols) / np.maximum(capacity[cols], 1e-300)
            binding[rows] = cols[np.argmax(share, axis=1)]
        active &= ~(capped | hit)
        np.maximum(residual, 0.0, out=residual)

    load = usage.loads(multiplicity * rate)
    return Allocation(rate=rate, binding=binding, load=load, iterations=iterations)
