"""The CPU kernels: C++ through the XLA FFI, compiled once on first use for this host.

`pallas_kernels/<op>/cpu.cc` are compiled with the system's C++ compiler (`$CXX`, else `c++`) and
`-march=native`, side by side, and linked into one shared library in the user cache
(`$SPECJAX_CACHE/kernels`, else `$XDG_CACHE_HOME/specjax/kernels`, else
`~/.cache/specjax/kernels`), keyed by the sources, the compiler, jaxlib and the CPU's flags, so
each host gets its own vector width (AVX-512, AVX2 or a portable fallback) and a new source or host
builds anew (once: ~20 s on 2 cores). The library is written in a temporary folder and renamed into
place, so a killed build leaves nothing half-written; the next build removes what a killed one
left.

`SPECJAX_CPU_KERNEL_FLAGS` adds compiler flags after `-march=native` (and to the key): for
example `-mno-avx512f` builds the AVX2 path on an AVX-512 host, to time or test it there.

With no compiler, or `SPECJAX_CPU_KERNELS=0`, one line says so and XLA's code runs instead.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import jax
import jaxlib

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(ROOT.glob("*/cpu.cc"))
HEADERS = sorted(ROOT.glob("ffi/*.h"))
TARGETS = ("specjax_argmax", "specjax_matmul", "specjax_quant_matmul", "specjax_quant_matmul_a8",
           "specjax_rms_norm", "specjax_tree_attention")


def cache_dir() -> Path:
    root = os.environ.get("SPECJAX_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specjax"
    return Path(root) / "kernels"


def cpu_flags() -> str:
    """This host's CPU flags line (what a build for it or a program compiled on it is keyed by)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++"))


def _extra_flags() -> list[str]:
    return os.environ.get("SPECJAX_CPU_KERNEL_FLAGS", "").split()


def _key(compiler: str) -> str:
    h = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        h.update(path.name.encode() + path.read_bytes())
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    h.update((compiler + version + jaxlib.__version__ + cpu_flags() + " ".join(_extra_flags())).encode())
    return h.hexdigest()[:16]


def _clean_stale(folder: Path):
    """Remove what builds whose process is gone (killed mid-build) left behind."""
    for tmp in folder.glob(".build-*.tmp"):
        pid = tmp.name.split("-")[1].split(".")[0]
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink(missing_ok=True)


def build() -> Path:
    """Compile the kernels for this host into the cache (if not there yet); the library's path.
    Each source compiles in its own process, as many at once as there are cores, then one link."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"cpu-{_key(compiler)}.so"
    if lib.exists():
        return lib
    _clean_stale(folder)
    tmp = folder / f".build-{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        flags = ["-O3", "-march=native", *_extra_flags(), "-std=c++17", "-fPIC", "-fno-math-errno",
                 f"-I{ROOT.parent}", f"-I{jax.ffi.include_dir()}"]
        sources = sorted(SOURCES, key=lambda src: -src.stat().st_size)  # the longest compiles first
        objects = [tmp / f"{src.parent.name}.o" for src in sources]
        compile_one = lambda src, obj: subprocess.run([compiler, *flags, "-c", str(src), "-o", str(obj)],
                                                      capture_output=True, text=True)
        with concurrent.futures.ThreadPoolExecutor(min(len(SOURCES), os.cpu_count() or 1)) as pool:
            done = list(pool.map(compile_one, sources, objects))
        if all(d.returncode == 0 for d in done):
            done.append(subprocess.run([compiler, "-shared", *map(str, objects), "-o", str(tmp / lib.name)],
                                       capture_output=True, text=True))
        failed = next((d for d in done if d.returncode), None)
        if failed is not None:
            raise RuntimeError(f"compiling the CPU kernels failed:\n{failed.stderr[-2000:]}")
        os.replace(tmp / lib.name, lib)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return lib


@functools.cache
def library() -> ctypes.CDLL | None:
    """The kernels' library, built, loaded and registered with XLA (once per process); None
    (and one warning) where they are off or cannot be built."""
    if os.environ.get("SPECJAX_CPU_KERNELS", "1") == "0":
        return None
    try:
        lib = ctypes.cdll.LoadLibrary(str(build()))
        for name in TARGETS:
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
    except (RuntimeError, OSError, AttributeError) as e:
        first = str(e).splitlines()[0]
        warnings.warn(f"specjax CPU kernels unavailable ({first}); XLA's code runs instead", stacklevel=2)
        return None
    return lib


def available() -> bool:
    """Whether the CPU kernels are built, loaded and registered with XLA."""
    return library() is not None
