"""Attacks through the compile step and the compiled languages (C, C++, Java, JavaScript, Go, Rust).

Red-team pass over the non-Python languages. Each attack must score the
failure value with a model verdict, or, for an innocent job beside it, score
as that job deserves; and the jobs after it must not be harmed.
"""

from __future__ import annotations

import json
import secrets
import textwrap
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from tests.conftest import DaemonProcess
from tests.integration import helpers
from tests.integration.test_code_verifier import (
    HUNT,
    assert_failed,
    assert_ok,
    describe,
    run_batch,
    stdio_job,
)

pytestmark = pytest.mark.docker

SUM_CASES = [("1 2\n", "3\n"), ("10 -4\n", "6\n")]
CPP_SUM = '#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b << "\\n"; }\n'
GO_SUM = 'package main\nimport "fmt"\nfunc main() { var a, b int; fmt.Scan(&a, &b); fmt.Println(a + b) }\n'


@pytest.fixture(scope="module")
def languages(channel: grpc.Channel) -> set[str]:
    return set(pb_grpc.DaemonStub(channel).GetInfo(pb.GetInfoRequest(), timeout=30).languages)


def need(available: set[str], *names: str) -> None:
    missing = [name for name in names if name not in available]
    if missing:
        pytest.skip(f"{', '.join(missing)} not in GetInfo().languages")


# ---------------------------------------------------------------------------
# Compile-time reads and bombs
# ---------------------------------------------------------------------------

# Files the compiler is asked to read at compile time that the job's uid may not read.
COMPILE_TIME_READS = {
    "c-include-agent-environ": ("c", '#include "/proc/1/environ"\nint main(void) { return 0; }\n', "denied"),
    "cpp-include-shadow": ("cpp", "#include </etc/shadow>\nint main() {}\n", "denied"),
    "go-embed-absolute-path": (
        "go",
        'package main\nimport (_ "embed"; "fmt")\n//go:embed /etc/passwd\nvar s string\nfunc main() { fmt.Print(s) }\n',
        "pattern",
    ),
}


@pytest.mark.parametrize("attack", list(COMPILE_TIME_READS))
def test_compile_time_reads_outside_the_job_fail(channel: grpc.Channel, languages: set[str], attack: str) -> None:
    language, code, says = COMPILE_TIME_READS[attack]
    need(languages, language)
    result = helpers.run(channel, stdio_job(code, SUM_CASES, language=language))
    assert_failed(result, pb.STATUS_COMPILE_ERROR)
    assert says in result.code.compile_output.lower(), describe(result)


# A compiler told to read an endless file grows until the sandbox's memory cgroup kills it (the compile step
# has no RLIMIT_AS): a compile error, and the sandbox goes on serving.
COMPILE_MEMORY_BOMBS = {
    "cpp": "#include </dev/zero>\nint main() {}\n",
    "rust": 'static Z: &[u8] = include_bytes!("/dev/zero");\nfn main() { println!("{}", Z.len()); }\n',
}


def test_compile_time_memory_bombs_are_compile_errors(channel: grpc.Channel, languages: set[str]) -> None:
    need(languages, *COMPILE_MEMORY_BOMBS)
    jobs = [
        stdio_job(code, SUM_CASES, language=language, index=i)
        for i, (language, code) in enumerate(COMPILE_MEMORY_BOMBS.items())
    ]
    jobs += [stdio_job(CPP_SUM, SUM_CASES, language="cpp", index=10 + i) for i in range(4)]
    results = run_batch(channel, jobs)
    for i in range(len(COMPILE_MEMORY_BOMBS)):
        assert_failed(results[i], pb.STATUS_COMPILE_ERROR)
        assert results[i].attempts == 1, describe(results[i])
    for i in range(4):
        assert_ok(results[10 + i])


def test_a_compile_with_more_warnings_than_its_output_limit_still_succeeds(channel: grpc.Channel,
                                                                          languages: set[str]) -> None:
    # 1,500 warnings (over 64 KiB of compiler output) made a correct program a compile error: the compiler was
    # killed at its output limit (red team). Its output past the limit is dropped now; errors are still errors.
    need(languages, "c")
    warned = "".join(f"#warning warning number {i} of a program that compiles\n" for i in range(1500))
    sum_c = '#include <stdio.h>\nint main(void) { long a, b; scanf("%ld %ld", &a, &b); printf("%ld\\n", a + b); }\n'
    jobs = [stdio_job(warned + sum_c, SUM_CASES, language="c", index=0),
            stdio_job(warned.replace("#warning", "#error") + sum_c, SUM_CASES, language="c", index=1)]
    results = run_batch(channel, jobs)
    assert_ok(results[0])
    assert_failed(results[1], pb.STATUS_COMPILE_ERROR)
    assert "was dropped" in results[1].code.compile_output, describe(results[1])


