#!/usr/bin/env python
"""Regenerate the checked-in protobuf modules from proto/*.proto.

    python scripts/gen_proto.py              # rewrite every *_pb2.py
    python scripts/gen_proto.py caffe        # only cgvm/frontends/caffe/caffe_pb2.py
    python scripts/gen_proto.py --check      # exit 1 if a checked-in module is out of date

Runs protoc from grpcio-tools (`python -m grpc_tools.protoc`), then edits its output so the
module imports on every protobuf runtime from 4.21 on: newer protoc emits a call that refuses any
runtime older than itself ("gencode not newer than runtime"), and these modules only need what
4.21 already has (`AddSerializedFile` and `internal.builder`), so the call is dropped. Tests check
that each checked-in module matches a fresh generation.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent
TARGETS: Dict[str, Tuple[Path, Path]] = {
    "caffe": (REPO_ROOT / "proto" / "caffe.proto", REPO_ROOT / "cgvm" / "frontends" / "caffe" / "caffe_pb2.py"),
    "cgvm": (REPO_ROOT / "proto" / "cgvm.proto", REPO_ROOT / "cgvm" / "ir" / "cgvm_pb2.py"),
}

_RUNTIME_CHECK = re.compile(
    r"^from google\.protobuf import runtime_version as _runtime_version\n"
    r"|^_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:[ \t].*\n)*?\)\n",
    re.MULTILINE,
)
_NOT_CHECKED_IN_MARKER = "# NO CHECKED-IN PROTOBUF GENCODE\n"


def protoc_version() -> str:
    """The version line of the protoc bundled with grpcio-tools, e.g. 'libprotoc 35.1'."""
    result = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "--version"],
                            capture_output=True, text=True, check=True)
    return result.stdout.strip()


def output_file(target: str) -> Path:
    return TARGETS[target][1]


def generate_source(target: str) -> str:
    """Run protoc for ``target`` and return the post-processed text of its `_pb2` module."""
    proto_file, _ = TARGETS[target]
    with tempfile.TemporaryDirectory() as out_dir:
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_file.parent}",
                        f"--python_out={out_dir}", str(proto_file)], check=True)
        source = (Path(out_dir) / (proto_file.stem + "_pb2.py")).read_text(encoding="utf-8")
    source = _RUNTIME_CHECK.sub("", source.replace(_NOT_CHECKED_IN_MARKER, ""))
    header = (f"# cgvm: generated from proto/{proto_file.name} by scripts/gen_proto.py with\n"
              f"# {protoc_version()} (grpcio-tools {importlib.metadata.version('grpcio-tools')}); edit the .proto "
              "and rerun, never this file.\n"
              "# Imports on protobuf >= 4.21 (the runtime-version gate protoc emits is removed).\n")
    first_line, _, rest = source.partition("\n")  # keep the coding line first
    return first_line + "\n" + header + rest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help=f"some of {sorted(TARGETS)} (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="only compare with the checked-in modules; exit 1 if one differs")
    args = parser.parse_args(argv)
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown target {sorted(unknown)[0]!r}; choose from {sorted(TARGETS)}")
    stale = 0
    for target in args.targets or list(TARGETS):
        source, out = generate_source(target), output_file(target)
        if args.check:
            if not out.exists() or out.read_text(encoding="utf-8") != source:
                print(f"{out.relative_to(REPO_ROOT)} is out of date; run python scripts/gen_proto.py", file=sys.stderr)
                stale = 1
            continue
        out.write_text(source, encoding="utf-8")
        print(f"wrote {out.relative_to(REPO_ROOT)}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
