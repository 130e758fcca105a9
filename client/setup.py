"""Generates the gRPC stubs from protos/ at build (and editable install) time.

The stubs are never committed: the .proto files are the contract, and the
generated code must match the grpcio-tools that built it.
"""

import re
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# In a git checkout the contract lives at the repository root; an sdist carries a copy.
PROTO_ROOTS = [HERE.parent / "protos", HERE / "protos"]
OUT = HERE / "sandboxd_client" / "_proto"


def generate_stubs() -> None:
    from grpc_tools import protoc

    root = next((p for p in PROTO_ROOTS if p.is_dir()), None)
    if root is None:
        raise SystemExit(f"protos/ not found in {PROTO_ROOTS}")
    protos = sorted(str(p.relative_to(root)) for p in root.rglob("*.proto"))
    OUT.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{root}", f"-I{Path(protoc.__file__).parent / '_proto'}",
            f"--python_out={OUT}", f"--pyi_out={OUT}", f"--grpc_python_out={OUT}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # protoc writes absolute imports (`from sandboxd.v1 import ...`) that would
    # resolve to the daemon package; make them relative to the stub folder.
    for path in OUT.rglob("*_pb2*.py"):
        text = re.sub(r"^from sandboxd\.v1 import", "from . import", path.read_text(), flags=re.M)
        path.write_text(text)
    for folder in [OUT, *[p for p in OUT.rglob("*") if p.is_dir()]]:
        (folder / "__init__.py").touch()


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        generate_stubs()
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
