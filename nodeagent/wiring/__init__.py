"""The agent's wiring: its rooms, one job each, and the program that builds and runs them.

``agent`` builds and wires the rooms, ``cli`` is the program (``python -m nodeagent``),
``health`` serves ``/healthz``, ``/readyz`` and ``/status``, ``reconcile`` is the reconcile
loop; the rooms it drives are ``intake``, ``board``, ``pods``, ``channels``, ``executor``,
``drain``, ``topology``, ``reports``, ``guard`` and ``clock``. See docs/architecture.md.
"""
