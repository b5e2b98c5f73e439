"""A real Slurm cluster for tests: Debian's slurmctld, slurmd and munge, each node its own host.

``install`` puts Debian's Slurm packages on the machine (``make slurm``; a no-op when they are
there); ``cluster`` starts a controller and N ``slurmd`` nodes, each in a network namespace of its
own on a bridge this package creates, and stops them leaving no process, namespace or interface
behind (``python -m slurmcluster up | down``). A development tool beside the product, like
``devcluster``: nothing that ships imports it. docs/slurm.md, "The test cluster", says more.
"""
