#!/usr/bin/env python3
"""Regenerates the committed Python code of the wire contract from proto/cyclone/v1.

Usage (from any directory, with the dev extras installed):

    python scripts/gen_proto.py           # rewrite cyclone_proto/
    python scripts/gen_proto.py --check   # exit 1, listing differences, if it is stale

Layout. protoc is run on proto/ with the well-known types of grpcio-tools, so the
descriptors keep their canonical file names ("cyclone/v1/runs.proto"), which is what
gRPC reflection and other languages' stubs expect. protoc writes its output as
cyclone/v1/<name>_pb2.py, <name>_pb2.pyi and <name>_pb2_grpc.py; this script flattens
that into the public package cyclone_proto/, so the modules are imported as

    from cyclone_proto import runs_pb2, runs_pb2_grpc, types_pb2

and rewrites protoc's absolute imports between them, "from cyclone.v1 import
types_pb2", into "from cyclone_proto import types_pb2" (there is no top-level
package named cyclone). It also writes cyclone_proto/__init__.py, so that the
whole folder is this script's output and --check covers all of it.

Pinned tools. The output depends on the protoc bundled with grpcio-tools, so the script
refuses to run with any grpcio-tools but GRPCIO_TOOLS_VERSION: a regeneration with
another version would show as a spurious diff (and could raise the protobuf runtime
version that the generated code demands).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import re
import subprocess
import sys
import tempfile
from pathlib import Path

GRPCIO_TOOLS_VERSION = "1.85.1"

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_PACKAGE_DIR = Path("cyclone") / "v1"
OUT_DIR = ROOT / "cyclone_proto"
PY_PACKAGE = "cyclone_proto"

INIT_TEXT = '''"""Generated protobuf and gRPC code of package cyclone.v1 (proto/cyclone/v1).

A public package by design: the server, the Python SDK and any Python program that
talks to Cyclone import the wire contract from here, e.g.
``from cyclone_proto import runs_pb2, runs_pb2_grpc``.

Written by scripts/gen_proto.py; do not edit.
"""
'''

# protoc's Python imports of sibling files, in .py and .pyi alike:
#   from cyclone.v1 import types_pb2 as cyclone_dot_v1_dot_types__pb2
_PROTO_IMPORT = re.compile(r"^from cyclone\.v1 import (\w+)", re.MULTILINE)
# Any import of the cyclone.v1 package left after the rewrite is a bug of this script.
_LEFTOVER_IMPORT = re.compile(r"^\s*(from|import) cyclone\.v1\b", re.MULTILINE)


def check_tool_version() -> None:
    """Exit unless the pinned grpcio-tools is installed in this interpreter."""
    try:
        installed = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != GRPCIO_TOOLS_VERSION:
        sys.exit(
            f"gen_proto: grpcio-tools=={GRPCIO_TOOLS_VERSION} is required, found "
            f"{installed or 'none'} in {sys.executable}; "
            f"pip install 'grpcio-tools=={GRPCIO_TOOLS_VERSION}'"
        )


def proto_files() -> list[Path]:
    """The .proto files to compile, relative to PROTO_ROOT, in a stable order."""
    files = sorted((PROTO_ROOT / PROTO_PACKAGE_DIR).glob("*.proto"))
    if not files:
        sys.exit(f"gen_proto: no .proto files in {PROTO_ROOT / PROTO_PACKAGE_DIR}")
    return [f.relative_to(PROTO_ROOT) for f in files]


def rewrite_imports(text: str, name: str) -> str:
    """Point protoc's "from cyclone.v1 import x" at the flattened package."""
    text = _PROTO_IMPORT.sub(rf"from {PY_PACKAGE} import \1", text)
    if _LEFTOVER_IMPORT.search(text):
        raise SystemExit(f"gen_proto: {name} still imports cyclone.v1 after the rewrite")
    return text


def generate() -> dict[str, str]:
    """Runs protoc and returns the output folder's files: name -> text."""
    files = proto_files()
    with tempfile.TemporaryDirectory(prefix="cyclone-proto-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",  # adds the include path of the well-known types
            f"--proto_path={PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(f.as_posix() for f in files),
        ]
        done = subprocess.run(cmd, cwd=PROTO_ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"gen_proto: protoc failed:\n{done.stderr}{done.stdout}")
        generated = sorted((Path(tmp) / PROTO_PACKAGE_DIR).iterdir())
        out = {"__init__.py": INIT_TEXT}
        for path in generated:
            if path.suffix not in (".py", ".pyi"):
                continue
            out[path.name] = rewrite_imports(path.read_text(encoding="utf-8"), path.name)
    return out


def committed() -> dict[str, str]:
    """The files currently in the output folder (caches excluded): name -> text."""
    if not OUT_DIR.is_dir():
        return {}
    return {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted(OUT_DIR.iterdir())
        if p.is_file() and p.suffix in (".py", ".pyi")
    }


def differences(want: dict[str, str], have: dict[str, str]) -> list[str]:
    """Human-readable differences between the generated and the committed files."""
    rel = OUT_DIR.relative_to(ROOT).as_posix()
    problems = []
    for name in sorted(want.keys() | have.keys()):
        if name not in have:
            problems.append(f"missing: {rel}/{name}")
        elif name not in want:
            problems.append(f"not generated (stale, delete it): {rel}/{name}")
        elif want[name] != have[name]:
            diff = difflib.unified_diff(
                have[name].splitlines(keepends=True),
                want[name].splitlines(keepends=True),
                fromfile=f"{rel}/{name} (committed)",
                tofile=f"{rel}/{name} (regenerated)",
                n=1,
            )
            problems.append(f"differs: {rel}/{name}\n" + "".join(list(diff)[:40]))
    return problems


def write(want: dict[str, str]) -> None:
    """Makes the output folder hold exactly the generated files."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in committed().keys() - want.keys():
        (OUT_DIR / name).unlink()
    for name, text in want.items():
        path = OUT_DIR / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8", newline="\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary folder and exit 1 if the committed code differs",
    )
    args = parser.parse_args(argv)
    check_tool_version()
    want = generate()
    if args.check:
        problems = differences(want, committed())
        if problems:
            print("gen_proto: generated code is stale; run scripts/gen_proto.py", file=sys.stderr)
            for problem in problems:
                print(problem, file=sys.stderr)
            return 1
        print(f"gen_proto: {len(want)} files up to date")
        return 0
    write(want)
    print(f"gen_proto: wrote {len(want)} files to {OUT_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
