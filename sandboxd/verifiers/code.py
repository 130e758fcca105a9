"""Code verifier: the pure parts, shared by the daemon and the sandbox agent.

Everything here is stdlib-only and side-effect free, because it is imported both
by the daemon (request validation) and inside the sandbox image (Debian
bookworm, Python 3.11, no third-party packages):

- :func:`extract_code` pulls the program out of a completion;
- :data:`LANGUAGES` / :func:`resolve_language` say how to build and run it;
- :func:`normalize_tests` turns the API's ``CodeTests`` or a dataset row given
  verbatim into one :class:`TestPlan`;
- :func:`compare_stdout` / :func:`compare_values` are the checkers, run in a
  trusted process, never in the candidate's;
- :func:`score` turns a pass count into a reward.
"""

from __future__ import annotations

import ast
import bisect
import cmath
import dataclasses
import functools
import json
import math
import re
import string
import types
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = [
    "CPP_FLAGS",
    "GO_BUILD_CACHE",
    "GO_ENV",
    "JAVAC_CLASS_ARCHIVE",
    "JAVAC_JIT_FLAGS",
    "JAVAC_JVM_FLAGS",
    "LANGUAGES",
    "FunctionCase",
    "Language",
    "StdioCase",
    "TestPlan",
    "assemble",
    "assemble_program",
    "compare_stdout",
    "compare_values",
    "expand_env",
    "extract_code",
    "normalize_tests",
    "program_assembly",
    "resolve_language",
    "score",
]

# ---------------------------------------------------------------------------
# Languages
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Language:
    """How to build and run a program in one language inside a job's work dir.

    All paths are relative to the job's private work dir, which is also the
    working directory of both commands. ``env`` values may contain the
    placeholder ``{workdir}`` (see :func:`expand_env`); they are added to the
    worker's environment for the compile step and the runs. Interpreted
    languages have no ``compile_argv`` and a ``compile_timeout`` of 0.
    ``address_space_limit`` is False for runtimes that reserve far more
    address space than they use (the JVM, Go, V8): their runs get no
    RLIMIT_AS.
    """

    name: str
    source_file: str
    compile_argv: tuple[str, ...] | None
    run_argv: tuple[str, ...]
    compile_timeout: float = 30.0
    aliases: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    address_space_limit: bool = True


def expand_env(env: Mapping[str, str], workdir: str) -> dict[str, str]:
    """``env`` with the placeholder ``{workdir}`` in its values replaced by ``workdir``."""
    return {key: value.replace("{workdir}", workdir) for key, value in env.items()}


# A CommonJS file of the langs image, preloaded with --require: the same code given as an
# ES module data: URL (--import) cost each run 10-12 ms more (node 18 starting its ES module
# loader; 93-96 against 81 ms a run of a 3-line program, one CPU).
NODE_BLOCKING_STDIO = "/usr/local/lib/sandboxd/node-blocking-stdio.cjs"

NODE_STACK_KIB = 65_536
# A TypeScript job's compile step: node's own type transform (node:module's
# stripTypeScriptTypes in transform mode, what --experimental-transform-types
# runs), from the source file to the JavaScript file its runs execute.
TS_TRANSFORM = (
    'const fs = require("node:fs"), [source, output] = process.argv.slice(1);'
    'fs.writeFileSync(output, require("node:module").stripTypeScriptTypes('
    'fs.readFileSync(source, "utf8"), { mode: "transform" }));'
)

# A C++ job's compile options. The langs image precompiles <bits/stdc++.h> with exactly
# these (its build argument CPP_FLAGS, from sandboxd.images.toolchain_build_args); GCC uses
# that only for a compile with the same options.
CPP_FLAGS = ("-O2", "-std=gnu++20")
# javac's JVM, not the program's: a compile is a short run. Its JIT stops at the quick
# compiler (C1), one GC thread, and its classes come mapped from a class-data archive
# that the langs image dumps from a javac run with the same JIT and GC options (its build
# arguments JAVAC_JIT_FLAGS and JAVAC_CLASS_ARCHIVE; a JVM without the file starts as
# before, silently). For a 15-line program, 0.75-0.88 -> 0.34-0.37 CPU seconds
# (0.46-0.56 -> 0.25-0.27 s); for 400 methods, 3.0 -> 1.2 (1.6 -> 0.8 s).
JAVAC_CLASS_ARCHIVE = "/usr/local/lib/sandboxd/javac.jsa"
JAVAC_JIT_FLAGS = ("-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC")
JAVAC_JVM_FLAGS = (*JAVAC_JIT_FLAGS, f"-J-XX:SharedArchiveFile={JAVAC_CLASS_ARCHIVE}")
# The environment of a Go job's build and runs. The langs image builds its standard
# library cache with exactly these settings (its build argument GO_ENV): they are part of
# the cache's keys.
GO_BUILD_CACHE = "/usr/local/lib/sandboxd/go-build"
GO_ENV: tuple[tuple[str, str], ...] = (
    ("GOCACHE", GO_BUILD_CACHE),
    ("GOPATH", "{workdir}/.gopath"),
    ("HOME", "{workdir}"),
    ("GO111MODULE", "off"),
    ("GOTOOLCHAIN", "local"),
    ("CGO_ENABLED", "0"),
)

LANGUAGES: dict[str, Language] = {
    lang.name: lang
    for lang in (
        # -B: the work dir is private and thrown away, writing .pyc is wasted I/O.
        Language("python", "main.py", None, ("python3", "-B", "main.py"), 0.0, ("py", "python3", "py3")),
        # The GNU dialects, as judges compile (Codeforces' "GNU G++20"): under strict
        # c11, strdup() was implicitly declared and its pointer cut to an int (SIGSEGV
        # in a correct program), and M_PI was undeclared. C++20, not 17: models
        # write set.contains(), std::ranges and <bit>.
        Language(
            "cpp",
            "main.cpp",
            ("g++", *CPP_FLAGS, "-o", "main", "main.cpp"),
            ("./main",),
            30.0,
            ("c++", "cxx", "cc"),
        ),
        # -lm after the source: the linker resolves libraries left to right.
        Language("c", "main.c", ("gcc", "-O2", "-std=gnu11", "-o", "main", "main.c", "-lm"), ("./main",), 30.0),
        # Xss: competitive-programming Java recurses deep; the default 512k-1M
        # stack overflows on a DFS over 1e5 nodes. SerialGC: one job, few cores,
        # the parallel collectors only add threads that count against pids limits.
        # -d .: a class in a package goes to the package's folder, where java finds it (resolve_language).
        # javac's own JVM (JAVAC_JVM_FLAGS) is tuned for a short run; the program's is not.
        Language(
            "java",
            "Main.java",
            ("javac", *JAVAC_JVM_FLAGS, "-encoding", "UTF-8", "-d", ".", "Main.java"),
            ("java", "-XX:+UseSerialGC", "-Xss64m", "-cp", ".", "Main"),
            30.0,
            address_space_limit=False,
        ),
        # Node writes to a pipe asynchronously once the pipe is full: a program
        # that ends with process.exit() lost all but the first 64 KiB of its
        # output (a judge's file would have taken it all). The preload makes
        # stdout and stderr blocking, as Node makes them for files.
        # --stack-size: V8 stops at its own limit, 984 KiB, whatever the process's
        # stack: a recursion 1e5 deep was a RangeError. The stack an exec'd run
        # gets (controller.RUN_STACK_LIMIT) is unlimited under Docker's defaults;
        # below this, V8 would crash (SIGSEGV) instead of throwing.
        Language(
            "javascript",
            "main.js",
            None,
            ("node", f"--stack-size={NODE_STACK_KIB}", "--require", NODE_BLOCKING_STDIO, "main.js"),
            0.0,
            ("js", "node", "nodejs", "mjs", "cjs"),
            address_space_limit=False,
        ),
        # Node 24 transforms TypeScript itself: it strips the types and also turns enums,
        # namespaces and parameter properties into JavaScript (stripped only, they are a
        # SyntaxError, and models write them). Types are not checked, as with tsx, Bun or
        # Deno's run: a program that runs correctly passes. The transform runs once, as the
        # compile step (TS_TRANSFORM), and each case runs the JavaScript as a JavaScript job
        # does: a run that transformed the types itself took 58-63 ms against 21-22 ms, in
        # the langs image on this machine (the transform loads its compiler, about 35 ms,
        # every time). A syntax error is a compile error. The transform's warning that it is
        # experimental would be the compile's output.
        Language(
            "typescript",
            "main.ts",
            ("node", "--disable-warning=ExperimentalWarning", "-e", TS_TRANSFORM, "main.ts", "main.js"),
            ("node", f"--stack-size={NODE_STACK_KIB}", "--require", NODE_BLOCKING_STDIO, "main.js"),
            30.0,
            ("ts", "mts", "cts"),
            address_space_limit=False,
        ),
        # The langs image compiles Go's standard library into a build cache that
        # jobs can read and not write (images/langs/Dockerfile): a job's `go build`
        # then compiles only its own package (0.1 s; 4.9 s from an empty cache with
        # Go 1.23, which ships no compiled library). go ignores an entry it cannot
        # store. GOPATH and HOME are the job's own. GOTOOLCHAIN=local: never try to
        # download a toolchain (there is no network anyway, fail fast).
        Language(
            "go",
            "main.go",
            ("go", "build", "-o", "main", "main.go"),
            ("./main",),
            60.0,
            ("golang",),
            GO_ENV,
            address_space_limit=False,
        ),
        Language(
            "rust",
            "main.rs",
            ("rustc", "--edition", "2021", "-O", "-o", "main", "main.rs"),
            ("./main",),
            60.0,
            ("rs",),
        ),
        Language("bash", "main.sh", None, ("bash", "main.sh"), 0.0, ("sh", "shell")),
    )
}

