"""`sandboxd`: serve, status, score, bench."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from sandboxd.errors import SandboxdError

if TYPE_CHECKING:
    from sandboxd.config import Config

SERVE_FLAGS = {
    "socket": "server.socket",
    "tcp": "server.tcp",
    "metrics": "server.metrics",
    "log_format": "server.log_format",
    "log_level": "server.log_level",
    "docker_url": "docker.url",
    "min_size": "pool.min_size",
    "max_size": "pool.max_size",
    "snapshots": "pool.snapshots",
    "state_dir": "sandbox.state_dir",
    "run_dir": "sandbox.run_dir",
}

SERVE_HELP = {
    "socket": 'Unix socket to serve gRPC on; "" for none',
    "tcp": 'host:port to serve gRPC on as well, e.g. 127.0.0.1:50051; "" for none',
    "metrics": 'host:port of the Prometheus endpoint; "" disables it',
    "log_format": "json or text",
    "log_level": "debug, info, warning or error",
    "docker_url": "the Docker engine",
    "min_size": "warm sandboxes per pool with no batch hint",
    "max_size": "sandboxes per pool at most; 0: twice the CPUs",
    "snapshots": "true or false: CRIU snapshots of warm sandboxes",
    "state_dir": "agent code and snapshots",
    "run_dir": "the sandboxes' control sockets (at most 72 characters)",
}


def serve_flag_help(flag: str, defaults: Config) -> str:
    """What a serve flag takes, the key it sets and that key's default (from Config, so they cannot drift)."""
    dotted = SERVE_FLAGS[flag]
    section, _, key = dotted.partition(".")
    default = getattr(getattr(defaults, section), key)
    shown = str(default).lower() if isinstance(default, bool) else default if default != "" else '""'
    return f"{SERVE_HELP[flag]} ({dotted}, default {shown})"


def _serve(args: argparse.Namespace) -> int:
    from sandboxd import config as config_module
    from sandboxd import logs

    overrides: dict[str, Any] = {}
    for flag, dotted in SERVE_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            overrides[dotted] = value
    try:
        config = config_module.load(args.config, overrides=overrides)
        logs.setup(config.server.log_format, config.server.log_level)
        from sandboxd.daemon import Daemon

        daemon = Daemon(config)
        import uvloop

        uvloop.run(daemon.run())
    except SandboxdError as exc:
        print(f"sandboxd: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _status(args: argparse.Namespace) -> int:
    from sandboxd_client import SandboxClient
    from sandboxd_client.errors import SandboxdError as ClientError

    try:
        with SandboxClient(args.address) as client:
            info = client.info()
            status = client.pool_status()
    except ClientError as exc:
        print(f"sandboxd: error: {exc}", file=sys.stderr)
        return 1
    print(f"sandboxd {info.version}  languages: {', '.join(info.languages) or '-'}")
    print(f"snapshots: {'on' if info.snapshots else 'off'} ({info.snapshot_state})")
    print(f"queue: {status.queue_depth}  in flight: {status.in_flight}  jobs: {status.jobs_total}  "
          f"throughput: {status.jobs_per_second:.1f}/s")
    print(f"{'pool':8} {'target':>6} {'ready':>6} {'busy':>5} {'start':>6} {'jobs':>8} {'recycled':>8}  "
          f"{'starts by':36}  snapshot")
    for pool in status.pools:
        print(f"{pool.name:8} {pool.target:6d} {pool.ready:6d} {pool.busy:5d} {pool.starting:6d} "
              f"{pool.jobs_total:8d} {pool.recycled_total:8d}  {_start_note(pool):36}  {pool.snapshot}")
    for pool in status.pools:
        if pool.start_failures:
            state = "FAILING, its jobs are answered SANDBOX_LOST" if pool.failing else "retrying"
            print(f"pool {pool.name}: {pool.start_failures} sandbox starts failed in a row ({state}); "
                  f"the last: {pool.start_error}")
    return 0


def _start_note(pool: Any) -> str:
    """"restore (1.02 s; cold 0.31 s)": the method in use and the recent medians behind the choice."""
    times = [f"{method} {seconds:.2f} s" for method, seconds in (("restore", pool.restore_seconds),
                                                                    ("cold", pool.cold_seconds)) if seconds]
    return f"{pool.start_method} ({'; '.join(times)})" if times else pool.start_method


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sandboxd", description="Sandboxed verifiers for RL post-training.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the daemon")
    serve.add_argument("--config", help="TOML file (default: none; SANDBOXD_CONFIG)")
    from sandboxd.config import Config

    defaults = Config()  # one for all the flags' help
    for flag in SERVE_FLAGS:
        kind = int if flag in ("min_size", "max_size") else str
        # The README sends users here for flags: each names what it takes and its default, not a bare name.
        serve.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=kind, default=None,
                           help=serve_flag_help(flag, defaults))
    serve.set_defaults(handler=_serve)
    status = commands.add_parser("status", help="pools, sandboxes, snapshots, queue, throughput")
    status.add_argument("--address", default=None, help="default: SANDBOXD_ADDRESS or the local socket")
    status.set_defaults(handler=_status)
    from sandboxd import score as score_command

    score_command.add_parser(commands)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
