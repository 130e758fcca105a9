"""What the controller's own code raises to say a job cannot go on here; answered by `Controller.answer`."""

from __future__ import annotations


class SandboxDamaged(Exception):
    """The sandbox can no longer run jobs safely (zygote gone, unkillable process)."""


class SandboxFull(Exception):
    """A job ran out of /tmp that other runs of the sandbox hold (tmpspace.NEIGHBOURS_SHARE), or
    found no pid left to fork a worker with (the sandbox's pids limit): not its fault.

    The daemon runs it on another sandbox, and gives this one no job until
    its space is back.
    """


class JobWithdrawn(Exception):
    """The daemon withdrew the job (its caller gave up): no run of it starts any more."""
