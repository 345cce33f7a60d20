"""bbsim: flow-level burst-buffer performance model of dragonfly machines (Spillway)."""

__version__ = "0.1.0"