# ---------------------------------------------------------------------------
# Leftovers for later jobs (the langs pool; test_code_verifier checks the python pool)
# ---------------------------------------------------------------------------

FOLDERS = '"/var/tmp", "/run/lock", "/dev/shm", "/dev/mqueue", "/tmp", "/tmp/sandboxd", "/run", "/"'
C_LEAVE_FILE = (
    textwrap.dedent("""
    #include <stdio.h>
    #include <sys/stat.h>
    int main(void) {
        char token[128] = "", path[256];
        const char *folders[] = {%s};
        if (scanf("%%127s", token) != 1) return 1;
        for (unsigned i = 0; i < sizeof folders / sizeof *folders; i++) {
            snprintf(path, sizeof path, "%%s/sandboxd-leak-c", folders[i]);
            FILE *f = fopen(path, "w");
            if (!f) continue;
            fputs(token, f);
            fclose(f);
            chmod(path, 0644);
            fprintf(stderr, "left in %%s\\n", folders[i]);
        }
        return 0;
    }
""")
    % FOLDERS
)
C_PICK_UP_FILE = (
    textwrap.dedent("""
    #include <stdio.h>
    int main(void) {
        char token[128], path[256];
        const char *folders[] = {%s};
        for (unsigned i = 0; i < sizeof folders / sizeof *folders; i++) {
            snprintf(path, sizeof path, "%%s/sandboxd-leak-c", folders[i]);
            FILE *f = fopen(path, "r");
            if (f && fscanf(f, "%%127s", token) == 1) { puts(token); return 0; }
        }
        return 0;
    }
""")
    % FOLDERS
)


def test_compiled_program_cannot_leave_files_for_later_jobs(channel: grpc.Channel, languages: set[str]) -> None:
    need(languages, "c")
    token = "zq9_" + secrets.token_hex(16)
    # Several of each, so that every sandbox of the langs pool runs both.
    left = run_batch(channel, [stdio_job(C_LEAVE_FILE, [(token, "")], language="c", index=i) for i in range(8)])
    for result in left.values():
        assert_ok(result)  # the leaving program ran: else the pick-up below would prove nothing
    picked = run_batch(channel, [stdio_job(C_PICK_UP_FILE, [("", token)], language="c", index=i) for i in range(8)])
    for result in picked.values():
        assert_failed(result, pb.STATUS_WRONG_ANSWER)


# ---------------------------------------------------------------------------
# Expected outputs out of reach in the langs pool
# ---------------------------------------------------------------------------


def c_exec_python(python: str) -> str:
    """A C program that becomes a Python one (the langs image has python3): the hunt, run in a langs sandbox."""
    return (
        f'#include <unistd.h>\nint main(void) {{ execlp("python3", "python3", "-c", {json.dumps(python)}, (char *) 0);'
        " return 127; }\n"
    )


def test_hunter_in_a_compiled_program_finds_a_token_it_can_reach(channel: grpc.Channel, languages: set[str]) -> None:
    """Positive control for the next test: the hunt, exec'd from C, finds a token in its own process (its stdin)."""
    need(languages, "c")
    token = "zq9_" + secrets.token_hex(16)
    code = c_exec_python(HUNT + "\nimport sys\n_stdin = sys.stdin.read().split()\nprint(' '.join(hunt(disk=False)))\n")
    assert_ok(helpers.run(channel, stdio_job(code, [(token + "\n", token + "\n")], language="c", timeout=20.0)))


