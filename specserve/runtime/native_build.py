"""Build, cache and find the small C kernels of ``runtime/csrc/`` for this machine.

Each kernel is compiled once per machine on first use (``cc -O3 -march=native``, so it is
vectorised for the CPU that runs it), cached under ``$SPECSERVE_CACHE_DIR`` (default
``~/.cache/specserve``) as ``<name>-<key>.so``, the key a hash of the source, flags, compiler
and CPU flags, and installed atomically (processes building at once each install a whole file).
Callers load the library with ctypes and fall back to a torch path when :func:`build` raises.

Pitfall: compiled with fast math (vectorised ``expf``, reassociated sums) but linked without
it: a shared object linked with ``-ffast-math`` brings ``crtfastmath.o``, whose constructor sets
flush-to-zero and denormals-are-zero for the whole process the moment it is loaded (torch and
numpy included).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp-simd", "-fPIC")
OFF = ("off", "0", "false")  # an ``env`` value that switches a kernel off (:func:`load`)
LINK = ("-shared", "-fPIC")


def load(source: Path | Sequence[Path], env: str, what: str, instead: str,
         off: tuple[str, ...] = OFF) -> ctypes.CDLL | None:
    """``source``'s library (one C file, or several linked together) built (:func:`build`)
    and loaded, or None: switched off by environment variable ``env`` (a value in ``off``), or
    no compiler / a failed build (logged as "``what`` unavailable (why); using
    ``instead``")."""
    if os.environ.get(env, "").lower() in off:
        return None
    try:
        return ctypes.CDLL(str(build(source)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:  # (a compiler timing out)
        logging.getLogger("specserve").warning("specserve: %s unavailable (%s); using %s", what,
                                               e, instead)
        return None


def build(source: Path | Sequence[Path], out_dir: Path | None = None,
          flags: tuple[str, ...] = FLAGS) -> Path:
    """The shared library of ``source`` (one C file, or several compiled apart and linked
    together, named after the first) for this machine: built now unless cached; RuntimeError
    when there is no C compiler or it fails (``subprocess.SubprocessError`` when it hangs)."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        raise RuntimeError("no C compiler (cc) on PATH")
    sources = [source] if isinstance(source, Path) else list(source)
    key = hashlib.sha256(b"\0".join([*(s.read_bytes() for s in sources),
                                     " ".join(flags + LINK).encode(), cc.encode(),
                                     platform.machine().encode(), cpu_flags()])).hexdigest()
    d = out_dir or cache_dir()
    stem = sources[0].stem
    lib = d / f"{stem}-{key[:16]}.so"
    if lib.exists():
        return lib
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{stem}-", suffix=".so")
    os.close(fd)
    objs = [f"{tmp[:-3]}-{i}.o" for i in range(len(sources))]
    try:
        cmds = [[cc, *flags, "-c", str(s), "-o", o] for s, o in zip(sources, objs, strict=True)]
        for cmd in [*cmds, [cc, *LINK, *objs, "-o", tmp, "-lm"]]:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if run.returncode != 0:
                raise RuntimeError(f"{cc} failed: {run.stderr.strip().splitlines()[-1:]}")
        os.replace(tmp, lib)  # atomic: processes building at once each install a whole file
    finally:
        for f in (tmp, *objs):
            if os.path.exists(f):
                os.unlink(f)
    return lib


def cpu_flags() -> bytes:
    """The CPU's feature flags (``-march=native`` builds for them: a cache shared by machines
    with different CPUs must not hand one's library to the other)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.encode()
    except OSError:
        pass
    return platform.processor().encode()


def cache_dir() -> Path:
    """``$SPECSERVE_CACHE_DIR/kernels`` (default ``~/.cache/specserve/kernels``), or a per-user
    temporary directory when that is not writable."""
    base = os.environ.get("SPECSERVE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specserve")
    d = Path(base) / "kernels"
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    d = Path(tempfile.gettempdir()) / f"specserve-kernels-{os.getuid()}"
    d.mkdir(parents=True, exist_ok=True)
    return d
