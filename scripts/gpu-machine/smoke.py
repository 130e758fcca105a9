"""Step-by-step checks of the engine and its CDI GPU: ``smoke.py IMAGE``; prints every outcome, stops at none.

From a plain container up to one with the sandbox's hardening (read-only root, no
capabilities, no-new-privileges, memory and pids limits) running CUDA, so that a failure
names the first option that breaks the GPU.
"""

from __future__ import annotations

import sys
import time

import docker
from docker.types import DeviceRequest

CDI = [DeviceRequest(driver="cdi", device_ids=["nvidia.com/gpu=0"])]
CUDA = ("import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0)); "
        "x = torch.ones(1024, 1024, device='cuda'); print(float((x @ x).sum()))")
HARDENED = {"read_only": True, "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"], "mem_limit": 8 << 30,
            "memswap_limit": 8 << 30, "pids_limit": 512, "nano_cpus": 2_000_000_000, "tmpfs": {"/tmp": "size=1g"}}
CHECKS = [
    ("a plain container", ["true"], {}),
    ("no GPU without the device", ["sh", "-c", "ls /dev | grep nvidia || echo none"], {}),
    ("the CDI device", ["sh", "-c", "ls /dev | grep nvidia; nvidia-smi -L"], {"device_requests": CDI}),
    ("CUDA through CDI", ["python3", "-c", CUDA], {"device_requests": CDI}),
    ("CUDA through CDI, hardened", ["python3", "-c", CUDA], {"device_requests": CDI, **HARDENED}),
]


def main(image: str) -> None:
    client = docker.from_env(timeout=300)
    info = client.info()
    print(f"engine {info.get('ServerVersion')}, storage {info.get('Driver')}, cgroup v{info.get('CgroupVersion')}, "
          f"CDI spec dirs {info.get('CDISpecDirs')}, runtimes {sorted(info.get('Runtimes', {}))}")
    for name, command, options in CHECKS:
        started = time.monotonic()
        try:
            out = client.containers.run(image, command, remove=True, stderr=True, network_mode="none", **options)
            print(f"ok   {name} ({time.monotonic() - started:.1f} s): {out.decode(errors='replace').strip()[-600:]}")
        except docker.errors.DockerException as exc:
            print(f"FAIL {name} ({time.monotonic() - started:.1f} s): {str(exc)[-900:]}")


if __name__ == "__main__":
    main(sys.argv[1])
