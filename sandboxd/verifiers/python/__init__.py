"""The Python test harness: a candidate's program and the dataset's tests in two processes, joined by a socket.

- ``wire``: the codec, values carried by value as tagged JSON in length-prefixed frames;
- ``remote``: everything else carried by reference, both ways (the candidate's endpoint and the judge's);
- ``candidate``: the candidate's side (``serve_candidate``, the implicit imports);
- ``pytest_emulation``: pytest's way of running a module's tests (marks, fixtures, xunit setups, unittest cases),
  for the judge;
- ``judge``: the judge's side (``run_tests``, ``top_level_names``);
- ``warmup``: the zygote's warm-up (``warm``), the candidate's side of small jobs against a judge;
- ``harness``: the public face, re-exporting what the agent, the daemon and the tests use of the four above.
"""
