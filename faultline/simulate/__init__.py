"""`faultline simulate`: a synthetic GPU fleet with injected faults, in the layout of docs/fleet.md.

Deterministic by seed; streams its output cluster by cluster and day by day.
"""

from faultline.simulate.jobs import SimConfig
from faultline.simulate.sim import Fleet, export_cases, simulate

__all__ = ["SimConfig", "Fleet", "simulate", "export_cases"]
