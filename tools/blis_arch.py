#!/usr/bin/env python3
"""Prints `export BLIS_ARCH_TYPE=N` where BLIS would run its generic kernels.

Debian 12's BLIS (0.9.0, the CPU LibTorch's BLAS here) picks its kernels by
CPUID and knows no CPU newer than its release: on AMD Zen 5 (family 0x1a) it
selects the portable 'generic' configuration, about a quarter of the speed
of its AVX-512 ('skx') kernels on the same core (sgemm 512^3 on one core:
33 against 121 GFLOP/s; the student's CPU step 929 against 339 ms). BLIS
takes another configuration from BLIS_ARCH_TYPE, a number whose meaning
differs between BLIS versions, so this finds it by asking: each candidate
number runs in a child process that calls sgemm once with BLIS_ARCH_DEBUG=1,
and BLIS names the configuration it selected. The first number naming
'skx' (where the CPU has AVX-512 F/DQ/BW/VL) or else 'haswell' (AVX2 and
FMA) is printed. Nothing is printed where BLAS is not BLIS, where BLIS
already chose a tuned configuration, or where BLIS_ARCH_TYPE is set.

    eval "$(python3 tools/blis_arch.py)"   # tools/test.sh and tools/demo.sh do this

The export goes to standard output; a line saying what was chosen goes to
standard error.
"""
import os
import re
import subprocess
import sys

# Loads the BLAS that LibTorch loads (libblas.so.3, Debian's alternative)
# and calls sgemm once, which makes BLIS select its configuration.
_CHILD = r"""
import ctypes
blas = ctypes.CDLL("libblas.so.3")
one = ctypes.c_int(1)
alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
a, b, c = ctypes.c_float(1.0), ctypes.c_float(1.0), ctypes.c_float(0.0)
no = ctypes.c_char_p(b"N")
blas.sgemm_(no, no, ctypes.byref(one), ctypes.byref(one), ctypes.byref(one), ctypes.byref(alpha),
            ctypes.byref(a), ctypes.byref(one), ctypes.byref(b), ctypes.byref(one), ctypes.byref(beta),
            ctypes.byref(c), ctypes.byref(one))
assert c.value == 1.0
"""

# BLIS 0.9 numbers about 25 configurations; newer ones a few more.
_MAX_ID = 40


def selected_config(arch_type):
    """The configuration BLIS selects with BLIS_ARCH_TYPE=arch_type (None:
    unset), or None where the child failed or BLAS is not BLIS."""
    env = dict(os.environ, BLIS_ARCH_DEBUG="1", OMP_NUM_THREADS="1")
    env.pop("BLIS_ARCH_TYPE", None)
    if arch_type is not None:
        env["BLIS_ARCH_TYPE"] = str(arch_type)
    try:
        run = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return None
    if run.returncode != 0:
        return None
    m = re.search(r"selecting sub-configuration '(\w+)'", run.stdout + run.stderr)
    return m.group(1) if m else None


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def wanted_configs(flags):
    """BLIS configurations this CPU runs, fastest first."""
    configs = []
    if {"avx512f", "avx512dq", "avx512bw", "avx512vl"} <= flags:
        configs.append("skx")
    if {"avx2", "fma"} <= flags:
        configs.append("haswell")
    return configs


def main():
    if os.environ.get("BLIS_ARCH_TYPE"):
        return 0
    if selected_config(None) != "generic":
        return 0  # not BLIS, or BLIS knows this CPU
    wanted = wanted_configs(cpu_flags())
    if not wanted:
        return 0
    found = {}
    for arch_type in range(_MAX_ID):
        config = selected_config(arch_type)
        if config in wanted and config not in found:
            found[config] = arch_type
            if config == wanted[0]:
                break
    for config in wanted:
        if config in found:
            print(f"blis_arch: BLIS_ARCH_TYPE={found[config]}, BLIS's '{config}' kernels "
                  "(it would run 'generic' here)", file=sys.stderr)
            print(f"export BLIS_ARCH_TYPE={found[config]}")
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