def test_expected_outputs_cannot_be_found_by_compiled_programs_running_together(
    channel: grpc.Channel, languages: set[str]
) -> None:
    """Four hunts at once in the langs pool (two share each sandbox): none finds its own expected output or that
    of the job beside it (disk, other processes' memory, command lines and environments)."""
    need(languages, "c")
    tokens = ["zq9_" + secrets.token_hex(16) for _ in range(4)]
    code = c_exec_python(HUNT + "\nprint(' '.join(hunt()))\n")
    jobs = [
        stdio_job(code, [("x\n", token + "\n")], language="c", timeout=20.0, index=i) for i, token in enumerate(tokens)
    ]
    results = run_batch(channel, jobs)
    for result in results.values():
        assert_failed(result, pb.STATUS_WRONG_ANSWER)
        for token in tokens:
            assert token not in result.tests[0].stdout and token not in result.tests[0].stderr, describe(result)


# ---------------------------------------------------------------------------
# Correct programs scored as failures (found by this pass; fixed in the language table)
# ---------------------------------------------------------------------------

LINES = 200_000
LINES_OUTPUT = "".join(f"{i}\n" for i in range(LINES))
# Node writes to a full pipe asynchronously: process.exit() dropped all but the first 64 KiB.
NODE_EXIT_AFTER_OUTPUT = {
    "write-then-exit": f'let s = ""; for (let i = 0; i < {LINES}; i++) s += i + "\\n";\n'
    "process.stdout.write(s);\nprocess.exit(0);\n",
    "log-then-exit": f"const out = []; for (let i = 0; i < {LINES}; i++) out.push(i);\n"
    'console.log(out.join("\\n"));\nprocess.exit(0);\n',
}


@pytest.mark.parametrize("program", list(NODE_EXIT_AFTER_OUTPUT))
def test_node_output_is_whole_when_the_program_calls_exit(
    channel: grpc.Channel, languages: set[str], program: str
) -> None:
    need(languages, "javascript")
    job = stdio_job(NODE_EXIT_AFTER_OUTPUT[program], [("", LINES_OUTPUT)], language="javascript", timeout=10.0)
    job.limits.output_bytes = 16 << 20
    result = helpers.run(channel, job)
    assert_ok(result)
    assert result.tests[0].stderr == "", describe(result)


def test_node_output_flood_is_still_an_output_limit(channel: grpc.Channel, languages: set[str]) -> None:
    need(languages, "javascript")
    flood = 'const line = "y".repeat(1 << 16) + "\\n";\nfor (;;) process.stdout.write(line);\n'
    result = helpers.run(channel, stdio_job(flood, SUM_CASES, language="javascript", timeout=10.0))
    assert_failed(result, pb.STATUS_OUTPUT_LIMIT)


JAVA_PRINT_LINES = (
    f'StringBuilder sb = new StringBuilder(); for (int i = 0; i < {LINES}; i++) sb.append(i).append("\\n");'
    " System.out.print(sb);"
)
JAVA_VALID = {
    # Modifiers in any order: the main class was not found, and `java Main` failed.
    "static-public-main": f"class Solution {{\n  static public void main(String[] a) {{ {JAVA_PRINT_LINES} }}\n}}\n",
    "final-static-public-main": f"class Helper {{}}\nclass Solution {{\n  final static public void main(String[] a) {{"
    f" {JAVA_PRINT_LINES} }}\n}}\n",
    # A hyphenated modifier: the public class was missed, and the file was named Main.java.
    "public-non-sealed-class": f"public non-sealed class Sol extends Base {{\n  public static void main(String[] a) {{"
    f" {JAVA_PRINT_LINES} }}\n}}\nsealed class Base permits Sol {{}}\n",
}


def test_valid_java_main_classes_are_found(channel: grpc.Channel, languages: set[str]) -> None:
    need(languages, "java")
    jobs = []
    for i, code in enumerate(JAVA_VALID.values()):
        job = stdio_job(code, [("", LINES_OUTPUT)], language="java", timeout=10.0, index=i)
        job.limits.output_bytes = 16 << 20
        jobs.append(job)
    results = run_batch(channel, jobs)
    for i in range(len(JAVA_VALID)):
        assert_ok(results[i])


def test_java_public_class_too_long_for_a_file_name_is_a_compile_error(
    channel: grpc.Channel, languages: set[str]
) -> None:
    """A public class named past NAME_MAX: the agent failed to write its file, and the job was answered
    STATUS_INTERNAL (an infrastructure status, for a model's program). Now javac refuses it in Main.java."""
    need(languages, "java")
    code = "public class " + "A" * 300 + " { public static void main(String[] a) { System.out.println(3); } }\n"
    result = helpers.run(channel, stdio_job(code, SUM_CASES, language="java"))
    assert_failed(result, pb.STATUS_COMPILE_ERROR)
    assert result.attempts == 1, describe(result)


