"""What the notebook draws: the cluster dashboard, cell progress, the status card.

Kernel side only; widgets never reach Ray. They draw what the agent sends through the
session (metrics deltas, cell events) and what the kernel already knows.
"""

from ._dashboard import Dashboard

__all__ = ["Dashboard"]