_ALIASES: dict[str, str] = {}
for _lang in LANGUAGES.values():
    _ALIASES[_lang.name] = _lang.name
    for _alias in _lang.aliases:
        _ALIASES[_alias] = _lang.name


def _canonical_language(language: str) -> str:
    key = (language or "python").strip().lower()
    try:
        return _ALIASES[key]
    except KeyError:
        raise ValueError(
            f"unsupported language {language!r}; supported: {', '.join(sorted(LANGUAGES))}"
        ) from None


# Java: comments and literals are blanked before looking for classes, so that a
# "class Foo" inside a string or comment is not taken for a declaration. An
# unclosed one runs to the end of the text (or of its line, for a literal):
# otherwise each opening would scan the rest of the text in vain, quadratic
# in a degenerate completion ("/*" repeated), on the daemon's event loop. A
# literal may end in a lone backslash at the end of the text, and its run is
# possessive: a text ending in one ('"' + '\\"' * n + '\\') made every
# opening quote scan to the end and back (64 KB: 29 s; red team).
_JAVA_BLANK = re.compile(
    r'//[^\n]*|/\*.*?(?:\*/|\Z)|"""(?:.|\n)*?(?:"""|\Z)|"(?:\\.|[^"\\\n])*+(?:"|(?=\n)|\\?\Z)'
    r"|'(?:\\.|[^'\\\n])*+(?:'|(?=\n)|\\?\Z)",
    re.DOTALL,
)
_JAVA_CLASS = re.compile(r"\b(class|interface|enum|record)\s+([A-Za-z_$][\w$]*)")
# Java takes method modifiers in any order: `static public void main` too.
_JAVA_MAIN = re.compile(r"\bstatic\s+(?:(?:public|protected|private|final|synchronized|strictfp)\s+)*void\s+main\s*\(")
_JAVA_BRACE = re.compile(r"[{}]")
# Modifiers and annotations before a class keyword: looked for within this many characters.
_JAVA_MODIFIERS_CHARS = 256
# Top-level declarations looked at: real programs have a handful; a degenerate
# completion ("class A" repeated) would otherwise cost a loop turn per repeat.
_JAVA_MAX_TOP_LEVEL_CLASSES = 1000
# NAME_MAX (255 bytes on Linux file systems) less ".java".
_JAVA_MAX_FILE_CLASS_BYTES = 255 - len(".java")
# Words, spaces and hyphens (`public non-sealed class`).
_WORDS_AND_SPACES = re.compile(r"[\w\s-]*")
_PUBLIC_REVERSED = re.compile(r"\bcilbup\b")


def _java_classes(code: str) -> tuple[str | None, str | None]:
    """(public top-level class, top-level class holding ``main``) in Java source.

    Linear in the text: a completion of a million characters of ``class A``
    repeated took minutes with a scan per class, on the daemon's event loop.
    """
    text = _JAVA_BLANK.sub(lambda m: " " * len(m.group()), code)
    brace_at: list[int] = []  # position of every brace, in order
    depth_after: list[int] = []  # nesting depth after that brace
    opens: list[int] = []  # position of every "{"
    close_of: dict[int, int] = {}  # a "{" -> the "}" that closes it
    stack: list[int] = []
    depth = 0
    for brace in _JAVA_BRACE.finditer(text):
        at = brace.start()
        if brace.group() == "{":
            opens.append(at)
            stack.append(at)
            depth += 1
        else:
            if stack:
                close_of[stack.pop()] = at
            depth -= 1
        brace_at.append(at)
        depth_after.append(depth)
    public_name: str | None = None
    main_name: str | None = None
    searched: set[int] = set()
    top_level = 0
    for match in _JAVA_CLASS.finditer(text):
        start = match.start()
        before = bisect.bisect_left(brace_at, start)
        if (depth_after[before - 1] if before else 0) != 0:
            continue
        top_level += 1
        if top_level > _JAVA_MAX_TOP_LEVEL_CLASSES:
            break
        name = match.group(2)
        if public_name is None:
            low = max(0, start - _JAVA_MODIFIERS_CHARS)
            statement_start = max(text.rfind(";", low, start), text.rfind("}", low, start)) + 1
            modifiers = text[max(low, statement_start) : start]
            # The words right before the keyword (`public final class`), read backwards: linear.
            words = _WORDS_AND_SPACES.match(modifiers[::-1]).group()  # type: ignore[union-attr]  # `*` always matches
            if _PUBLIC_REVERSED.search(words):
                public_name = name
        if main_name is not None:
            continue
        next_open = bisect.bisect_left(opens, match.end())
        if next_open == len(opens):
            continue
        open_at = opens[next_open]
        if open_at in searched:  # classes without a body of their own share the next one
            continue
        searched.add(open_at)
        if _JAVA_MAIN.search(text, open_at, close_of.get(open_at, len(text))):
            main_name = name
    return public_name, main_name


def _last_match(pattern: re.Pattern[str], text: str, end: int) -> re.Match[str] | None:
    """The last of ``pattern``'s non-overlapping matches that end by ``end``."""
    last = None
    for last in pattern.finditer(text, 0, end):  # noqa: B007 (the loop only walks to the last)
        pass
    return last


def resolve_language(language: str, code: str = "") -> Language:
    """The :class:`Language` for a name or alias, adapted to ``code`` when needed.

    Java's file name depends on the program: a public top-level class must
    live in a file of its name, so the source file is named after it
    (``Main.java`` when there is none), and the class run is the top-level
    class that declares ``main`` (else the public one, else ``Main``), in the
    program's package if it declares one (javac ``-d .`` puts it in the
    package's folder). A public class whose file name would be too long for
    the file system is left to javac in ``Main.java``: it fails there as a
    compile error, not in the agent when it writes the file.

    JavaScript with ``import`` or ``export`` statements is an ES module: it
    runs as ``main.mjs``, and TypeScript is written as ``main.mts`` and
    compiled to ``main.mjs`` (Node 18 ran a ``.js`` file as CommonJS, where an
    ``import`` statement is a SyntaxError; Node 22 and later detect the
    module, but only after a failed CommonJS parse).

    Raises ``ValueError`` for an unknown language.
    """
    lang = LANGUAGES[_canonical_language(language)]
    if lang.name in _ES_MODULE_FILES and code and _JS_MODULE_SYNTAX.search(_JS_BLANK.sub(" ", code)):
        module_file = _ES_MODULE_FILES[lang.name]
        if lang.compile_argv is None:
            return dataclasses.replace(lang, source_file=module_file, run_argv=(*lang.run_argv[:-1], module_file))
        return dataclasses.replace(lang, source_file=module_file,
                                   compile_argv=(*lang.compile_argv[:-2], module_file, _TS_MODULE_OUTPUT),
                                   run_argv=(*lang.run_argv[:-1], _TS_MODULE_OUTPUT))
    if lang.name != "java" or not code:
        return lang
    public_name, main_name = _java_classes(code)
    if public_name is not None and len(public_name.encode()) > _JAVA_MAX_FILE_CLASS_BYTES:
        public_name = None
    file_class = public_name or "Main"
    run_class = main_name or public_name or "Main"
    if package := _java_package(code):
        run_class = f"{package}.{run_class}"
    source = f"{file_class}.java"
    return dataclasses.replace(
        lang,
        source_file=source,
        compile_argv=(*(lang.compile_argv or ())[:-1], source),
        run_argv=(*lang.run_argv[:-1], run_class),
    )


