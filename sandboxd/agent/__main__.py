"""`python -m sandboxd.agent`: the entry point of every sandbox container."""

from __future__ import annotations

import argparse
import asyncio

from sandboxd.agent.controller import serve

# The binary whose presence says a language is usable in this image.
TOOLCHAINS = {
    "python": "python3",
    "cpp": "g++",
    "c": "gcc",
    "java": "javac",
    "javascript": "node",
    "go": "go",
    "rust": "rustc",
    "bash": "bash",
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="sandboxd-agent")
    parser.add_argument("--socket", default="/run/sandboxd-agent/agent.sock")
    parser.add_argument("--warm", default="", help="comma-separated modules to import and warm()")
    args = parser.parse_args()
    warm = [name for name in args.warm.split(",") if name]
    asyncio.run(serve(args.socket, warm, TOOLCHAINS))


if __name__ == "__main__":
    main()
