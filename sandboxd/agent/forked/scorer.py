"""The reward-model scorer: loads the model, then scores batch after batch (host/rewardmodel.py starts and feeds it).

Started as ``python -m sandboxd.agent.forked.scorer`` by the controller, once
per sandbox, so that torch stays out of the controller and the zygote.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
import traceback

from sandboxd.agent.protocol import recv_frame, send_frame
from sandboxd.verifiers import rewardmodel

# The scorer's uid once the model is loaded: outside the job uid range (20000+).
SCORER_UID = 19999


def _drop_privileges() -> None:
    os.setgroups([])
    os.setresgid(SCORER_UID, SCORER_UID, SCORER_UID)
    os.setresuid(SCORER_UID, SCORER_UID, SCORER_UID)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sandboxd-reward-model")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--settings", required=True)
    args = parser.parse_args(argv)
    channel = socket.socket(fileno=args.fd)
    try:
        settings = rewardmodel.ScorerSettings.from_dict(json.loads(args.settings))
        model = rewardmodel.load(settings)
    except BaseException as exc:
        traceback.print_exc()
        send_frame(channel, {"failed": f"{type(exc).__name__}: {exc}"[:2000]})
        return
    send_frame(channel, {"ready": model.describe()})
    while True:
        try:
            request = recv_frame(channel)
        except EOFError:
            return
        # The weights are in memory (or mapped): nothing from here on needs root. Not
        # earlier: a snapshot is taken between `ready` and the first batch, and CRIU on a
        # host without CAP_SYS_RESOURCE cannot dump a process of another uid ("Can't get
        # rlimit"), so the template's scorer must still be root then.
        if os.geteuid() == 0:
            _drop_privileges()
        pairs = [(str(prompt), str(completion)) for prompt, completion in request["pairs"]]
        started = time.perf_counter()
        scores = model.score(pairs)
        send_frame(channel, {"scores": [score.to_dict() for score in scores],
                             "seconds": time.perf_counter() - started})


if __name__ == "__main__":
    main()
