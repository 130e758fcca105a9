"""`python -m sandboxd.agent`: the entry point of every sandbox container."""

from __future__ import annotations

import argparse
import json

from sandboxd.agent.forked import zygote

# The binary whose presence says a language is usable in this image.
TOOLCHAINS = {
    "python": "python3",
    "cpp": "g++",
    "c": "gcc",
    "java": "javac",
    "javascript": "node",
    "typescript": "node",
    "go": "go",
    "rust": "rustc",
    "bash": "bash",
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="sandboxd-agent")
    parser.add_argument("--socket", default="/run/sandboxd-agent/agent.sock")
    parser.add_argument("--warm", default="", help="comma-separated modules to import and warm()")
    parser.add_argument("--math-servers", type=int, default=1,
                        help="math servers to keep warm per memory limit (the sandbox's CPUs)")
    parser.add_argument("--math-memory", type=int, default=0,
                        help="start the math servers for this memory limit (bytes) at prepare, before the first job")
    parser.add_argument("--private-tmp", action="store_true",
                        help="make /tmp root-only (0755): jobs then have no shared place to leave files")
    parser.add_argument("--reward-model", default="", metavar="JSON",
                        help="load this reward model (settings as JSON) and serve reward_model jobs")
    args = parser.parse_args()
    warm = [name for name in args.warm.split(",") if name]
    reward_model = json.loads(args.reward_model) if args.reward_model else None
    # The zygote is forked before asyncio and the controller are imported:
    # none of their memory is then copied into (and torn down after) every worker.
    zygote_process = zygote.spawn(warm)
    import asyncio

    from sandboxd.agent.host.controller import MathSettings, serve

    math = MathSettings(args.math_servers, args.math_memory)
    asyncio.run(serve(args.socket, zygote_process, TOOLCHAINS, reward_model, math, private_tmp=args.private_tmp))


if __name__ == "__main__":
    main()
