"""The in-sandbox agent: PID 1 of every sandbox container.

Three kinds of process live in a sandbox:

- the controller (PID 1, root without most capabilities): talks to the
  daemon over the control socket, owns every deadline, compares outputs;
- the zygote (root): imported and warmed the verifier libraries before the
  snapshot, and only ever forks workers; it never sees job data, so a
  worker forked from it cannot find expected outputs, not even in freed heap;
- workers: one per run, each under a uid of its own, with rlimits, in a
  private work dir. Candidate code only ever runs in a worker.

The package is split by process. ``host/`` is the controller's (PID 1,
asyncio): the ops, the job kinds, runs and their clean-up, the zygote's
client, the resident servers' pools, /tmp and memory accounting.
``forked/`` is what runs in the processes the controller starts: the
zygote, the worker a zygote forks, and what a worker becomes (a judge, a
math server, a session's REPL) or the reward-model scorer; none of it
imports asyncio or anything of ``host/``, and ``host/`` imports nothing of
``forked/`` (its processes are reached over sockets). What both sides
share sits at the top: ``protocol`` (frames, the zygote's messages, the
constants of the contract) and ``landlock``. ``__main__`` forks the zygote
before it imports the host side.

This package runs inside the image with the image's Python (3.11+), so it
uses the standard library and the verifier modules only.
"""