# The right answer, printed by a detached child after the program exited: the run ends at the program's exit.
C_CHILD_PRINTS_AFTER_EXIT = textwrap.dedent("""
    #include <stdio.h>
    #include <unistd.h>
    int main(void) {
        if (fork() == 0) {
            setsid();
            usleep(300000);
            printf("3\\n");
            fflush(stdout);
            _exit(0);
        }
        return 0;
    }
""")


def test_compiled_program_child_printing_after_exit_is_not_counted(channel: grpc.Channel, languages: set[str]) -> None:
    need(languages, "c")
    result = helpers.run(channel, stdio_job(C_CHILD_PRINTS_AFTER_EXIT, SUM_CASES[:1], language="c"))
    assert_failed(result, pb.STATUS_WRONG_ANSWER)


# ---------------------------------------------------------------------------
# The job's memory limit in runtimes without RLIMIT_AS
# ---------------------------------------------------------------------------

MEMORY_LIMIT = 256 << 20
# Each holds 400-768 MiB, well past the job's 256 MiB, then prints the right sum.
MEMORY_HOGS = {
    "c": "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\nint main(void) {\n"
    "  for (int i = 0; i < 768; i++) { char *p = malloc(1 << 20); if (!p) abort(); memset(p, 1, 1 << 20); }\n"
    '  long a, b; if (scanf("%ld %ld", &a, &b) != 2) return 1; printf("%ld\\n", a + b); return 0;\n}\n',
    "go": 'package main\nimport "fmt"\nvar keep [][]byte\nfunc main() {\n'
    "  for i := 0; i < 768; i++ { x := make([]byte, 1<<20); for j := range x { x[j] = 1 }; keep = append(keep, x) }\n"
    "  var a, b int; fmt.Scan(&a, &b); fmt.Println(a + b)\n}\n",
    "java": "import java.util.*;\npublic class Main {\n  static List<byte[]> keep = new ArrayList<>();\n"
    "  public static void main(String[] x) {\n"
    "    for (int i = 0; i < 400; i++) { byte[] y = new byte[1 << 20]; Arrays.fill(y, (byte) 1); keep.add(y); }\n"
    "    Scanner s = new Scanner(System.in); System.out.println(s.nextLong() + s.nextLong());\n  }\n}\n",
    "javascript": "const keep = [];\nfor (let i = 0; i < 768; i++) keep.push(Buffer.alloc(1 << 20, 1));\n"
    'const [a, b] = require("fs").readFileSync(0, "utf8").trim().split(/\\s+/).map(Number);\n'
    "console.log(a + b);\n",
}
@pytest.mark.parametrize(
    "language",
    [
        # C gets RLIMIT_AS; Go, Java and Node reserve far more address space than they use, so
        # their runs are held to the limit by their peak resident memory (RunSpec.peak_memory_limit).
        *(pytest.param(name, id=name) for name in ("c", "go", "java", "javascript")),
    ],
)
def test_memory_limit_holds_in_every_language(channel: grpc.Channel, languages: set[str], language: str) -> None:
    need(languages, language)
    job = stdio_job(MEMORY_HOGS[language], SUM_CASES[:1], language=language, timeout=20.0)
    job.limits.memory_bytes = MEMORY_LIMIT
    result = helpers.run(channel, job)
    assert_failed(result, pb.STATUS_MEMORY_LIMIT, pb.STATUS_RUNTIME_ERROR)


# 96 MiB kept and 1.5 GiB of garbage on top, under the 256 MiB limit: a correct program, if its runtime collects.
CHURNERS = {
    "go": 'package main\nimport "fmt"\nvar keep [][]byte\nvar sink []byte\nfunc main() {\n'
    "  for i := 0; i < 96; i++ { x := make([]byte, 1<<20); for j := range x { x[j] = 1 }; keep = append(keep, x) }\n"
    "  for i := 0; i < 1536; i++ { sink = make([]byte, 1<<20); sink[len(sink)-1] = 1 }\n"
    "  var a, b int; fmt.Scan(&a, &b); fmt.Println(a + b)\n}\n",
    "java": "import java.util.*;\npublic class Main {\n  static List<byte[]> keep = new ArrayList<>();\n"
    "  static byte[] sink;\n  public static void main(String[] x) {\n"
    "    for (int i = 0; i < 96; i++) { byte[] y = new byte[1 << 20]; Arrays.fill(y, (byte) 1); keep.add(y); }\n"
    "    for (int i = 0; i < 1536; i++) { sink = new byte[1 << 20]; sink[sink.length - 1] = 1; }\n"
    "    Scanner s = new Scanner(System.in); System.out.println(s.nextLong() + s.nextLong());\n  }\n}\n",
    "javascript": "const keep = [];\nlet sink;\n"
    "for (let i = 0; i < 96; i++) keep.push(new Array(1 << 17).fill(i));\n"
    "for (let i = 0; i < 1536; i++) { sink = new Array(1 << 17).fill(i); }\n"
    'const [a, b] = require("fs").readFileSync(0, "utf8").trim().split(/\\s+/).map(Number);\n'
    "console.log(a + b);\n",
}


