"""The in-sandbox agent: PID 1 of every sandbox container.

Three kinds of process live in a sandbox:

- the controller (PID 1, root without most capabilities): talks to the
  daemon over the control socket, owns every deadline, compares outputs;
- the zygote (root): imported and warmed the verifier libraries before the
  snapshot, and only ever forks workers; it never sees job data, so a
  worker forked from it cannot find expected outputs, not even in freed heap;
- workers: one per run, each under a uid of its own, with rlimits, in a
  private work dir. Candidate code only ever runs in a worker.

This package runs inside the image with the image's Python (3.11+), so it
uses the standard library and the verifier modules only.
"""
