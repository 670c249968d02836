"""Build step for the moebatch client: generates the gRPC modules from the API proto.

build_py (used by `pip install`, `pip install -e` and wheel builds) runs grpcio-tools' protoc on
moebatch/v1/batch.proto and writes src/moebatch/v1/batch_pb2.py, batch_pb2.pyi and
batch_pb2_grpc.py (ignored by git) before the package is assembled. The proto is looked up in:

  1. $MOEBATCH_PROTO_DIR (a directory holding moebatch/v1/batch.proto);
  2. ./proto, next to this file: the copy that `sdist` puts into a source distribution;
  3. ../../proto: the repository's proto/ when building from a checkout (pip builds a local
     directory in place, so this holds for `pip install ./client/python` from the repo root).

Everything else about the package is in pyproject.toml.
"""
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

HERE = Path(__file__).resolve().parent
PROTO = Path("moebatch") / "v1" / "batch.proto"
GENERATED = ("batch_pb2.py", "batch_pb2.pyi", "batch_pb2_grpc.py")


def find_proto_root() -> Path:
    candidates = []
    if os.environ.get("MOEBATCH_PROTO_DIR"):
        candidates.append(Path(os.environ["MOEBATCH_PROTO_DIR"]))
    candidates += [HERE / "proto", HERE.parent.parent / "proto"]
    for root in candidates:
        if (root / PROTO).is_file():
            return root.resolve()
    tried = ", ".join(str(c / PROTO) for c in candidates)
    raise SystemExit(
        f"moebatch build: cannot find {PROTO} (tried {tried}); build from the repository "
        "checkout or set MOEBATCH_PROTO_DIR to the directory that holds moebatch/v1/batch.proto"
    )


def generate_grpc_modules(out_root: Path) -> None:
    """Writes out_root/moebatch/v1/batch_pb2{.py,.pyi,_grpc.py} from the proto."""
    import importlib.resources

    from grpc_tools import protoc

    proto_root = find_proto_root()
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        str(proto_root / PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"moebatch build: protoc failed on {proto_root / PROTO}")
    for name in GENERATED:
        if not (out_root / "moebatch" / "v1" / name).is_file():
            raise SystemExit(f"moebatch build: protoc did not write moebatch/v1/{name}")


class build_py(_build_py):
    """Generates the generated modules into the source tree (src/, ignored by git), then builds as usual.

    Writing into src/ rather than build/ serves editable installs too, which import from src/.
    """

    def run(self):
        generate_grpc_modules(HERE / "src")
        super().run()


class sdist(_sdist):
    """Ships the proto (./proto/moebatch/v1/batch.proto) instead of generated modules."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        dest = Path(base_dir) / "proto" / PROTO
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(find_proto_root() / PROTO, dest)
        for name in GENERATED:
            stale = Path(base_dir) / "src" / "moebatch" / "v1" / name
            if stale.exists():
                stale.unlink()


setup(cmdclass={"build_py": build_py, "sdist": sdist})