@pytest.mark.parametrize("language", sorted(CHURNERS))
def test_a_program_that_allocates_freely_within_the_limit_passes(
        channel: grpc.Channel, languages: set[str], language: str) -> None:
    """Held to the limit by peak memory, a runtime must be told the limit (heap size, GOMEMLIMIT): left to its
    defaults it sizes its heap from the container or lets garbage pile up, and a correct program is judged over."""
    need(languages, language)
    job = stdio_job(CHURNERS[language], SUM_CASES[:1], language=language, timeout=20.0)
    job.limits.memory_bytes = MEMORY_LIMIT
    assert_ok(helpers.run(channel, job))


# ---------------------------------------------------------------------------
# One langs sandbox of two slots: a job beside another, and a short compile timeout
# ---------------------------------------------------------------------------

COMPILE_TIMEOUT = 10


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    """A daemon with one langs sandbox of two slots (so two jobs share it) and a 10 s compile timeout."""
    daemon = DaemonProcess(
        tmp_path_factory.mktemp("crowded"),
        "crowded",
        extra_env={
            "SANDBOXD_POOL_IMAGES": "langs",
            "SANDBOXD_POOL_MATH": "false",
            "SANDBOXD_SESSIONS_ENABLED": "false",
            "SANDBOXD_POOL_MIN_SIZE": "1",
            "SANDBOXD_POOL_MAX_SIZE": "1",
            "SANDBOXD_POOL_JOBS_PER_SANDBOX": "2",
            "SANDBOXD_LIMITS_COMPILE_TIMEOUT_SECONDS": str(COMPILE_TIMEOUT),
        },
    )
    try:
        try:
            daemon.wait_serving()
        except RuntimeError as exc:
            if "langs" in str(exc):
                pytest.skip(f"no langs image: {exc}")
            raise
        with grpc.insecure_channel(daemon.address) as channel:
            helpers.pool_settled(pb_grpc.PoolStub(channel), "langs", 1)
            yield channel
    finally:
        assert daemon.stop() == 0


# Twenty constant expressions, each stopped by GCC's operation limit after a second or two.
CONSTEXPR_BOMB = (
    "#include <cstdio>\n"
    + "".join(
        f"constexpr long f{k}() {{ long s = {k}; for (long i = 0; i < 2000; i++) for (long j = 0; j < 2000; j++)"
        f" s += i ^ j; return s; }}\nconstexpr long v{k} = f{k}();\n"
        for k in range(20)
    )
    + 'int main() { printf("%ld\\n", v0 + v19); }\n'
)


def test_a_compile_that_runs_past_the_compile_timeout_is_a_compile_error(crowded: grpc.Channel) -> None:
    result = helpers.run(crowded, stdio_job(CONSTEXPR_BOMB, SUM_CASES, language="cpp", timeout=1.0))
    assert_failed(result, pb.STATUS_COMPILE_ERROR)
    assert result.code.compile_output.startswith(f"compilation timed out after {COMPILE_TIMEOUT} s"), describe(result)
    assert result.attempts == 1, describe(result)
    # The compiler is gone: the sandbox serves the next jobs (both slots).
    for result in run_batch(
        crowded, [stdio_job(CPP_SUM, SUM_CASES, language="cpp", index=i) for i in range(2)]
    ).values():
        assert_ok(result)


