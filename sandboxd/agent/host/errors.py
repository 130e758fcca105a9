"""What the controller's own code raises to say a job cannot go on here; answered by `Controller.answer`.

SandboxFull, which the daemon names too, is declared with the messages (agent/messages.py).
"""

from __future__ import annotations


class SandboxDamaged(Exception):
    """The sandbox can no longer run jobs safely (zygote gone, unkillable process)."""


class JobWithdrawn(Exception):
    """The daemon withdrew the job (its caller gave up): no run of it starts any more."""
