"""Trace-driven simulation of the scheduling core on a virtual clock (no API server).

The live loop's step (:func:`scheduler.step.step`: the reclaim and torn ledgers, the decisions
in turn, a batch per snapshot) and cache run unchanged on a simulated cluster described by a
file, a job trace and, optionally, a spot trace. Policies differ only in the placement configuration
they hand to that same core, so a comparison measures placement decisions, not two
implementations. See :mod:`scheduler.simulate.engine` for the
model of time, work, checkpoints and revocations.
"""
