#!/usr/bin/env python3
"""Compiles the device-local backend's kernels (actors/src/device/cuda/kernels/*.cu) to PTX
with NVRTC, which runs on any machine (no GPU needed):

    python3 -m pip install nvidia-cuda-nvrtc-cu12   # NVRTC 12.x: PTX that CUDA 12+ drivers load
    python3 bench/gen_ptx.py                        # rewrites kernels/*.ptx

The PTX is committed, so building collectix needs no CUDA compiler; the driver compiles it
for the GPU it runs on when the module is first loaded. The target is compute_70 (Volta and
later); --fmad=false keeps every multiply and add rounded on its own, as the host reference
rounds them.
"""
import ctypes
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(HERE, "..", "actors", "src", "device", "cuda", "kernels")
OPTIONS = [b"--gpu-architecture=compute_70", b"--fmad=false", b"--std=c++14"]


def nvrtc():
    names = ["libnvrtc.so.12", "libnvrtc.so"]
    for site in sys.path:
        names += glob.glob(os.path.join(site, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*"))
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    sys.exit("no libnvrtc found: python3 -m pip install nvidia-cuda-nvrtc-cu12")


def check(lib, r, what, prog=None):
    if r != 0:
        msg = ctypes.c_char_p(lib.nvrtcGetErrorString(r)).value
        log = ""
        if prog is not None:
            n = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
            buf = ctypes.create_string_buffer(n.value)
            lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode()
        sys.exit(f"{what}: {msg}\n{log}")


def compile_one(lib, path):
    src = open(path, "rb").read()
    prog = ctypes.c_void_p()
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), src, os.path.basename(path).encode(), 0, None, None), "nvrtcCreateProgram")
    opts = (ctypes.c_char_p * len(OPTIONS))(*OPTIONS)
    check(lib, lib.nvrtcCompileProgram(prog, len(OPTIONS), opts), f"compiling {path}", prog)
    n = ctypes.c_size_t()
    check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(n)), "nvrtcGetPTXSize")
    buf = ctypes.create_string_buffer(n.value)
    check(lib, lib.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.value.decode()


def main():
    lib = nvrtc()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    for cu in sorted(glob.glob(os.path.join(KERNELS, "*.cu"))):
        ptx = compile_one(lib, cu)
        out = cu[:-3] + ".ptx"
        header = f"// Generated from {os.path.basename(cu)} by bench/gen_ptx.py (NVRTC {major.value}.{minor.value}, {' '.join(o.decode() for o in OPTIONS)}); do not edit.\n"
        with open(out, "w") as f:
            f.write(header + ptx)
        print(f"{out}: {len(ptx)} bytes")


if __name__ == "__main__":
    main()
