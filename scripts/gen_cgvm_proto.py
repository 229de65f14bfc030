#!/usr/bin/env python
"""Regenerate cgvm/ir/cgvm_pb2.py (the IR's serialized form) from proto/cgvm.proto.

Runs protoc from grpcio-tools (`python -m grpc_tools.protoc`), then edits its output so the
checked-in module imports on every protobuf runtime from 4.21 on: newer protoc emits a call that
refuses any runtime older than itself (protobuf's "gencode not newer than runtime" policy), and this
module only needs what 4.21 already has (`AddSerializedFile` and `internal.builder`), so the call is
dropped. tests/ir/test_serialize.py checks that the file matches a fresh generation.

    python scripts/gen_cgvm_proto.py           # rewrite cgvm/ir/cgvm_pb2.py
    python scripts/gen_cgvm_proto.py --check   # exit 1 if cgvm_pb2.py is out of date
"""
from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_FILE = REPO_ROOT / "proto" / "cgvm.proto"
OUTPUT_FILE = REPO_ROOT / "cgvm" / "ir" / "cgvm_pb2.py"

_RUNTIME_CHECK = re.compile(
    r"^from google\.protobuf import runtime_version as _runtime_version\n"
    r"|^_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:[ \t].*\n)*?\)\n",
    re.MULTILINE,
)
_NOT_CHECKED_IN_MARKER = "# NO CHECKED-IN PROTOBUF GENCODE\n"


def protoc_version() -> str:
    """The version line of the protoc bundled with grpcio-tools, e.g. 'libprotoc 35.1'."""
    result = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "--version"],
        capture_output=True, text=True, check=True,
    )
    return result.stdout.strip()


def _header() -> str:
    tools = importlib.metadata.version("grpcio-tools")
    return (
        f"# cgvm: generated from proto/cgvm.proto by scripts/gen_cgvm_proto.py with\n"
        f"# {protoc_version()} (grpcio-tools {tools}); edit the .proto and rerun, never this file.\n"
        f"# Imports on protobuf >= 4.21 (the runtime-version gate protoc emits is removed).\n"
    )


def generate_source(proto_file: Path = PROTO_FILE) -> str:
    """Run protoc on `proto_file` and return the post-processed text of its `_pb2` module."""
    with tempfile.TemporaryDirectory() as out_dir:
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_file.parent}",
             f"--python_out={out_dir}", str(proto_file)],
            check=True,
        )
        generated = Path(out_dir) / (proto_file.stem + "_pb2.py")
        source = generated.read_text(encoding="utf-8")
    source = source.replace(_NOT_CHECKED_IN_MARKER, "")
    source = _RUNTIME_CHECK.sub("", source)
    first_line, _, rest = source.partition("\n")  # keep the coding line first
    return first_line + "\n" + _header() + rest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only compare with the checked-in module; exit 1 if it differs")
    args = parser.parse_args(argv)
    source = generate_source()
    if args.check:
        current = OUTPUT_FILE.read_text(encoding="utf-8") if OUTPUT_FILE.exists() else ""
        if current != source:
            print(f"{OUTPUT_FILE.relative_to(REPO_ROOT)} is out of date; "
                  f"run python scripts/gen_cgvm_proto.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT_FILE.write_text(source, encoding="utf-8")
    print(f"wrote {OUTPUT_FILE.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