# A package declaration, the first statement of a Java file: "package com.example.app;". Its class runs as
# com.example.app.Main (java -cp . Main said "wrong name" for a correct program).
_JAVA_NAME = r"[A-Za-z_$][\w$]*+"
_JAVA_PACKAGE = re.compile(rf"\s*+(?:@[\w.]++\s*+)*+package\s++({_JAVA_NAME}(?:\s*+\.\s*+{_JAVA_NAME})*+)\s*+;")


def _java_package(code: str) -> str:
    """The package ``code`` declares, or ""."""
    match = _JAVA_PACKAGE.match(_JAVA_BLANK.sub(lambda m: " " * len(m.group()), code))
    return re.sub(r"\s+", "", match.group(1)) if match else ""


# JavaScript and TypeScript: an import or export statement at the start of a line (not import(), a call CommonJS
# has too), once comments and string literals are blanked. Such a program runs as an ES module file.
_ES_MODULE_FILES = {"javascript": "main.mjs", "typescript": "main.mts"}
# What a TypeScript module's compile step writes and its runs execute.
_TS_MODULE_OUTPUT = "main.mjs"
_JS_BLANK = re.compile(
    r"//[^\n]*|/\*.*?(?:\*/|\Z)|`(?:\\.|[^`\\])*+(?:`|\Z)|\"(?:\\.|[^\"\\\n])*+\"?|'(?:\\.|[^'\\\n])*+'?",
    re.DOTALL,
)
_JS_MODULE_SYNTAX = re.compile(
    r"^[ \t]*+(?:import(?:[ \t]++[\w$]|[ \t]*+[{*])|"
    r"export[ \t]++(?:default|const|let|var|function|async|class|\{|\*"
    r"|interface|type|enum|abstract|declare|namespace))",  # the last line: TypeScript's
    re.MULTILINE,
)


# ---------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------

# Possessive: a lazy info string before optional trailing blanks was retried at every length, quadratic in a
# line's blanks ("```python" and 40,000 spaces, which a degenerate model writes, took 6.7 s on the daemon's loop).
_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*+)(?P<fence>`{3,}+|~{3,}+)(?P<info>[^`\n]*+)$")


# The language word of an info string: pandoc's "{.python}", and attributes after a comma or colon ("rust,ignore",
# "cpp:main.cpp", "python title=x"). A C++ standard after the name ("c++17", "cpp20") names C++.
_INFO_WORD_RE = re.compile(r"[\s{.]*+([^\s,:{}]*+)")
_CPP_STANDARD_RE = re.compile(r"(?:c\+\+|cpp)\d\d")


