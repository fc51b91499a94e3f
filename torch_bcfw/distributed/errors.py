"""The exception every failure of the distributed layer raises."""
from __future__ import annotations

__all__ = ["DistributedError"]


class DistributedError(RuntimeError):
    """A distributed run cannot go on: the process group is missing or misconfigured, the ranks disagree (other
    datasets, a diverged ``w``), or a collective failed because a peer rank died or did not reach it within the
    group's timeout.  The message names the operation and the rank that raised it."""
