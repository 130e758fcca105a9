"""Import this machine's root filesystem as a Docker image: ``import_root.py REPO:TAG``.

The lent GPU machine reaches no registry and no PyPI, but its own Python has a CUDA torch and
transformers: its root, streamed through tar into ``docker import``, is an image the
reward-model sandbox can run (the daemon mounts the agent's code; the image needs only
python3 and the libraries). Left out: the kernel's and the engine's folders, caches, this
checkout, the driver (the CDI spec mounts it) and large packages no reward model imports.
About 14 GiB and 85-100 s on the H100 machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import docker

EXCLUDED = ["proc", "sys", "dev", "tmp", "run", "var/lib/docker", "opt/engine", "usr/local/nvidia", "root/.cache",
            "var/cache", "var/log", "mnt", "media", "boot"]
UNUSED_PACKAGES = ["jax", "jaxlib", "jax_cuda13_pjrt", "jax_cuda13_plugin", "jax_plugins", "cupy", "cupy_backends",
                   "tensorstore", "onnxruntime", "cv2", "opencv_python_headless.libs", "pyarrow", "torch_geometric",
                   "flax", "orbax", "numba", "numba_cuda", "llvmlite", "tensorboard", "botorch", "gpytorch", "pyro",
                   "numpyro", "skimage", "sklearn", "statsmodels", "matplotlib"]


def main(reference: str) -> None:
    repository, tag = reference.rsplit(":", 1)
    excluded = [*EXCLUDED, os.getcwd().lstrip("/")]
    command = ["tar", "-C", "/", "-cf", "-", "--numeric-owner", "--ignore-failed-read",
               "--warning=no-file-changed", "--warning=no-file-removed",
               *(f"--exclude=./{path}" for path in excluded),
               *(f"--exclude=*/site-packages/{name}" for name in UNUSED_PACKAGES), "."]
    # The interpreter running this script is the one with CUDA torch: first on the image's PATH.
    path = f"{os.path.dirname(sys.executable)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    changes = [f"ENV PATH={path}", "ENV PYTHONUNBUFFERED=1 LANG=C.UTF-8", "WORKDIR /tmp", 'CMD ["python3"]']
    if os.environ.get("LD_LIBRARY_PATH"):
        changes.append(f"ENV LD_LIBRARY_PATH={os.environ['LD_LIBRARY_PATH']}")
    started = time.monotonic()
    tar = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=1 << 20)
    api = docker.APIClient(timeout=3600)
    api.import_image_from_stream(tar.stdout, repository=repository, tag=tag, changes=changes)
    tar.wait()
    size = api.inspect_image(reference)["Size"] / 2**30
    print(f"imported {reference} in {time.monotonic() - started:.0f} s: {size:.1f} GiB; {changes}")


if __name__ == "__main__":
    main(sys.argv[1])