def _info_language(info: str) -> str:
    """The language word of a fence's info string, lower-cased; "" for none."""
    match = _INFO_WORD_RE.match(info)  # matches any text
    word = match.group(1).rstrip(".").lower() if match else ""
    return "cpp" if _CPP_STANDARD_RE.fullmatch(word) else word


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info word, body) of every fenced block, in order.

    Follows CommonMark where it matters for model output: ``` or ~~~ fences of
    three or more, closed by the same character at least as long, the opening
    indentation removed from the body. An unclosed last block runs to the end:
    models often stop at EOS without writing the closing fence.
    """
    blocks: list[tuple[str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE_OPEN.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence = opening.group("fence")
        indent = len(opening.group("indent"))
        word = _info_language(opening.group("info"))
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        i += 1
        while i < len(lines) and not closing.match(lines[i]):
            line = lines[i]
            strip = len(line) - len(line.lstrip(" \t"))
            body.append(line[min(indent, strip) :])
            i += 1
        i += 1  # past the closing fence (or the end)
        blocks.append((word, "\n".join(body) + ("\n" if body else "")))
    return blocks


def _pick_block(text: str, language: str, last: bool) -> str | None:
    canonical = _canonical_language(language)
    blocks = _fenced_blocks(text)
    if last:
        blocks.reverse()
    for word, body in blocks:
        if word and _ALIASES.get(word) == canonical:
            return body
    for word, body in blocks:
        if not word:
            return body
    return None


def extract_code(completion: str, language: str, mode: str = "last_block", tag: str = "") -> str | None:
    """Extract the program from a model completion, or ``None`` if there is none.

    Modes (``CodeExtraction`` in the API, lower-cased without the prefix):

    - ``"last_block"`` (default, also ``""``/``"unspecified"``): the last fenced
      block whose info string names ``language`` or one of its aliases; if
      there is none, the last block with no info string. Blocks tagged with
      another language are never taken.
    - ``"first_block"``: the same rule, first instead of last.
    - ``"whole"``: the completion itself.
    - ``"tag"``: the body of the last complete ``<tag>...</tag>``; if that body
      holds fenced blocks, the ``last_block`` rule is applied inside it.

    Whitespace-only results count as nothing found. Raises ``ValueError`` for an
    unknown mode or language, or ``mode="tag"`` without a tag.
    """
    normalized = (mode or "last_block").strip().lower()
    normalized = normalized.removeprefix("code_extraction_")
    if normalized in ("", "unspecified"):
        normalized = "last_block"
    _canonical_language(language)  # validate even when the mode ignores it
    if normalized == "last_block":
        code = _pick_block(completion, language, last=True)
    elif normalized == "first_block":
        code = _pick_block(completion, language, last=False)
    elif normalized == "whole":
        code = completion
    elif normalized == "tag":
        if not tag or not re.fullmatch(r"[A-Za-z_][\w.:-]*", tag):
            raise ValueError(f"extraction mode 'tag' needs a tag name, got {tag!r}")
        # The last closing tag, then the last opening tag before it: linear, where
        # a lazy `<tag>(.*?)</tag>` scanned the rest of the text from every opening
        # tag ("<code>" repeated without a close took 45 s for 240 KB).
        closing = _last_match(re.compile(rf"</{re.escape(tag)}\s{{0,64}}>"), completion, len(completion))
        if closing is None:
            return None
        opening = _last_match(re.compile(rf"<{re.escape(tag)}(?:\s[^<>]{{0,256}})?>"), completion, closing.start())
        if opening is None:
            return None
        body = completion[opening.end() : closing.start()]
        code = _pick_block(body, language, last=True) if _fenced_blocks(body) else body.strip("\n")
    else:
        raise ValueError(f"unknown extraction mode {mode!r}")
    if code is None or not code.strip():
        return None
    return code


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StdioCase:
    """One run of the program: what goes to stdin, what stdout must match."""

    stdin: str
    expected_stdout: str


@dataclass(frozen=True)
class FunctionCase:
    """One call of the function under test.

    ``unwrap_single``: APPS/TACO store call-based outputs wrapped in a list
    (``[[1, 2]]`` for a return value of ``[1, 2]``) but not always; when set, a
    1-element list ``expected`` also accepts its single element (see
    :meth:`matches`).

    ``int_keys``: the first argument is a dict whose keys all read as integers,
    and the call gets them as ints (see :meth:`call_args`). JSON, the only way
    the APPS family stores a call, turns ``{1: x}`` into ``{"1": x}``; APPS's
    harness, and TACO's and verl's prime_code copies of it, turn a first
    argument's keys back with ``int()`` before the call, so a correct program
    may index it by ints. The case travels to the judge as JSON too, so the
    flag travels and the judge turns the keys back.
    """

    args: tuple[Any, ...]
    expected: Any
    unwrap_single: bool = False
    int_keys: bool = False

    def call_args(self) -> tuple[Any, ...]:
        """The arguments of the call: ``args``, with ``int_keys`` the first one's keys made ints by ``int()``."""
        if not self.int_keys:
            return self.args
        first, *rest = self.args
        return ({int(key): value for key, value in first.items()}, *rest)

    def matches(self, actual: Any, tolerance: float = 1e-6) -> bool:
        """Whether a decoded return value passes this case."""
        if compare_values(actual, self.expected, tolerance):
            return True
        return (
            self.unwrap_single
            and type(self.expected) is list
            and len(self.expected) == 1
            and compare_values(actual, self.expected[0], tolerance)
        )


@dataclass(frozen=True)
class TestPlan:
    """Tests of one code job, in one of three kinds.

    - ``"stdio"``: run the program once per case in ``stdio``.
    - ``"function"``: call ``fn_name`` (``"Solution.method"`` for LeetCode) once
      per case in ``function``; an unqualified name that is not a top-level
      callable falls back to a method of ``Solution``.
    - ``"assert"``: run ``assert_code`` against the program's top-level names;
      if it defines ``check``, call ``check(<entry_point>)`` (HumanEval).

    ``prompt`` is trusted dataset code (HumanEval's prompt): the agent runs it
    in the test process before ``assert_code`` so that the helpers the tests
    use (HumanEval/32's ``poly``, /38's ``encode_cyclic``) are the dataset's,
    not the candidate's; and :func:`assemble_program` prepends it to a
    body-only completion. ``prelude`` (MBPP's ``test_imports``) is prepended
    to every program, as the reference harness executes it in the program's
    namespace. ``checker`` is the stdout checker of the dataset's own grader
    (see :func:`compare_stdout`), used when a request names none.
    """

    __test__ = False  # not a pytest test class, despite the name

    kind: str
    stdio: tuple[StdioCase, ...] = ()
    fn_name: str = ""
    function: tuple[FunctionCase, ...] = ()
    assert_code: str = ""
    entry_point: str = ""
    prompt: str = ""
    prelude: str = ""
    checker: str = "whitespace"

    @functools.cached_property
    def prompt_head(self) -> str:
        """What of ``prompt`` goes before a completion that defines the entry point itself.

        The whole prompt when it parses alone, else its import lines. The
        daemon shares one plan among every completion of a prompt, so the
        prompt is parsed once, not once per completion.
        """
        if _parse(self.prompt) is not None:
            prompt = self.prompt
        else:
            prompt = "".join(line + "\n" for line in self.prompt.splitlines() if _IMPORT_LINE.match(line))
        return prompt if not prompt or prompt.endswith("\n") else prompt + "\n"

    @property
    def total(self) -> int:
        """Number of tests counted by the reward (an assert block counts as one)."""
        if self.kind == "stdio":
            return len(self.stdio)
        if self.kind == "function":
            return len(self.function)
        return 1


_IMPORT_LINE = re.compile(r"^(?:import\s+\S|from\s+\S+\s+import\s)")
# What ast.parse raises for code it cannot take: bad syntax, NUL bytes (ValueError),
# nesting too deep for the parser (RecursionError, or MemoryError for a long chain
# such as "assert " + "-" * 200000 + "1").
# What a program that does not parse raises; with a parse that ran out of stack or memory, all that _parse and
# _defines take for "does not parse" (the judge, whose memory is bounded apart, tells the two apart).
_SYNTAX_ERRORS = (SyntaxError, ValueError)
_PARSE_ERRORS = (*_SYNTAX_ERRORS, RecursionError, MemoryError)


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except _PARSE_ERRORS:
        return None


# A def or class statement at top level, and the name it binds (see _defines). One
# pattern, compiled once (in the zygote): a pattern made for each name was compiled
# by re's Python code in every HumanEval candidate, which a fresh worker paid in
# page faults: 685-690 -> 613-619 per candidate here.
_TOP_LEVEL_DEFINITION = re.compile(r"^(?:async[ \t]+def|def|class)[ \t]+(\w+)", re.MULTILINE)


def _defines(code: str, name: str, parse_errors: tuple[type[BaseException], ...] = _PARSE_ERRORS) -> bool:
    """Whether ``code`` parses and a ``def`` or ``class`` statement at its top level binds ``name``.

    No AST: a statement at top level starts at column 0, and the compiled
    module keeps the code object of each function and class it defines
    among its constants. For 1 MiB of code, ast.parse took 1.3-1.7 s here
    (building its Python objects is most of it) and compile() 0.33-0.47 s;
    a completion without such a line is not compiled at all. The daemon
    does not ask it (see :func:`program_assembly`).
    """
    if not any(match[1] == name for match in _TOP_LEVEL_DEFINITION.finditer(code)):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarnings (an invalid escape) are the candidate's
        try:
            module = compile(code, "<completion>", "exec", dont_inherit=True)
        except parse_errors:
            return False
    return any(isinstance(const, types.CodeType) and const.co_name == name for const in module.co_consts)


def _prelude_head(plan: TestPlan) -> str:
    head = plan.prelude
    return head + "\n" if head and not head.endswith("\n") else head


def program_assembly(plan: TestPlan) -> dict[str, str] | None:
    """What :func:`assemble` needs to make a completion's program for ``plan``, when that depends on the completion.

    Only a HumanEval prompt makes it so (see :func:`assemble_program`);
    ``None`` otherwise. The daemon sends this with the bare completion, and
    the candidate's and the judge's processes assemble the program in the
    sandbox, on the job's time: whether the completion defines the entry
    point takes a compile of it, 0.33-0.47 s for 1 MiB of code, which held
    the daemon's event loop (every other call) when the daemon assembled it.
    """
    if not (plan.prompt and plan.entry_point):
        return None
    return {"head": _prelude_head(plan), "prompt": plan.prompt, "prompt_head": plan.prompt_head,
            "entry_point": plan.entry_point}


def assemble(code: str, assembly: Mapping[str, str], *, strict: bool = False) -> str:
    """The program of completion ``code`` by ``assembly`` (from :func:`program_assembly`).

    ``strict``: a compile of ``code`` that runs out of memory or recursion
    raises (MemoryError, RecursionError) instead of taking ``code`` for one
    that does not define the entry point: the judge, whose memory is bounded
    apart from the candidate's, must not assemble another program than the
    candidate did.
    """
    if not _defines(code, assembly["entry_point"], _SYNTAX_ERRORS if strict else _PARSE_ERRORS):
        return assembly["head"] + assembly["prompt"] + code
    return assembly["head"] + assembly["prompt_head"] + "\n" + code


def assemble_program(code: str, plan: TestPlan) -> str:
    """The Python program to run for ``plan``: ``code`` plus what the dataset implies.

    ``plan.prelude`` goes first. Then, with a HumanEval prompt: a completion
    that does not define ``plan.entry_point`` at top level (a body-only
    completion, which does not even parse alone) continues the prompt, as in
    HumanEval's own harness; one that does (a chat model's full function)
    comes after the whole prompt, so it can use the prompt's imports and
    helpers (``List``, HumanEval/32's ``poly``) and its own definitions replace
    the prompt's stub. A prompt that does not parse alone contributes only its
    import lines.
    """
    assembly = program_assembly(plan)
    if assembly is not None:
        return assemble(code, assembly)
    head = _prelude_head(plan)
    return head + "\n" + code if head else code


def _get(tests: Mapping[str, Any], key: str) -> Any:
    """A CodeTests field by its proto name or its JSON (camelCase) name."""
    if key in tests:
        return tests[key]
    head, *rest = key.split("_")
    return tests.get(head + "".join(word.title() for word in rest))


def _load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None


def _stdio_text(value: Any, what: str) -> str:
    # APPS sometimes stores a case as a list of lines; its harness joins them.
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    raise ValueError(f"{what} must be a string or a list of strings, got {type(value).__name__}")


def _check_assert_code(code: str, entry_point: str, what: str) -> None:
    if not code.strip():
        raise ValueError(f"{what} is empty")
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise ValueError(f"{what} does not parse: {exc.msg} (line {exc.lineno})") from None
    except _PARSE_ERRORS as exc:  # NUL bytes, nesting deeper than the parser can take
        raise ValueError(f"{what} does not parse: {type(exc).__name__} {exc}".rstrip()[:500]) from None
    defines_check = any(isinstance(node, ast.FunctionDef) and node.name == "check" for node in tree.body)
    if defines_check and not entry_point:
        raise ValueError(f"{what} defines check(candidate) but no entry_point names the candidate")


def _identifier_path(name: str, what: str) -> str:
    parts = name.split(".")
    if not 1 <= len(parts) <= 2 or not all(part.isidentifier() for part in parts):
        raise ValueError(f"{what} must be a function name or 'Class.method', got {name!r}")
    return name


def _explicit_plan(tests: Mapping[str, Any], fn_name: str, entry_point: str) -> TestPlan:
    stdio = _get(tests, "stdio") or []
    function = _get(tests, "function") or []
    assert_code = _get(tests, "assert_code") or ""
    given = [
        name
        for name, value in (("stdio", stdio), ("function", function), ("assert_code", assert_code))
        if value
    ]
    if len(given) > 1:
        raise ValueError(f"tests give both {given[0]} and {given[1]}; a job has one kind of test")
    if stdio:
        cases = []
        for i, case in enumerate(stdio):
            if not isinstance(case, Mapping):
                raise ValueError(f"stdio[{i}] must be an object with stdin and expected_stdout")
            cases.append(
                StdioCase(
                    _stdio_text(_get(case, "stdin") or "", f"stdio[{i}].stdin"),
                    _stdio_text(_get(case, "expected_stdout") or "", f"stdio[{i}].expected_stdout"),
                )
            )
        return TestPlan("stdio", stdio=tuple(cases))
    if function:
        if not fn_name:
            raise ValueError("function tests need fn_name")
        calls = []
        for i, case in enumerate(function):
            if not isinstance(case, Mapping):
                raise ValueError(f"function[{i}] must be an object with args_json and expected_json")
            args = _load_json(_get(case, "args_json") or "[]", f"function[{i}].args_json")
            if not isinstance(args, list):
                raise ValueError(f"function[{i}].args_json must be a JSON array of positional arguments")
            expected_json = _get(case, "expected_json") or ""
            if not expected_json.strip():
                raise ValueError(f"function[{i}].expected_json is empty (use 'null' for None)")
            calls.append(FunctionCase(tuple(args), _load_json(expected_json, f"function[{i}].expected_json")))
        return TestPlan("function", fn_name=_identifier_path(fn_name, "fn_name"), function=tuple(calls))
    if assert_code:
        _check_assert_code(assert_code, entry_point, "assert_code")
        return TestPlan("assert", assert_code=assert_code, entry_point=entry_point)
    raise ValueError("no tests: give stdio, function (with fn_name), assert_code or dataset_json")


def _io_plan(data: Mapping[str, Any], fn_name: str) -> TestPlan:
    """verl / APPS / TACO ``{"inputs", "outputs", "fn_name"?}``."""
    inputs, outputs = data.get("inputs"), data.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError("dataset_json: 'inputs' and 'outputs' must both be lists")
    if len(inputs) != len(outputs):
        raise ValueError(f"dataset_json: {len(inputs)} inputs but {len(outputs)} outputs")
    if not inputs:
        raise ValueError("dataset_json: no test cases in 'inputs'")
    name = fn_name or data.get("fn_name") or ""
    if not isinstance(name, str):
        raise ValueError("dataset_json: 'fn_name' must be a string")
    if name:
        cases = []
        for i, (args, expected) in enumerate(zip(inputs, outputs, strict=True)):
            if isinstance(args, str):
                case = _prime_code_case(args, expected, i)
            elif isinstance(args, list):
                case = FunctionCase(tuple(args), expected, unwrap_single=True)
            else:
                raise ValueError(
                    f"dataset_json: inputs[{i}] must be a list of arguments, or their JSON one per line, "
                    "when fn_name is set"
                )
            cases.append(dataclasses.replace(case, int_keys=_int_like_keys(case.args)))
        return TestPlan("function", fn_name=_identifier_path(name, "fn_name"), function=tuple(cases))
    return TestPlan(
        "stdio",
        stdio=tuple(
            StdioCase(
                _stdio_text(i, f"dataset_json: inputs[{n}]"), _stdio_text(o, f"dataset_json: outputs[{n}]")
            )
            for n, (i, o) in enumerate(zip(inputs, outputs, strict=True))
        ),
    )


def _int_like_keys(args: tuple[Any, ...]) -> bool:
    """Whether APPS's harness calls with the first argument's keys as ints: a non-empty dict whose keys all
    read as integers to ``int()`` (``"1"``, ``" -2"``, ``"1_000"``; not ``"1.5"``, nor past 4,300 digits).

    As ``run_test`` in APPS's ``testing_util.py`` and its copies (TACO's, verl 0.9.1's
    ``prime_code/testing_util.py``): ``{int(k): v for k, v in inputs[0].items()}``, left as it was
    when one key does not convert. Those copies then call with that argument alone (``inputs``
    becomes a one-element list), so a call of more arguments whose first is such a dict fails
    there for every program; here it gets them all.
    """
    if not args or type(args[0]) is not dict or not args[0]:
        return False
    try:
        for key in args[0]:
            int(key)
    except (TypeError, ValueError):
        return False
    return True


def _prime_code_case(args_text: str, expected: Any, i: int) -> FunctionCase:
    """A call in verl's prime_code form: the arguments' JSON one per line, the return value's JSON.

    As verl's ``prime_code/testing_util.py`` (0.9.1) reads it: every line is one argument
    (``"1", newline, "2"`` calls ``f(1, 2)``; a blank line is skipped here, where verl fails on
    it), and the output is the return value's JSON. A 1-element list also accepts its element
    as the return value. A first argument that is a dict of integer-like keys is called with
    int keys, as there (see :func:`_int_like_keys`).
    """
    args = _lcb_args(args_text, f"dataset_json: inputs[{i}]")
    if not args:
        raise ValueError(f"dataset_json: inputs[{i}] holds no arguments (one JSON value per line)")
    if isinstance(expected, str):
        expected = _load_json(expected, f"dataset_json: outputs[{i}]")
    return FunctionCase(args, expected, unwrap_single=True)


def _code_contests_plan(data: Mapping[str, Any]) -> TestPlan:
    """CodeContests: every one of public, private and generated tests, in that order."""
    cases: list[StdioCase] = []
    for group in ("public_tests", "private_tests", "generated_tests"):
        tests = data.get(group)
        if tests is None:
            continue
        if not isinstance(tests, Mapping):
            raise ValueError(f"dataset_json: {group} must be an object with 'input' and 'output' lists")
        inputs, outputs = tests.get("input") or [], tests.get("output") or []
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise ValueError(f"dataset_json: {group}.input and {group}.output must be lists of equal length")
        for n, (i, o) in enumerate(zip(inputs, outputs, strict=True)):
            cases.append(
                StdioCase(
                    _stdio_text(i, f"dataset_json: {group}.input[{n}]"),
                    _stdio_text(o, f"dataset_json: {group}.output[{n}]"),
                )
            )
    if not cases:
        raise ValueError("dataset_json: no test cases in public_tests/private_tests/generated_tests")
    # WHITESPACE, not the tester's TOKENS_IGNORE_CASE: that one pays a program that echoes its input on a
    # problem that asks to change a word's case ("konjac" for "Konjac", Codeforces 281A), a hack a trainer's
    # policy finds. The RL graders of CodeContests rows (DeepCoder's, verl's prime_code, Open-R1's) ignore no
    # case either; the tester's leniency is there by name.
    return TestPlan("stdio", stdio=tuple(cases))


def _lcb_args(text: Any, what: str) -> tuple[Any, ...]:
    # LiveCodeBench functional input: one JSON value per line, one line per argument.
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a string of JSON values, one per line")
    return tuple(_load_json(line, what) for line in text.splitlines() if line.strip())


def _case_list_plan(cases: list[Any], fn_name: str) -> TestPlan:
    """LiveCodeBench-style ``[{"input", "output", "testtype", "metadata"?}]``.

    DeepCoder keeps PrimeIntellect's cases as such a bare list, with ``type`` (``stdin_stdout``,
    ``function_call``) and ``fn_name`` instead: read as PrimeIntellect's. Its LiveCodeBench
    cases name the function in each case's ``metadata``.
    """
    if not cases:
        raise ValueError("dataset_json: empty list of test cases")
    if all(isinstance(case, Mapping) and "type" in case and "testtype" not in case for case in cases):
        return _prime_intellect_plan({"test_cases": cases}, fn_name)
    kinds = set()
    for i, case in enumerate(cases):
        if not isinstance(case, Mapping) or "input" not in case or "output" not in case:
            raise ValueError(f"dataset_json[{i}] must be an object with 'input' and 'output'")
        kinds.add(case.get("testtype") or "stdin")
        metadata = _maybe_json(case.get("metadata") or {}, f"dataset_json[{i}].metadata")
        if not fn_name and isinstance(metadata, Mapping) and isinstance(metadata.get("func_name"), str):
            fn_name = metadata["func_name"]
    if len(kinds) > 1:
        raise ValueError(f"dataset_json mixes test types {sorted(kinds)}")
    kind = kinds.pop()
    if kind == "stdin":
        # LiveCodeBench's own grader, where the cases say they are its (testtype); a bare list of
        # {input, output} comes from other datasets too (DeepCoder's Codeforces rows).
        named = all(case.get("testtype") == "stdin" for case in cases)
        return TestPlan(
            "stdio",
            stdio=tuple(
                StdioCase(
                    _stdio_text(c["input"], f"dataset_json[{i}].input"),
                    _stdio_text(c["output"], f"dataset_json[{i}].output"),
                )
                for i, c in enumerate(cases)
            ),
            checker="lines_decimal" if named else "whitespace",
        )
    if kind != "functional":
        raise ValueError(f"dataset_json: unknown testtype {kind!r} (expected 'stdin' or 'functional')")
    if not fn_name:
        raise ValueError("dataset_json: functional tests need fn_name (or metadata.func_name)")
    calls = []
    for i, c in enumerate(cases):
        calls.append(
            FunctionCase(
                _lcb_args(c["input"], f"dataset_json[{i}].input"),
                _maybe_json(c["output"], f"dataset_json[{i}].output"),
            )
        )
    return TestPlan("function", fn_name=_identifier_path(fn_name, "fn_name"), function=tuple(calls))


def _maybe_json(value: Any, what: str) -> Any:
    return _load_json(value, what) if isinstance(value, str) else value


def _dataset_plan(data: Any, fn_name: str, entry_point: str) -> TestPlan:
    if isinstance(data, list):
        return _case_list_plan(data, fn_name)
    if not isinstance(data, Mapping):
        raise ValueError(f"dataset_json must be a JSON object or array, got {type(data).__name__}")
    if "assert_case" in data:
        return _assert_case_plan(data, entry_point)
    if "inputs" in data or "outputs" in data:
        return _io_plan(data, fn_name)
    if "test" in data:
        test = data["test"]
        entry = entry_point or data.get("entry_point") or ""
        prompt = data.get("prompt") or ""
        if not isinstance(test, str) or not isinstance(entry, str) or not isinstance(prompt, str):
            raise ValueError("dataset_json: HumanEval 'test', 'entry_point' and 'prompt' must be strings")
        _check_assert_code(test, entry, "dataset_json.test")
        return TestPlan("assert", assert_code=test, entry_point=entry, prompt=prompt)
    if "test_list" in data:
        test_list = data["test_list"]
        imports = data.get("test_imports") or []
        setup = data.get("test_setup_code") or ""
        if not isinstance(test_list, list) or not all(isinstance(t, str) for t in test_list) or not test_list:
            raise ValueError("dataset_json: MBPP 'test_list' must be a non-empty list of strings")
        if not isinstance(imports, list) or not all(isinstance(t, str) for t in imports):
            raise ValueError("dataset_json: MBPP 'test_imports' must be a list of strings")
        if not isinstance(setup, str):
            raise ValueError("dataset_json: MBPP 'test_setup_code' must be a string")
        prelude = "".join(line + "\n" for line in imports)
        code = prelude + (setup + "\n" if setup else "") + "".join(t + "\n" for t in test_list)
        _check_assert_code(code, entry_point, "dataset_json.test_list")
        return TestPlan("assert", assert_code=code, entry_point=entry_point, prelude=prelude)
    if any(group in data for group in ("public_tests", "private_tests", "generated_tests")):
        return _code_contests_plan(data)
    if "public_test_cases" in data or "private_test_cases" in data:
        cases: list[Any] = []
        for group in ("public_test_cases", "private_test_cases"):
            # LiveCodeBench's released private cases are base64(zlib(pickle)):
            # unpickling is code execution, so only JSON is accepted here.
            value = _maybe_json(data.get(group) or [], f"dataset_json.{group}")
            if not isinstance(value, list):
                raise ValueError(f"dataset_json.{group} must be a JSON list of test cases")
            cases.extend(value)
        metadata = _maybe_json(data.get("metadata") or {}, "dataset_json.metadata")
        name = fn_name or (metadata.get("func_name") if isinstance(metadata, Mapping) else "") or ""
        return _case_list_plan(cases, name)
    if "test_cases" in data:
        return _prime_intellect_plan(data, fn_name)
    raise ValueError(
        "dataset_json has no known shape; expected one of: inputs/outputs[/fn_name] (verl, APPS, TACO), "
        "test/entry_point (HumanEval), test_list (MBPP), public_tests/private_tests/generated_tests "
        "(CodeContests), a list of {input, output, testtype} or public_test_cases (LiveCodeBench), "
        "test_cases (PrimeIntellect), assert_case (SandboxFusion)"
    )


def _assert_case_plan(data: Mapping[str, Any], entry_point: str) -> TestPlan:
    """SandboxFusion's assert form, as verl's ``sandbox_fusion`` scorer reads it: ``{"assert_case": [code, ...]}``.

    There each case is run as the program followed by the case's code, and passes when that
    runs without an error; its ``inputs`` (stdin) default to empty and its ``outputs`` to none
    (nothing compared). Here the cases are one block of assert code, in order, run against the
    program's top-level names: a test of one case, passed when every case passes (verl's
    continuous score is the fraction of the first ten that pass). ``inputs`` or ``outputs``
    that are not empty (stdin for each case, output to compare) are refused.
    """
    cases = data["assert_case"]
    if not isinstance(cases, list) or not cases or not all(isinstance(case, str) for case in cases):
        raise ValueError("dataset_json: 'assert_case' must be a non-empty list of strings (code)")
    inputs, outputs = data.get("inputs") or [], data.get("outputs") or []
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError("dataset_json: 'inputs' and 'outputs' beside 'assert_case' must be lists")
    if any(stdin not in (None, "") for stdin in inputs) or any(output is not None for output in outputs):
        raise ValueError("dataset_json: 'assert_case' with stdin inputs or expected outputs is not supported; "
                         "give the asserts alone")
    entry = entry_point or data.get("entry_point") or ""
    if not isinstance(entry, str):
        raise ValueError("dataset_json: 'entry_point' must be a string")
    code = "".join(case if case.endswith("\n") else case + "\n" for case in cases)
    _check_assert_code(code, entry, "dataset_json.assert_case")
    return TestPlan("assert", assert_code=code, entry_point=entry)


def _prime_intellect_plan(data: Mapping[str, Any], fn_name: str) -> TestPlan:
    """PrimeIntellect's ``verification_info``: ``{"test_cases": [{"type", "input", "output", "fn_name"?}]}``.

    Its problems come from APPS, TACO and CodeContests and keep their conventions, as
    verl's shape does: a ``function_call`` case's input is the list of arguments and its
    output the expected value in a one-element list; ``stdin_stdout`` cases are text.
    """
    cases = _maybe_json(data["test_cases"], "dataset_json.test_cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError("dataset_json.test_cases must be a non-empty list of test cases")
    kinds, names = set(), set()
    for i, case in enumerate(cases):
        if not isinstance(case, Mapping) or "input" not in case or "output" not in case:
            raise ValueError(f"dataset_json.test_cases[{i}] must be an object with 'input' and 'output'")
        kinds.add(case.get("type") or "stdin_stdout")
        if case.get("fn_name"):
            names.add(case["fn_name"])
    if len(kinds) > 1:
        raise ValueError(f"dataset_json.test_cases mixes test types {sorted(map(str, kinds))}")
    kind = kinds.pop()
    inputs = [case["input"] for case in cases]
    outputs = [case["output"] for case in cases]
    if kind == "stdin_stdout":
        return _io_plan({"inputs": inputs, "outputs": outputs}, "")
    if kind != "function_call":
        raise ValueError(f"dataset_json.test_cases: unknown type {kind!r} (expected 'stdin_stdout' or "
                         "'function_call')")
    if len(names) > 1:
        raise ValueError(f"dataset_json.test_cases call different functions {sorted(map(str, names))}")
    name = fn_name or (names.pop() if names else "")
    if not name:
        raise ValueError("dataset_json.test_cases: function_call tests need fn_name")
    inputs = [_maybe_json(args, f"dataset_json.test_cases[{i}].input") for i, args in enumerate(inputs)]
    outputs = [_maybe_json(out, f"dataset_json.test_cases[{i}].output") for i, out in enumerate(outputs)]
    return _io_plan({"inputs": inputs, "outputs": outputs}, name)


def normalize_tests(tests: Mapping[str, Any]) -> TestPlan:
    """Turn the API's ``CodeTests`` (as a dict) into a :class:`TestPlan`.

    Keys are the proto field names (``stdio``, ``fn_name``, ``function``,
    ``assert_code``, ``entry_point``, ``dataset_json``) or their JSON
    camelCase names; empty values mean unset, as in proto3. Tests come either
    explicitly (exactly one of ``stdio``, ``function``, ``assert_code``) or
    verbatim in ``dataset_json`` (a dict, a list, or a JSON string); ``fn_name``
    and ``entry_point`` may accompany ``dataset_json`` and take precedence over
    the dataset's own. Dataset shapes:

    - verl / APPS / TACO ``{"inputs", "outputs", "fn_name"?}``: without
      ``fn_name`` stdio cases (a list of lines is joined with newlines); with
      it, each input is the list of positional arguments, or (verl's
      prime_code) a string of their JSON one per line with the output's JSON
      (see :func:`_prime_code_case`), and an output that is a 1-element list
      also accepts its element as the return value (APPS wraps return values
      in a list, but not always).
    - HumanEval ``{"test", "entry_point", "prompt"?}``: assert kind; ``check``
      is called with the entry point; the prompt is kept (see :class:`TestPlan`
      and :func:`assemble_program`).
    - MBPP ``{"test_list", "test_imports"?, "test_setup_code"?}``: assert kind,
      imports + setup + the asserts as one block (``challenge_test_list`` is
      ignored, as in the reference evaluation).
    - CodeContests ``{"public_tests", "private_tests", "generated_tests"}``:
      stdio, all groups present, in that order.
    - LiveCodeBench ``[{"input", "output", "testtype"}]`` or a row with
      ``public_test_cases``/``private_test_cases`` (JSON only) and
      ``metadata.func_name``: ``stdin`` cases are stdio, checked as its grader
      does (``lines_decimal``) when each names its testtype; ``functional``
      cases take one JSON argument per input line and a JSON output.
    - PrimeIntellect ``{"test_cases": [{"type", "input", "output", "fn_name"?}]}``:
      APPS's conventions (see :func:`_prime_intellect_plan`).
    - SandboxFusion ``{"assert_case": [...]}`` (verl's ``sandbox_fusion``):
      assert kind, the cases in order as one block (see :func:`_assert_case_plan`).

    In every APPS-family call (verl, APPS, TACO, PrimeIntellect), a first
    argument that is a dict whose keys all read as integers is called with
    int keys, as their harnesses do (see :func:`_int_like_keys`).

    Raises ``ValueError`` with a precise message on malformed tests.
    """
    if not isinstance(tests, Mapping):
        raise ValueError(f"tests must be an object, got {type(tests).__name__}")
    fn_name = _get(tests, "fn_name") or ""
    entry_point = _get(tests, "entry_point") or ""
    if not isinstance(fn_name, str) or not isinstance(entry_point, str):
        raise ValueError("fn_name and entry_point must be strings")
    dataset = _get(tests, "dataset_json")
    if dataset in (None, "", {}, []):
        return _explicit_plan(tests, fn_name, entry_point)
    explicit = [key for key in ("stdio", "function", "assert_code") if _get(tests, key)]
    if explicit:
        raise ValueError(f"tests give both dataset_json and {explicit[0]}; give one or the other")
    return _dataset_plan(_maybe_json(dataset, "dataset_json"), fn_name, entry_point)


# ---------------------------------------------------------------------------
# Checkers and scoring
# ---------------------------------------------------------------------------

# One way to match each number: with an optional dot between two runs of digits, a run of n digits that is not
# a number (a program's "1111...1x") was split n ways, quadratic (32,000 digits: 19.5 s in the agent's loop,
# which froze its sandbox until the daemon called it lost). ASCII digits only, as a judge's checker reads them.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_INTEGER = re.compile(r"[+-]?\d+", re.ASCII)


def _check_tolerance(tolerance: float) -> None:
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")


def _close(a: float, b: float, tolerance: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)


def _token_close(actual: str, expected: str, tolerance: float) -> bool:
    if actual == expected:
        return True
    if not (_NUMBER.fullmatch(actual) and _NUMBER.fullmatch(expected)):
        return False
    # Integers compare exactly when both are integers (a relative tolerance
    # would take 12502499 for 12502500); a float checker still accepts "3"
    # for "3.0000001", and "2.9999999" or "1000000001.0" for "1000000000",
    # as judges' float checkers do: a reference printed by C++ shows an
    # integral double as an integer. (So the float checker is for float
    # answers: on integer answers it takes a wrong one printed as a float.)
    # Decimal, not int(): int() refuses strings past 4,300 digits.
    if _INTEGER.fullmatch(actual) and _INTEGER.fullmatch(expected):
        return Decimal(actual) == Decimal(expected)
    got, want = float(actual), float(expected)
    # Tokens past the float range (1e999) parse as inf: unequal strings, unequal numbers.
    return math.isfinite(got) and math.isfinite(want) and _close(got, want, tolerance)


# CodeContests' tester (google-deepmind/code_contests, execution/tester_sandboxer.cc: OutputsMatch, SplitAndLowercase,
# ValuesMatch) splits at these five characters only (absl::ByAnyChar(" \n\t\r\v")) and lower-cases ASCII letters only
# (absl::AsciiStrToLower): a form feed or a no-break space stays inside a token, and "É" is not "é".
_CODE_CONTESTS_TOKEN = re.compile(r"[^ \n\t\r\v]+")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# What absl::SimpleAtod reads besides a decimal number (lower-cased here): infinities and NaNs, a NaN with a payload.
# They are numbers there, and their difference with anything is never below the tolerance: they never match per token.
_NON_FINITE = re.compile(r"[+-]?(?:inf(?:inity)?|nan(?:\(\w*\))?)", re.ASCII)
# ValuesMatch's kDoublePrecision: absolute, and strictly below.
_CODE_CONTESTS_TOLERANCE = 1e-5


def _code_contests_value(token: str) -> float | None:
    """A lower-cased token as a number the way CodeContests' tester reads one; None for a word."""
    if _NUMBER.fullmatch(token):
        return float(token)  # past the double range: inf, as absl's
    return math.nan if _NON_FINITE.fullmatch(token) else None


def _code_contests_token(actual: str, expected: str) -> bool:
    got, want = _code_contests_value(actual), _code_contests_value(expected)
    if got is None or want is None:
        return actual == expected
    # Two integers compare exactly. The tester compares every number as a double (absl::SimpleAtod reads
    # integers too), so 10^18 + 1 for 10^18 passed there; an off-by-one 64-bit answer written as an integer is
    # not paid here. Written as a double (1e18, 1000000000000000000.0) it is compared as one, as there.
    if _INTEGER.fullmatch(actual) and _INTEGER.fullmatch(expected):
        return Decimal(actual) == Decimal(expected)
    # A NaN, or inf - inf, is never below: as in the tester, a non-finite token matches no token here.
    return abs(got - want) < _CODE_CONTESTS_TOLERANCE


def _tokens_ignore_case(actual: str, expected: str) -> bool:
    got = _CODE_CONTESTS_TOKEN.findall(actual.translate(_ASCII_LOWER))
    want = _CODE_CONTESTS_TOKEN.findall(expected.translate(_ASCII_LOWER))
    if got == want:
        return True
    return len(got) == len(want) and all(_code_contests_token(g, w) for g, w in zip(got, want, strict=True))


def _decimals(tokens: list[str]) -> list[Decimal] | None:
    """A line's tokens as LiveCodeBench's convert_line_to_decimals reads them; None when one is not a number.

    Decimal() keeps the exponent apart from the digits, so 1e999999999 is a short object, and
    comparing two costs their digits, not their magnitude.
    """
    try:
        return [Decimal(token) for token in tokens]
    except (ArithmeticError, ValueError):  # decimal.InvalidOperation is an ArithmeticError
        return None


def _lines_decimal(actual: str, expected: str) -> bool:
    # LiveCodeBench's grade_stdio (lcb_runner/evaluation/testing_util.py): get_stripped_lines, then each pair of
    # lines equal as text, else equal as lists of Decimals (2.0 = 2.00, 1e3 = 1000).
    got = [line.strip() for line in actual.strip().split("\n")]
    want = [line.strip() for line in expected.strip().split("\n")]
    if len(got) != len(want):
        return False
    for got_line, want_line in zip(got, want, strict=True):
        if got_line == want_line:
            continue
        got_tokens, want_tokens = got_line.split(), want_line.split()
        # Counted before any Decimal is made: lists of different lengths are unequal anyway, and a 16 MiB
        # line of output made a Decimal of each of its tokens first, 1.1 s of the agent's event loop per
        # case, which every job of the sandbox waited on (red team). Now a line's Decimals are made only
        # when it holds as many tokens as the expected line.
        if len(got_tokens) != len(want_tokens):
            return False
        got_values, want_values = _decimals(got_tokens), _decimals(want_tokens)
        try:
            # NaN equals nothing, Infinity only Infinity, as Decimal's ==.
            if got_values is None or got_values != want_values:
                return False
        except ArithmeticError:  # a signaling NaN refuses ==; the grader fails the case on its exception
            return False
    return True


def compare_stdout(
    actual: str | bytes, expected: str | bytes, checker: str = "whitespace", tolerance: float = 1e-6
) -> bool:
    """Whether a program's stdout matches the expected output.

    Checkers (``Checker`` in the API, lower-cased without the prefix):

    - ``"whitespace"`` (default, also ``""``/``"unspecified"``): the
      whitespace-separated tokens are equal, so trailing spaces, blank lines,
      ``\\r\\n`` and the final newline do not matter (Codeforces' ``wcmp``).
    - ``"exact"``: byte-for-byte equal.
    - ``"float"``: same tokens, except that two numbers are equal when within
      ``tolerance``, absolute or relative.
    - ``"tokens_ignore_case"`` (CodeContests' tester): tokens split at ASCII
      blanks, equal once ASCII letters are lower-cased, or both numbers less
      than 1e-5 apart (absolute; ``tolerance`` is not used); two integers
      compare exactly, and an infinity or NaN matches only in an output equal
      token for token.
    - ``"lines_decimal"`` (LiveCodeBench's grader): as many lines once the
      output is stripped, each line equal once stripped, or its tokens equal
      as ``Decimal`` numbers (``2.0`` = ``2.00``; NaN equals nothing).

    Bytes are decoded as UTF-8 with replacement.
    """
    if isinstance(actual, bytes):
        actual = actual.decode("utf-8", "replace")
    if isinstance(expected, bytes):
        expected = expected.decode("utf-8", "replace")
    name = (checker or "whitespace").strip().lower().removeprefix("checker_")
    if name in ("whitespace", "unspecified", ""):
        return actual.split() == expected.split()
    if name == "exact":
        return actual == expected
    if name == "float":
        _check_tolerance(tolerance)
        got, want = actual.split(), expected.split()
        return len(got) == len(want) and all(
            _token_close(g, w, tolerance) for g, w in zip(got, want, strict=True)
        )
    if name == "tokens_ignore_case":
        return _tokens_ignore_case(actual, expected)
    if name == "lines_decimal":
        return _lines_decimal(actual, expected)
    raise ValueError(f"unknown checker {checker!r}")


def _json_key(key: Any) -> str | None:
    """The string JSON turns a dict key into, or None when JSON cannot."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, (int, float)):
        return json.dumps(key)
    return None


def _compare(actual: Any, expected: Any, tolerance: float, depth: int) -> bool:
    if depth > 1000:
        return False
    ta, te = type(actual), type(expected)
    # bool first: True must not equal 1, although Python says it does.
    if ta is bool or te is bool:
        return ta is te and actual == expected
    if actual is None or expected is None:
        return actual is None and expected is None
    if te is int and ta in (int, float, complex):
        # An integer answer is exact, as in the datasets' own `==` checks: a
        # tolerance would take float(n * (n + 1) // 2 - 1) for n * (n + 1) // 2.
        # An integral float that equals it exactly (3.0 for 3) still passes.
        return actual == expected
    if ta in (int, float) and te in (int, float):
        try:
            return _close(float(actual), float(expected), tolerance)
        except OverflowError:
            return False
    if ta is complex or te is complex:
        if ta not in (int, float, complex) or te not in (int, float, complex):
            return False
        a, e = complex(actual), complex(expected)
        if cmath.isnan(a) or cmath.isnan(e):
            return cmath.isnan(a) and cmath.isnan(e)
        return cmath.isclose(a, e, rel_tol=tolerance, abs_tol=tolerance)
    if ta in (list, tuple) and te in (list, tuple):
        return len(actual) == len(expected) and all(
            _compare(a, e, tolerance, depth + 1) for a, e in zip(actual, expected, strict=True)
        )
    if ta is dict and te is dict:
        if len(actual) != len(expected):
            return False
        if actual.keys() == expected.keys():
            return all(_compare(actual[k], expected[k], tolerance, depth + 1) for k in expected)
        # Expected values often went through JSON, which turned {1: x} into {"1": x}.
        got = {_json_key(k): k for k in actual}
        want = {_json_key(k): k for k in expected}
        if None in got or None in want or len(got) != len(actual) or got.keys() != want.keys():
            return False
        return all(_compare(actual[got[k]], expected[want[k]], tolerance, depth + 1) for k in want)
    if ta in (set, frozenset) and te in (set, frozenset):
        # Python's own == would take {True} for {1}, as it would True for 1.
        return len(actual) == len(expected) and _set_items(actual) == _set_items(expected)
    if ta in (str, bytes) and ta is te:
        return actual == expected
    return False


def _set_item(item: Any) -> Any:
    """`item` as a set member that equals another only when `_compare` would: bools apart from numbers."""
    kind = type(item)
    if kind is bool:
        return (bool, item)
    if kind is tuple:
        return (tuple, tuple(_set_item(part) for part in item))
    if kind is frozenset:
        return (frozenset, _set_items(item))
    return item


def _set_items(items: set[Any] | frozenset[Any]) -> frozenset[Any]:
    return frozenset(_set_item(item) for item in items)


def compare_values(actual: Any, expected: Any, tolerance: float = 1e-6) -> bool:
    """Whether a decoded return value equals the expected value, on plain data only.

    Rules: a list equals a tuple with equal items (JSON has no tuples); an
    expected ``int`` is matched exactly (``3`` or ``3.0``, never ``2.9999999``);
    an expected ``float`` matches a number within ``tolerance`` (absolute or
    relative); NaN equals NaN; ``bool`` never equals a
    number (``True != 1`` here); dicts compare key by key, and when the key
    sets differ they are compared as JSON would write them (``{1: x}`` equals
    ``{"1": x}``); sets compare exactly; ``str`` and ``bytes`` never equal each
    other. Any other type (anything that is not plain data) is never equal, so
    objects with a lying ``__eq__`` cannot pass.
    """
    _check_tolerance(tolerance)
    return _compare(actual, expected, tolerance, 0)


def score(passed: int, total: int, mode: str = "binary", failure_value: float = -1.0) -> float:
    """The reward for ``passed`` of ``total`` tests; never NaN.

    ``"binary"`` (default, also ``""``/``"unspecified"``): 1.0 when every test
    passed, else ``failure_value``. ``"fraction"``: ``passed / total``, or
    ``failure_value`` when nothing passed. No tests (``total <= 0``) always
    scores ``failure_value``. Raises ``ValueError`` for an unknown mode or a
    non-finite failure value.
    """
    if not math.isfinite(failure_value):
        raise ValueError(f"failure_value must be finite, got {failure_value!r}")
    name = (mode or "binary").strip().lower().removeprefix("reward_mode_")
    if name not in ("binary", "unspecified", "", "fraction"):
        raise ValueError(f"unknown reward mode {mode!r}")
    if total <= 0 or passed <= 0:
        return float(failure_value)
    if name == "fraction":
        return min(passed, total) / total
    return 1.0 if passed >= total else float(failure_value)
