"""Red-team math jobs through the real daemon: reward hacks score the failure value, and answers
built to be slow are answered within their deadline without harming the jobs after or beside them."""

from __future__ import annotations

import concurrent.futures
import json
import math
import subprocess
import time

import grpc
import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from tests.conftest import DaemonProcess
from tests.integration import helpers
from tests.integration.test_runtime import containers, instance_of

pytestmark = pytest.mark.docker

FAILED = (pb.STATUS_WRONG_ANSWER, pb.STATUS_TIMEOUT, pb.STATUS_MEMORY_LIMIT, pb.STATUS_NO_ANSWER)


@pytest.mark.parametrize(
    ("completion", "truth"),
    [
        # Fixed: two percentages were compared crosswise (1% against 100% = 1).
        ("so the answer is \\boxed{1\\%}", "100\\%"),
        ("so the answer is \\boxed{0.5\\%}", "50\\%"),
        # Fixed: a hedged "2 or 5" was rewritten to the decimal 2.5.
        ("so the answer is \\boxed{2 or 5}", "2.5"),
        ("The answer is 2 or 5", "2.5"),
        # Fixed: a float matched an integer beyond its precision (the symbolic fallback ran at 53 bits).
        ("so the answer is \\boxed{1.0 \\times 10^{20}}", "100000000000000000001"),
        ("so the answer is \\boxed{1.0e20}", "100000000000000000001"),
        # Fixed: near an integer the tolerance was absolute 1e-6, for exact irrationals and near 0 too.
        ("so the answer is \\boxed{2 + \\frac{\\pi}{10^{7}}}", "2"),
        ("so the answer is \\boxed{0}", "0.0000005"),
        # Fixed: a ground truth with several boxes was cut to its last one.
        ("so the answer is \\boxed{3}", "The roots are $\\boxed{2}$ and $\\boxed{3}$."),
        # Already defended: hedges with several answers at once.
        ("\\boxed{1} \\boxed{2}", "1"),
        ("\\boxed{1 \\text{ or } 2}", "2"),
        ("\\boxed{1, 2, 3, \\ldots, 100}", "2"),
        ("\\boxed{x \\le 10^9}", "2"),
        ("\\boxed{\\pm 2}", "2"),
        ("\\boxed{[0, 10]}", "2"),
        ("\\boxed{\\phantom{2} 3}", "2"),
        ("\\boxed{\u00b2}", "2"),  # superscript 2 (a full-width 2 is a decimal digit: #51)
        # Fixed (#51): a percentage read two ways, marks the parser drops, "or" in another language, a list of boxes.
        ("so the answer is \\boxed{5\\%}", "5"),
        ("so the answer is \\boxed{2^+}", "2"),
        ("Die Antwort ist 2 oder 3.", "3"),
        ("\\boxed{3} and \\boxed{2}", "2"),
        ("\\boxed{0.99999}", "1"),
        ("\\boxed{10^{20}+1}", "10^{20}"),
        ("\\boxed{\\frac{0}{0}}", "\\frac{0}{0}"),
        ("\\boxed{zoo}", "2"),
    ],
)
def test_reward_hacks_get_the_failure_value(channel: grpc.Channel, completion: str, truth: str) -> None:
    result = helpers.run(channel, helpers.math(completion, truth))
    assert result.status == pb.STATUS_WRONG_ANSWER, (result.status, result.message, result.math.parsed_answer)
    assert result.reward == -1.0


@pytest.mark.parametrize(
    ("completion", "truth"),
    [
        ("so the answer is \\boxed{50\\%}", "0.5"),
        ("so the answer is \\boxed{2,5}", "2.5"),
        ("so the answer is \\boxed{2 or 5}", "2, 5"),
        ("so the answer is \\boxed{1e20}", "100000000000000000000"),
        ("so the answer is \\boxed{2, 3}", "The roots are $\\boxed{2}$ and $\\boxed{3}$."),
    ],
)
def test_right_answers_near_the_fixes_still_score(channel: grpc.Channel, completion: str, truth: str) -> None:
    result = helpers.run(channel, helpers.math(completion, truth))
    assert result.status == pb.STATUS_OK, result.message
    assert result.reward == 1.0


# Answers that sympy or the parser would work on far past any deadline (measured in-process: each
# ran more than 15 s), or that are large; the sandbox must answer them at the deadline.
SLOW_ANSWERS = [
    "\\boxed{(x+1)^{100000}}",
    "\\boxed{(1+\\sqrt{2})^{100000}}",  # (big integers: a MemoryError under a small address space)
    "\\boxed{(x+y+z)^{300}}",
    "\\boxed{\\binom{10^{9}}{5 \\cdot 10^{8}}}",
    "\\boxed{\\Gamma(10^{9})}",
    "\\boxed{e^{e^{e^{e^{e}}}}}",
    "\\boxed{\\sum_{k=1}^{10^{6}} \\frac{1}{k}}",
    "\\boxed{" + ",".join(f"x+{i}" for i in range(500)) + "}",
    "\\boxed{1} " * 50_000,
    "x" * ((1 << 20) - 20) + " \\boxed{1}",  # just under the request limit (1 MiB)
]