# Fills the sandbox's shared /tmp (64 MiB files, under RLIMIT_FSIZE) until ENOSPC, gives back the number of bytes
# read from stdin, says how much it holds and when (its own clock), and holds it for 8 s.
FILL_TMP = textwrap.dedent("""
    #include <fcntl.h>
    #include <stdio.h>
    #include <string.h>
    #include <sys/time.h>
    #include <unistd.h>
    static char chunk[1 << 20];
    int main(void) {
        long total = 0, leave = 0;
        int fd = -1;
        if (scanf("%ld", &leave) != 1) return 1;
        memset(chunk, 'x', sizeof chunk);
        for (int f = 0, full = 0; f < 64 && !full; f++) {
            char name[32];
            snprintf(name, sizeof name, "fill%d", f);
            if (fd >= 0) close(fd);
            fd = open(name, O_WRONLY | O_CREAT, 0600);
            if (fd < 0) return 2;
            for (long size = 0; size < (60L << 20) && !full; ) {
                ssize_t n = write(fd, chunk, sizeof chunk);
                if (n <= 0) full = 1; else { total += n; size += n; }
            }
        }
        off_t end = lseek(fd, 0, SEEK_END);
        if (ftruncate(fd, end > leave ? end - leave : 0) != 0) return 3;
        struct timeval now;
        gettimeofday(&now, NULL);
        printf("%ld %ld.%06ld\\n", total - leave, (long) now.tv_sec, (long) now.tv_usec);
        fflush(stdout);
        sleep(8);
        return 0;
    }
""")


# "full": the innocent job's source cannot be written; "room-for-the-source": it can (256 KiB are left), and its
# compiler is the one that meets ENOSPC (Go's build dir and binary take about 2 MiB).
@pytest.mark.parametrize("leave", [pytest.param(0, id="full"), pytest.param(256 << 10, id="room-for-the-source")])
def test_a_job_filling_tmp_does_not_fail_a_correct_compile_beside_it(crowded: grpc.Channel, leave: int) -> None:
    """/tmp is one tmpfs that the sandbox's concurrent jobs share. A job that filled it made a correct program beside
    it fail to compile (STATUS_COMPILE_ERROR, "no space left on device"), or its source fail to be written
    (STATUS_INTERNAL): found by this pass. Such a job must be scored as it deserves, retried where it was crowded
    out (the fix, SandboxFull in the agent's controller, is not the code verifier's)."""
    filled: list[pb.JobResult] = []
    filler = threading.Thread(
        target=lambda: filled.append(
            helpers.run(crowded, helpers.execute(FILL_TMP, language="c", stdin=str(leave).encode(), timeout=15.0))
        )
    )
    filler.start()
    try:
        time.sleep(2.0)  # its compile and fill take about a second: checked below from the filler's own clock
        submitted = time.time()
        innocent = helpers.run(crowded, stdio_job(GO_SUM, SUM_CASES, language="go"))
    finally:
        filler.join(120)
    (fill,) = filled
    assert fill.status == pb.STATUS_OK, fill
    held, filled_at = fill.execute.stdout.split()
    assert int(held) > 400 << 20 and float(filled_at) < submitted, ("the filler was not done first", fill)
    assert_ok(innocent)


def test_every_language_the_daemon_lists_is_served(channel: grpc.Channel) -> None:
    # On the session's daemon, with the default 30 s compile limit: under `crowded`'s 10 s (there for the
    # compile-timeout test) a first rustc in a cold sandbox of the loaded 2-core CI machine ran past it.
    listed = pb_grpc.DaemonStub(channel).GetInfo(pb.GetInfoRequest(), timeout=30).languages
    hello = {
        "python": "print(3)",
        "bash": "echo 3",
        "javascript": "console.log(3)",
        "typescript": "const three: number = 3;\nconsole.log(three);",
        "c": '#include <stdio.h>\nint main(void) { puts("3"); return 0; }',
        "cpp": '#include <iostream>\nint main() { std::cout << 3 << "\\n"; }',
        "go": 'package main\nimport "fmt"\nfunc main() { fmt.Println(3) }',
        "rust": 'fn main() { println!("3"); }',
        "java": "public class Main { public static void main(String[] a) { System.out.println(3); } }",
    }
    refused = {}
    for language in listed:
        try:
            result = helpers.run(channel, stdio_job(hello[language], [("", "3\n")], language=language))
        except grpc.RpcError as exc:
            refused[language] = f"{exc.code().name}: {exc.details()}"
        else:
            assert_ok(result)
    assert not refused, refused
