"""Print a CDI spec for this machine's NVIDIA GPUs: ``nvidia.com/gpu=0``, ``=1``, ... and ``=all``.

What ``nvidia-ctk cdi generate`` writes, reduced to what a CUDA program needs: each GPU's device
node, the control nodes (nvidiactl, nvidia-uvm) and the driver's user-space libraries mounted
read-only at the paths they have here, without the toolkit's ldconfig hook (the image's
LD_LIBRARY_PATH or its loader cache already names those folders). A node with the NVIDIA
Container Toolkit should use ``nvidia-ctk`` instead; this is for a machine without it.
"""

from __future__ import annotations

import glob
import json
import os
import sys

CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
LIBRARIES = ("libcuda.so*", "libcudadebugger.so*", "libnvidia-ml.so*", "libnvidia-ptxjitcompiler.so*",
             "libnvidia-nvvm.so*", "libnvidia-gpucomp.so*", "libnvidia-cfg.so*")
LIBRARY_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64")
READ_ONLY = ["ro", "nosuid", "nodev", "bind"]


def spec() -> dict:
    gpus = sorted(glob.glob("/dev/nvidia[0-9]*"), key=lambda path: int(path[len("/dev/nvidia"):]))
    folders = [folder for folder in LIBRARY_DIRS if os.path.isdir(folder)]
    mounts = [{"hostPath": os.path.realpath(path), "containerPath": path, "options": READ_ONLY}
              for folder in folders for pattern in LIBRARIES for path in sorted(glob.glob(f"{folder}/{pattern}"))]
    for tool in ("/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi"):
        if os.path.exists(tool):
            mounts.append({"hostPath": os.path.realpath(tool), "containerPath": "/usr/bin/nvidia-smi",
                           "options": READ_ONLY})
            break
    driver_folders = [folder for folder in folders if folder.startswith("/usr/local/nvidia")]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": str(index), "containerEdits": {"deviceNodes": [{"path": gpu}]}}
                    for index, gpu in enumerate(gpus)]
                   + [{"name": "all", "containerEdits": {"deviceNodes": [{"path": gpu} for gpu in gpus]}}],
        "containerEdits": {
            "deviceNodes": [{"path": node} for node in CONTROL_NODES if os.path.exists(node)],
            "mounts": mounts,
            "env": [f"LD_LIBRARY_PATH={':'.join(driver_folders)}"] if driver_folders else [],
        },
    }


if __name__ == "__main__":
    generated = spec()
    json.dump(generated, sys.stdout, indent=1)
    edits = generated["containerEdits"]
    print(f"cdi: {len(generated['devices']) - 1} GPU(s), {len(edits['deviceNodes'])} control nodes, "
          f"{len(edits['mounts'])} mounts", file=sys.stderr)
