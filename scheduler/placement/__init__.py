"""Placement: filter plugins, score plugins and the gang placement search. Pure.

``filters`` answer "does this pod fit this node" with a reason as a value; ``score`` ranks the
nodes that fit; ``search.place`` finds a node for every pod of a request or returns why not.
"""

from scheduler.placement.search import Request, place

__all__ = ["Request", "place"]
