"""The Python test harness: a candidate's program and the dataset's tests in two processes, joined by a socket.

- ``wire``: the codec, values carried by value as tagged JSON in length-prefixed frames;
- ``remote``: everything else carried by reference, both ways (the candidate's endpoint and the judge's);
- ``harness``: the runner, the candidate's side (``serve_candidate``) and the judge's (``run_tests``, with its
  emulation of pytest's fixtures and xunit setups).
"""