@pytest.mark.parametrize("completion", SLOW_ANSWERS, ids=range(len(SLOW_ANSWERS)))
def test_slow_answers_end_at_the_deadline_with_a_finite_failure(channel: grpc.Channel, completion: str) -> None:
    job = helpers.math(completion, "2", timeout=3.0)
    job.failure_value = -0.5
    result = helpers.run(channel, job, timeout=120)
    assert result.status in FAILED, (result.status, result.message)
    assert result.reward == -0.5 and math.isfinite(result.reward)
    assert result.timings.run_seconds < 30
    # The next job, on whichever math server is left or started, is scored right.
    assert helpers.run(channel, helpers.math("\\boxed{7}", "7")).status == pb.STATUS_OK
    assert helpers.run(channel, helpers.math("\\boxed{8}", "7")).status == pb.STATUS_WRONG_ANSWER


def test_slow_answers_do_not_mis_score_the_jobs_beside_them(channel: grpc.Channel) -> None:
    slow = [helpers.math(completion, "2", timeout=3.0) for completion in SLOW_ANSWERS[:4]]
    quick = [helpers.math(f"\\boxed{{{n}}}", str(n if n % 2 else n + 1)) for n in range(40)]
    jobs = slow + quick
    for index, job in enumerate(jobs):
        job.index = index
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        # A slow batch and a single job at the same time, on the same pool.
        single = threads.submit(helpers.run, channel, helpers.math("\\boxed{\\frac{1}{2}}", "0.5"), 120)
        results = list(pb_grpc.JobsStub(channel).RunBatch(pb.RunBatchRequest(jobs=jobs), timeout=300))
        assert single.result().status == pb.STATUS_OK, single.result().message
    assert sorted(r.index for r in results) == list(range(len(jobs)))
    for result in results:
        assert math.isfinite(result.reward)
        if result.index < len(slow):
            assert result.status in FAILED and result.reward == -1.0, (result.index, result.message)
        else:
            n = result.index - len(slow)
            expected = pb.STATUS_OK if n % 2 else pb.STATUS_WRONG_ANSWER
            assert result.status == expected, (n, result.status, result.message)
            assert result.reward == (1.0 if n % 2 else -1.0)


# Run in a math sandbox by `docker exec`: the resident memory of each math server (named by prctl).
MATH_SERVERS_RSS = """
import json, os
found = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if open(f"/proc/{pid}/comm").read().strip() == "sandboxd-math":
            found[pid] = int(open(f"/proc/{pid}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass
print(json.dumps(found))
"""


def math_servers_rss(daemon: DaemonProcess) -> dict[str, int]:
    """Resident bytes of every math server in the daemon's math sandboxes, by container and pid."""
    found: dict[str, int] = {}
    for container in containers(f"io.sandboxd.instance={instance_of(daemon)}"):
        listed = subprocess.run(["docker", "exec", container, "python3", "-c", MATH_SERVERS_RSS],
                                capture_output=True, text=True, timeout=60)
        if listed.returncode == 0 and listed.stdout.strip():
            found.update({f"{container[:12]}/{pid}": rss for pid, rss in json.loads(listed.stdout).items()})
    return found


def test_an_answer_that_exhausts_the_memory_leaves_no_server_holding_it(daemon: DaemonProcess,
                                                                        channel: grpc.Channel) -> None:
    """Under the default 512 MiB the big integers of (1+sqrt 2)^100000 end in a MemoryError in a
    couple of seconds, which Math-Verify's handlers turn into "not equal". The server that ran it
    kept about 500 MB of freed heap for up to 500 more jobs, and a few such servers filled the
    sandbox's memory. It is replaced after its answer now."""
    result = helpers.run(channel, helpers.math("\\boxed{(1+\\sqrt{2})^{100000}}", "2", timeout=30.0), timeout=120)
    assert result.status in (pb.STATUS_WRONG_ANSWER, pb.STATUS_MEMORY_LIMIT), (result.status, result.message)
    assert result.reward == -1.0
    assert result.status != pb.STATUS_TIMEOUT, "the answer should have run out of memory well before 30 s"
    # The old server is killed in the background, after the answer.
    deadline = time.monotonic() + 30
    while (big := {key: rss for key, rss in math_servers_rss(daemon).items() if rss > 256 << 20}):
        assert time.monotonic() < deadline, f"math servers still hold their memory: {big}"
        time.sleep(0.5)
    assert helpers.run(channel, helpers.math("\\boxed{7}", "7")).status == pb.STATUS_OK
