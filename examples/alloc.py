#!/usr/bin/env python3
"""Allocate device memory through the CUDA driver API with ctypes, the way a framework would,
and report what the (virtual) GPU looks like from inside. Works on a real GPU and on vgpu's
simulated driver (`vgpu --simulate run …`).

    vgpu --simulate run --mem 4G -- python3 examples/alloc.py [GIB_TO_ALLOCATE]
"""
import ctypes
import sys

GiB = 1 << 30
CUDA_ERROR_OUT_OF_MEMORY = 2


def check(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed with CUresult {rc}")


cuda = ctypes.CDLL("libcuda.so.1")
check(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
name = ctypes.create_string_buffer(256)
check(cuda.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
ctx = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

free, total = ctypes.c_size_t(), ctypes.c_size_t()
check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
print(f"device: {name.value.decode()}  total {total.value / GiB:.2f} GiB  free {free.value / GiB:.2f} GiB")

want = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
chunks = []
for i in range(int(want)):
    ptr = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(GiB))
    if rc == CUDA_ERROR_OUT_OF_MEMORY:
        print(f"allocation {i + 1} of 1 GiB: out of memory (as a framework would see it)")
        break
    check(rc, "cuMemAlloc_v2")
    chunks.append(ptr)
    print(f"allocated {len(chunks)} GiB at 0x{ptr.value:x}")

check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
print(f"after: total {total.value / GiB:.2f} GiB  free {free.value / GiB:.2f} GiB")
for ptr in chunks:
    check(cuda.cuMemFree_v2(ptr), "cuMemFree_v2")
print("freed everything")
