"""Tests of sandboxd.verifiers.code.languages: the languages table, the names a program's
files and classes take, and each toolchain's commands run on this machine."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandboxd.verifiers.code import (
    GO_BUILD_CACHE,
    JAVAC_JVM_FLAGS,
    LANGUAGES,
    NODE_BLOCKING_STDIO,
    compare_stdout,
    expand_env,
    resolve_language,
)

REPO = Path(__file__).resolve().parents[3]
IMAGES = REPO / "images"

pytestmark = pytest.mark.timeout(60)


def test_languages_table() -> None:
    assert set(LANGUAGES) == {"python", "cpp", "c", "java", "javascript", "go", "rust", "bash", "typescript"}
    assert LANGUAGES["python"].compile_argv is None
    assert "-std=gnu++20" in LANGUAGES["cpp"].compile_argv  # type: ignore[operator]
    c_argv = LANGUAGES["c"].compile_argv
    assert c_argv is not None and c_argv[-1] == "-lm"
    assert LANGUAGES["rust"].compile_argv[:1] == ("rustc",)  # type: ignore[index]
    env = expand_env(dict(LANGUAGES["go"].env), "/work/job1")
    # The image's read-only standard library cache, not one per job; GOPATH and HOME are the job's.
    assert env["GOCACHE"] == GO_BUILD_CACHE and env["HOME"] == "/work/job1"
    assert env["GOPATH"].startswith("/work/job1/")
    assert expand_env({"A": "{workdir}/x", "B": "plain"}, "/w") == {"A": "/w/x", "B": "plain"}
    unlimited = {name for name, lang in LANGUAGES.items() if not lang.address_space_limit}
    assert unlimited == {"java", "go", "javascript", "typescript"}
    assert resolve_language("golang") is LANGUAGES["go"]
    with pytest.raises(ValueError):
        resolve_language("fortran")


def test_java_file_and_class_names() -> None:
    plain = "import java.util.*;\nclass Main { public static void main(String[] a) {} }"
    assert resolve_language("java", plain).source_file == "Main.java"
    public = (
        "// class Fake\npublic class Solution {\n  public static class Pair {}\n"
        '  static String s = "class Nope {";\n  public static void main(String[] args) {}\n}\n'
    )
    lang = resolve_language("java", public)
    assert lang.source_file == "Solution.java"
    assert lang.compile_argv == ("javac", *JAVAC_JVM_FLAGS, "-encoding", "UTF-8", "-d", ".", "Solution.java")
    assert lang.run_argv[-1] == "Solution"
    helper_first = "class Helper { int x; }\nclass Runner {\n  public static void main(String[] a) {}\n}\n"
    lang = resolve_language("java", helper_first)
    assert (lang.source_file, lang.run_argv[-1]) == ("Main.java", "Runner")


@pytest.mark.parametrize(
    ("code", "run"),
    [
        # javac -d . puts a packaged class in its package's folder; `java Main` said "wrong name" (red team).
        ("package com.example;\npublic class Main { public static void main(String[] a) {} }", "com.example.Main"),
        ("/* header */\n// more\npackage  a . b ;\nclass Sol { static void main(String[] a) {} }", "a.b.Sol"),
        ("@Deprecated package x;\nclass Main { public static void main(String[] a) {} }", "x.Main"),
        # Not a declaration: in a string, or after the first statement.
        ('class Main { public static void main(String[] a) { String s = "package x;"; } }', "Main"),
        ("import java.util.*;\npackage x;\nclass Main { public static void main(String[] a) {} }", "Main"),
    ],
)
def test_a_java_package_names_the_class_run(code: str, run: str) -> None:
    assert resolve_language("java", code).run_argv[-1] == run


@pytest.mark.parametrize(
    ("code", "source"),
    [
        # Node 18 runs main.js as CommonJS: an import statement was a SyntaxError in a correct program (red team).
        ("import { readFileSync } from 'fs';\nconsole.log(readFileSync(0, 'utf8'));\n", "main.mjs"),
        ("import fs from 'fs';\n", "main.mjs"),
        ("  import * as fs from 'fs';\n", "main.mjs"),
        ("const x = 1;\nexport default x;\n", "main.mjs"),
        ("export function f() {}\n", "main.mjs"),
        # CommonJS, whatever its comments and strings say; import() is a call CommonJS has too.
        ("const fs = require('fs');\n// import fs from 'fs'\nconsole.log('import x from y');\n", "main.js"),
        ("/*\nimport fs from 'fs'\n*/\nconst s = `\nexport default 1\n`;\n", "main.js"),
        ("import('fs').then((fs) => console.log(fs));\n", "main.js"),
        ("importance = 1;\nexports.x = 1;\n", "main.js"),
    ],
)
def test_javascript_with_module_syntax_runs_as_an_es_module(code: str, source: str) -> None:
    lang = resolve_language("javascript", code)
    assert (lang.source_file, lang.run_argv[-1]) == (source, source)


@pytest.mark.parametrize(
    ("code", "source"),
    [
        ("import { readFileSync } from 'fs';\nconst n: number = Number(readFileSync(0, 'utf8'));\n", "main.mts"),
        ("import type { Foo } from './foo';\n", "main.mts"),
        ("export interface Point { x: number }\n", "main.mts"),
        ("export type Pair = [number, number];\n", "main.mts"),
        ("export enum Color { Red }\n", "main.mts"),
        ("interface Point { x: number }\nconst fs = require('fs');\n", "main.ts"),
        ("// export type X = 1\nconst s: string = 'import x from y';\n", "main.ts"),
    ],
)
def test_typescript_is_transformed_once_by_node_and_runs_as_a_module_when_it_is_one(code: str, source: str) -> None:
    output = source.replace(".mts", ".mjs").replace(".ts", ".js")
    for name in ("typescript", "ts"):
        lang = resolve_language(name, code)
        assert (lang.name, lang.source_file, lang.run_argv[-1]) == ("typescript", source, output)
        assert lang.compile_argv is not None and lang.compile_argv[-2:] == (source, output)
        assert lang.run_argv[0] == "node" and "--experimental-transform-types" not in lang.run_argv


@pytest.mark.parametrize(
    ("code", "source", "run"),
    [
        # Modifiers in any order (red-team: the main class was missed, and `java Main` failed).
        ("class Solution { static public void main(String[] a) {} }", "Main.java", "Solution"),
        ("class Helper {}\nclass Solution { final static public void main(String[] a) {} }", "Main.java", "Solution"),
        ("class Solution { public static synchronized void main(String[] a) {} }", "Main.java", "Solution"),
        (
            "class Solution { static void mainly() {} }\nclass Runner { static void main(String[] a) {} }",
            "Main.java",
            "Runner",
        ),
        # A hyphenated modifier (red-team: the public class was missed, and javac refused Main.java).
        (
            "public non-sealed class Sol extends B { public static void main(String[] a) {} }\n"
            "sealed class B permits Sol {}",
            "Sol.java",
            "Sol",
        ),
        # A file name past NAME_MAX (red-team: the agent's write failed, and the job was answered INTERNAL).
        ("public class " + "A" * 251 + " { public static void main(String[] a) {} }", "Main.java", "A" * 251),
        # 251 bytes in UTF-8.
        (
            "public class A" + "\u00e9" * 125 + " { public static void main(String[] a) {} }",
            "Main.java",
            "A" + "\u00e9" * 125,
        ),
        ("public class " + "A" * 250 + " { public static void main(String[] a) {} }", "A" * 250 + ".java", "A" * 250),
    ],
)
def test_java_names_of_valid_and_unwritable_programs(code: str, source: str, run: str) -> None:
    lang = resolve_language("java", code)
    assert (lang.source_file, lang.run_argv[-1]) == (source, run)
    assert lang.compile_argv == ("javac", *JAVAC_JVM_FLAGS, "-encoding", "UTF-8", "-d", ".", source)


def _on_this_machine(argv: tuple[str, ...]) -> list[str]:
    """A run's argv with the langs image's files it names taken from this checkout (images/langs/)."""
    return [str(IMAGES / "langs" / Path(part).name) if part == NODE_BLOCKING_STDIO else part for part in argv]


def test_node_output_is_whole_when_a_program_exits_through_a_pipe(tmp_path: Path) -> None:
    """Node wrote to a full pipe asynchronously: process.exit() kept only the first 64 KiB (red-team)."""
    lang = LANGUAGES["javascript"]
    if shutil.which(lang.run_argv[0]) is None:
        pytest.skip("node is not installed on this machine")
    lines = 200_000
    (tmp_path / lang.source_file).write_text(
        f'let s = ""; for (let i = 0; i < {lines}; i++) s += i + "\\n";\nprocess.stdout.write(s);\nprocess.exit(0);\n'
    )
    out = subprocess.run(_on_this_machine(lang.run_argv), cwd=tmp_path, capture_output=True, timeout=60)
    assert (out.returncode, out.stderr) == (0, b"")
    assert out.stdout == "".join(f"{i}\n" for i in range(lines)).encode()


def test_node_preload_is_a_file_of_the_langs_image() -> None:
    """The JavaScript runs' preload is a file the langs image copies to where the run's command names it."""
    dockerfile = (IMAGES / "langs" / "Dockerfile").read_text()
    assert NODE_BLOCKING_STDIO in LANGUAGES["javascript"].run_argv
    assert (IMAGES / "langs" / Path(NODE_BLOCKING_STDIO).name).is_file()
    assert f"COPY {Path(NODE_BLOCKING_STDIO).name} ${{NODE_BLOCKING_STDIO}}\n" in dockerfile


@pytest.mark.timeout(20)  # the time bound: these took minutes to hours before
def test_java_names_from_degenerate_completions() -> None:
    """Unclosed comments and literals run to the end of the text (or line) instead of being rescanned from every
    opening; "class A" repeated is looked at only up to 1,000 top-level declarations. Each took seconds to
    minutes on the daemon's event loop before (a 96 KB completion froze it for 8.7 s)."""
    assert resolve_language("java", "class A " * 200_000).source_file == "Main.java"
    assert resolve_language("java", "class A " * 400 + "{" + " " * 200_000).source_file == "Main.java"
    tail = "\npublic class Real { public static void main(String[] a) {} }\n"
    assert resolve_language("java", '"unclosed literal\n' * 50_000 + tail).source_file == "Real.java"
    assert resolve_language("java", "/* never closed" + tail).source_file == "Main.java"  # all comment
    assert resolve_language("java", "public " * 30 + "( class A " + tail).source_file == "Real.java"
    # A literal ending in a lone backslash at the end of the text: every opening quote scanned to the end and
    # back (64 KB took 29 s; red team).
    assert resolve_language("java", '"' + '\\"' * 500_000 + "\\").source_file == "Main.java"
    assert resolve_language("java", "'" + "\\'" * 500_000 + "\\").source_file == "Main.java"


