"""Copy-on-write cost of a forked job under several Python interpreters, side by side.

Why: most of a code sandbox's CPU per HumanEval job is the kernel's (page-table
copies, copy-on-write faults, tear-down at exit), and the faults come from the
job writing pages it shares with the zygote, reference counts first. Python
3.12's immortal objects were a candidate cure; this measures it instead of
assuming it. Each interpreter runs the same parent (20,000 small dicts, frozen
by `gc.freeze()` where there is one), which forks N children that compile and
run one HumanEval problem and its tests; minor faults and CPU per child come
from `RUSAGE_CHILDREN`. Fault counts compare across builds; CPU only between
builds made alike (pyenv's are not Debian's).

    python bench/fork_faults.py /usr/bin/python3.11 ~/.pyenv/versions/3.13.0/bin/python3
"""

from __future__ import annotations

import json
import subprocess
import sys

FORKS = 300

PARENT = r'''
import gc, json, os, resource, sys, typing  # typing: the job imports it, as a zygote would hold it
JOB = """
from typing import List
def has_close_elements(numbers: List[float], threshold: float) -> bool:
    for idx, elem in enumerate(numbers):
        for idx2, elem2 in enumerate(numbers):
            if idx != idx2 and abs(elem - elem2) < threshold:
                return True
    return False
def check(candidate):
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.8) == False
check(has_close_elements)
"""
heap = [dict(a=i, b=str(i)) for i in range(20000)]
gc.collect()
if hasattr(gc, "freeze"):
    gc.freeze()
forks = int(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_CHILDREN)
for _ in range(forks):
    pid = os.fork()
    if pid == 0:
        exec(compile(JOB, "<job>", "exec"), {"__name__": "__main__"})
        json.dumps({"passed": True})
        os._exit(0)
    os.waitpid(pid, 0)
after = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
print(json.dumps({"version": sys.version.split()[0], "faults": (after.ru_minflt - before.ru_minflt) / forks,
                  "cpu_ms": cpu * 1000 / forks}))
'''


def main(interpreters: list[str]) -> None:
    if not interpreters:
        sys.exit(__doc__)
    print(f"{'interpreter':<48} {'version':>8} {'faults/child':>13} {'CPU ms/child':>13}")
    for interpreter in interpreters:
        # Two rounds each: the machine's speed drifts; the fault counts should not.
        for _ in range(2):
            done = subprocess.run([interpreter, "-I", "-c", PARENT, str(FORKS)], capture_output=True, text=True,
                                  check=True)
            row = json.loads(done.stdout)
            print(f"{interpreter:<48} {row['version']:>8} {row['faults']:>13.0f} {row['cpu_ms']:>13.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
