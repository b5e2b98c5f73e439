"""Gangs from any source (:mod:`scheduler.gang.sources`): a PodGroup of one of the kinds in
:mod:`scheduler.gang.kinds` (one module each, one table), or the CRD-free ``shoal.dev/gang``
label.

Pure: takes pod requests and PodGroups, returns :class:`~scheduler.model.Gang` values (min, max,
members, priority, age, topology constraints) and :class:`~scheduler.model.InvalidGang` values
whose messages name the offending field. A pod without a gang is a gang of one.
"""

from scheduler.gang.build import GangBuilder, build_gangs
from scheduler.gang.parse import CountError, parse_count

__all__ = ["CountError", "GangBuilder", "build_gangs", "parse_count"]
