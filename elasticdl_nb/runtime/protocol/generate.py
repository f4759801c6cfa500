"""Regenerate (or, with --check, verify) the Python stubs of `elasticdl.proto`.

Run from anywhere: `python -m elasticdl_nb.runtime.protocol.generate [--check]`.
Needs `grpcio-tools` (a test dependency, not a runtime one).
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]  # the directory that holds the `elasticdl_nb` package
PROTO = HERE / "elasticdl.proto"
STUBS = ("elasticdl_pb2.py", "elasticdl_pb2_grpc.py")


def _generate(out_dir: Path) -> None:
    from grpc_tools import protoc

    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO.relative_to(ROOT)),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {PROTO}")


def stale_stubs() -> list[str]:
    """Names of the committed stubs that differ from what the .proto generates now."""
    with tempfile.TemporaryDirectory() as tmp:
        _generate(Path(tmp))
        fresh = Path(tmp) / PROTO.parent.relative_to(ROOT)
        return [n for n in STUBS if not filecmp.cmp(fresh / n, HERE / n, shallow=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the stubs are stale")
    if parser.parse_args().check:
        stale = stale_stubs()
        if stale:
            sys.exit(f"stale stubs {stale}: run python -m elasticdl_nb.runtime.protocol.generate")
        print("stubs are current")
    else:
        _generate(ROOT)
        print(f"generated {', '.join(STUBS)} in {HERE}")


if __name__ == "__main__":
    main()
