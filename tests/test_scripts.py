"""scripts/: the host setup's own logic, run for real with stand-ins for the network and the compiler."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# A CRIU source tree whose Makefile builds a stand-in criu: what build-criu.sh does with a real one (unpack, make,
# install, `criu check`) runs as it would, in a second instead of 25.
STAND_IN_CRIU = "#!/bin/sh\ncase \"$1\" in check) echo 'Looks good.';; --version) echo 'Version: 4.1.1';; esac\n"
MAKEFILE = "criu:\n\tmkdir -p criu\n\tprintf '%s' \"$$STAND_IN\" > criu/criu\n\tchmod +x criu/criu\n"


def source_tarball() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in (("criu-4.1.1/Makefile", MAKEFILE), ("criu-4.1.1/README", "CRIU\n" * 2000)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.skipif(os.geteuid() != 0, reason="build-criu.sh needs root")
@pytest.mark.skipif(shutil.which("make") is None, reason="build-criu.sh builds with make")
def test_build_criu_fetches_a_damaged_cached_tarball_again(tmp_path: Path) -> None:
    """A download cut short left a truncated tarball in the cache, which every later run found and failed to
    unpack: CRIU was never built again, and sandboxd ran without snapshots, until the cache was removed by hand."""
    good = source_tarball()
    (tmp_path / "good.tar.gz").write_bytes(good)
    cache, prefix, stand_ins = tmp_path / "cache", tmp_path / "sbin", tmp_path / "bin"
    cache.mkdir()
    stand_ins.mkdir()
    (cache / "criu_4.1.1.orig.tar.gz").write_bytes(good[: len(good) // 2])
    # apt-get: `source` brings the good tarball (into the current folder, as apt does); the rest does nothing.
    apt_get = stand_ins / "apt-get"
    apt_get.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/apt-calls\n'
                       f'case " $* " in *" source "*) cp {tmp_path}/good.tar.gz criu_4.1.1.orig.tar.gz;; esac\n')
    apt_get.chmod(0o755)
    run = subprocess.run(["bash", str(REPO / "scripts" / "build-criu.sh"), "--cache", str(cache), "--prefix",
                          str(prefix)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PATH": f"{stand_ins}:{os.environ['PATH']}", "STAND_IN": STAND_IN_CRIU})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "criu_4.1.1.orig.tar.gz is damaged: fetching it again" in run.stderr
    assert "source --download-only criu/trixie" in (tmp_path / "apt-calls").read_text()
    assert (cache / "criu_4.1.1.orig.tar.gz").read_bytes() == good
    assert subprocess.run([str(prefix / "criu"), "check"], capture_output=True, text=True).stdout == "Looks good.\n"
    again = subprocess.run(["bash", str(REPO / "scripts" / "build-criu.sh"), "--cache", str(cache), "--prefix",
                            str(prefix)], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PATH": f"{stand_ins}:{os.environ['PATH']}"})
    assert again.returncode == 0 and "reusing the build" in again.stdout, again.stdout + again.stderr
