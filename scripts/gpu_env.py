"""The GPU check's environment report: what scripts/gpu_check.sh needs and whether this machine has it.

    python scripts/gpu_env.py [--wheels DIR] [--json FILE]

Checks, without a network and without installing anything: the NVIDIA driver (nvidia-smi), CuPy
(its CUDA version, the devices, whether its cuDNN binding loads), PyTorch with CUDA, cgvm from this
checkout, and each package of scripts/gpu_requirements*.txt, importable here or as a wheel in
``--wheels``. Prints one line a check and, at the end, what is missing; writes the same as JSON.
Exit status 0 when a GPU run can go ahead (driver, CuPy with a device, PyTorch CUDA, cgvm and its
core packages present or in the wheels), else 1. Only the standard library is used at the top, so
the report runs on any Python.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIREMENTS = [os.path.join(ROOT, "scripts", name) for name in ("gpu_requirements.txt", "gpu_requirements_peers.txt")]
#: import names where they differ from the distribution's
IMPORT_NAMES = {"protobuf": "google.protobuf", "pyyaml": "yaml", "pillow": "PIL", "scikit-learn": "sklearn",
                "pytest-xdist": "xdist", "ml_dtypes": "ml_dtypes", "setuptools": "setuptools", "wheel": "wheel"}
#: needed for cgvm itself (the rest only lets more tests run instead of skipping)
CORE = ("numpy", "protobuf", "pyyaml", "threadpoolctl", "pytest")


def requirements(paths: List[str] = REQUIREMENTS) -> List[str]:
    """Distribution names of the requirements files (versions dropped)."""
    names = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    names.append(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0])
    return names


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_for(name: str, wheels: Optional[str]) -> Optional[str]:
    """A wheel file of distribution ``name`` in folder ``wheels`` (None: none there)."""
    if not wheels or not os.path.isdir(wheels):
        return None
    want = _normal(name)
    for file in sorted(os.listdir(wheels)):
        if file.endswith(".whl") and _normal(file.split("-", 1)[0]) == want:
            return file
    return None


def check_module(name: str, wheels: Optional[str]) -> Dict[str, Any]:
    """Whether distribution ``name`` is importable here (found, not imported: some take seconds),
    else whether a wheel of it waits in ``wheels``."""
    module_name = IMPORT_NAMES.get(name.lower(), name.replace("-", "_"))
    try:
        found = importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = ""
        return {"name": name, "status": "present", "detail": version}
    wheel = wheel_for(name, wheels)
    if wheel:
        return {"name": name, "status": "wheel", "detail": wheel}
    return {"name": name, "status": "missing", "detail": f"no module {module_name!r} and no wheel in {wheels}"}


def check_driver() -> Dict[str, Any]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"name": "nvidia-smi", "status": "missing", "detail": "no NVIDIA driver tools on PATH"}
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"name": "nvidia-smi", "status": "missing", "detail": str(exc)}
    if out.returncode != 0:
        return {"name": "nvidia-smi", "status": "missing", "detail": (out.stderr or out.stdout).strip()[:300]}
    return {"name": "nvidia-smi", "status": "present", "detail": "; ".join(out.stdout.strip().splitlines())}


def check_cupy() -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """CuPy (with its devices) and its cuDNN binding."""
    try:
        import cupy
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        return ({"name": "cupy", "status": "missing", "detail": why + "; pip install cupy-cuda13x (or cupy-cuda12x)"},
                {"name": "cudnn", "status": "optional-missing", "detail": "no CuPy"})
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        runtime = cupy.cuda.runtime.runtimeGetVersion()
        names = [cupy.cuda.runtime.getDeviceProperties(i)["name"] for i in range(count)]
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        cupy_row = {"name": "cupy", "status": "present" if count else "missing",
                    "detail": f"{cupy.__version__}, CUDA runtime {runtime}, {count} device(s): {', '.join(names)}"}
    except Exception as exc:
        cupy_row = {"name": "cupy", "status": "missing",
                    "detail": f"CuPy {cupy.__version__} imports but finds no usable device ({type(exc).__name__}: {exc})"}
    try:
        importlib.import_module("cupyx.cudnn")
        cudnn_row = {"name": "cudnn", "status": "present", "detail": "cupyx.cudnn loads: convolutions use cuDNN"}
    except Exception as exc:
        cudnn_row = {"name": "cudnn", "status": "optional-missing",
                     "detail": f"convolutions take im2col+GEMM ({type(exc).__name__}: {exc})"}
    return cupy_row, cudnn_row


def check_torch() -> Dict[str, Any]:
    try:
        import torch
    except Exception as exc:
        return {"name": "torch", "status": "missing", "detail": f"{type(exc).__name__}: {exc}"}
    if not torch.cuda.is_available():
        return {"name": "torch", "status": "missing", "detail": f"torch {torch.__version__} without a usable CUDA device"}
    return {"name": "torch", "status": "present",
            "detail": f"{torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}"}


def check_cgvm() -> Dict[str, Any]:
    sys.path.insert(0, ROOT)
    try:
        import cgvm  # noqa: F401  (this checkout: ROOT comes first on the path)
    except Exception as exc:
        return {"name": "cgvm", "status": "missing", "detail": f"{type(exc).__name__}: {exc}"}
    where = os.path.dirname(os.path.dirname(os.path.abspath(cgvm.__file__)))
    status = "present" if os.path.samefile(where, ROOT) else "missing"
    return {"name": "cgvm", "status": status, "detail": f"from {where}"}


def report(wheels: Optional[str]) -> Dict[str, Any]:
    rows = [{"name": "python", "status": "present" if sys.version_info[:2] == (3, 12) else "other",
             "detail": sys.version.split()[0] + ("" if sys.version_info[:2] == (3, 12) else
                                                  " (the wheels are for 3.12: installs from them may fail)")}]
    rows.append(check_driver())
    rows.extend(check_cupy())
    rows.append(check_torch())
    modules = [check_module(n, wheels) for n in requirements()]
    rows.extend(modules)
    core = [m for m in modules if m["name"] in CORE]
    if all(m["status"] == "present" for m in core):
        rows.append(check_cgvm())
    elif all(m["status"] != "missing" for m in core):
        rows.append({"name": "cgvm", "status": "wheel", "detail": "importable once the wheels are installed"})
    else:
        rows.append({"name": "cgvm", "status": "missing", "detail": "its core packages are missing"})
    required = {"nvidia-smi", "cupy", "torch", "cgvm"} | set(CORE)
    missing = [r for r in rows if r["status"] == "missing" and r["name"] in required]
    skipping = [r for r in rows if r["status"] == "missing" and r["name"] not in required]
    return {"rows": rows, "ready": not missing, "missing": [r["name"] for r in missing],
            "tests_will_skip_for": [r["name"] for r in skipping], "wheels": wheels}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", default=os.path.join(ROOT, "wheels"), help="folder of wheels made by gpu_wheels.sh")
    ap.add_argument("--json", default=None, help="write the report here too")
    args = ap.parse_args(argv)
    rep = report(args.wheels)
    for r in rep["rows"]:
        print(f"  {r['name']:<16} {r['status']:<17} {r['detail']}")
    if rep["ready"]:
        print("ready: a GPU run can go ahead")
    else:
        print("NOT ready, missing: " + ", ".join(rep["missing"]))
        hints = {"nvidia-smi": "an NVIDIA driver", "cupy": "CuPy with a CUDA device (pip install cupy-cuda13x)",
                 "torch": "PyTorch with CUDA", "cgvm": "cgvm from this checkout (its core packages)"}
        for name in rep["missing"]:
            print(f"  needs {hints.get(name, f'{name} (importable, or a wheel in {args.wheels}: scripts/gpu_wheels.sh)')}")
    if rep["tests_will_skip_for"]:
        print("optional, missing: " + ", ".join(rep["tests_will_skip_for"])
              + " (tests needing one skip; without pytest-xdist the tests run in one process)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1)
    return 0 if rep["ready"] else 1


if __name__ == "__main__":
    sys.exit(main())