_HELLO = {
    "cpp": '#include <iostream>\nint main(){std::string s; std::cin>>s; std::cout<<"hi "<<s<<"\\n";}\n',
    "c": '#include <stdio.h>\n#include <math.h>\nint main(){char s[9]; scanf("%8s",s);'
    ' printf("hi %s\\n", s); return (int)sqrt(0.0);}\n',
    "java": "import java.util.*;\npublic class Prog { public static void main(String[] a) {"
    ' System.out.println("hi " + new Scanner(System.in).next()); } }\n',
    "javascript": "const s = require('fs').readFileSync(0, 'utf8').trim(); console.log('hi ' + s);\n",
    "go": 'package main\nimport "fmt"\nfunc main() { var s string; fmt.Scan(&s); fmt.Println("hi " + s) }\n',
    "rust": "use std::io::Read;\nfn main() { let mut s = String::new();"
    ' std::io::stdin().read_to_string(&mut s).unwrap(); println!("hi {}", s.trim()); }\n',
    "bash": 'read s\necho "hi $s"\n',
    "python": "print('hi', input())\n",
}


@pytest.mark.parametrize("name", sorted(_HELLO))
@pytest.mark.timeout(180)
def test_toolchain_argv_build_and_run(name: str, tmp_path: Path) -> None:
    """The argv and env of each language work with its real toolchain, where installed."""
    lang = resolve_language(name, _HELLO[name])
    tools = [lang.run_argv[0]] + ([lang.compile_argv[0]] if lang.compile_argv else [])
    missing = [tool for tool in tools if not tool.startswith("./") and shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{missing} not installed on this machine")
    (tmp_path / lang.source_file).write_text(_HELLO[name])
    env = {**os.environ, **expand_env(dict(lang.env), str(tmp_path))}
    if lang.compile_argv:
        subprocess.run(lang.compile_argv, cwd=tmp_path, env=env, check=True, timeout=lang.compile_timeout)
    out = subprocess.run(
        _on_this_machine(lang.run_argv), cwd=tmp_path, env=env, input=b"bob\n", capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert compare_stdout(out.stdout, "hi bob")
