"""Languages: how to build and run a program in each language, and the names a request may give one.

:data:`LANGUAGES` holds one :class:`Language` per language; :func:`resolve_language` takes a name or
alias and adapts the entry to the program where its file names depend on it (Java's classes, ES
modules). The image-build settings (``CPP_FLAGS``, ``JAVAC_*``, ``GO_*``, ``NODE_BLOCKING_STDIO``) are
read by :mod:`sandboxd.images` too, for the langs image's build arguments.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass


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
# arguments JAVAC_JIT_FLAGS and JAVAC_CLASS_ARCHIVE; a JVM without the file starts
# without it, silently). Together they halve a compile's CPU time (a 15-line program:
# about 0.35 CPU seconds; 400 methods: 1.2).
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
        # c11, strdup() is implicitly declared and its pointer cut to an int (SIGSEGV
        # in a correct program), and M_PI is undeclared. C++20, not 17: models
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
        # that ends with process.exit() loses all but the first 64 KiB of its
        # output (a judge's file would have taken it all). The preload makes
        # stdout and stderr blocking, as Node makes them for files.
        # --stack-size: V8 stops at its own limit, 984 KiB, whatever the process's
        # stack: a recursion 1e5 deep is a RangeError. The stack an exec'd run
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
        # does: a run that transforms the types itself takes about three times as long
        # (the transform loads its compiler, about 35 ms, every time). A syntax error is a
        # compile error. The transform's warning that it is experimental would be the
        # compile's output.
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
# possessive: in a text ending in one ('"' + '\\"' * n + '\\') every opening
# quote would otherwise scan to the end and back (64 KB: tens of seconds).
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
    repeated takes minutes with a scan per class, on the daemon's event loop.
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
