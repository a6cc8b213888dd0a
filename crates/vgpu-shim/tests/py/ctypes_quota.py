"""The quota as Python ctypes users see it: CDLL("libcuda.so.1") is dlopen + dlsym.

    python3 ctypes_quota.py QUOTA_BYTES
"""
import ctypes
import sys
from ctypes import byref, c_int, c_size_t, c_uint64, c_ulonglong, c_void_p

quota = int(sys.argv[1])
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(c_uint64), c_size_t]
cuda.cuMemFree_v2.argtypes = [c_uint64]
cuda.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(c_size_t), ctypes.POINTER(c_size_t)]

assert cuda.cuInit(0) == 0
dev = c_int()
assert cuda.cuDeviceGet(byref(dev), 0) == 0
ctx = c_void_p()
assert cuda.cuCtxCreate_v2(byref(ctx), 0, dev) == 0

free, total = c_size_t(), c_size_t()
assert cuda.cuMemGetInfo_v2(byref(free), byref(total)) == 0
assert total.value == quota and free.value == quota, (free.value, total.value)

a, b = c_uint64(), c_uint64()
assert cuda.cuMemAlloc_v2(byref(a), quota * 3 // 4) == 0
rc = cuda.cuMemAlloc_v2(byref(b), quota // 2)
assert rc == 2, f"crossing the quota returned {rc}"
assert cuda.cuMemFree_v2(a) == 0
assert cuda.cuMemAlloc_v2(byref(b), quota // 2) == 0


class Memory(ctypes.Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
handle = c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, byref(handle)) == 0
mem = Memory()
assert nvml.nvmlDeviceGetMemoryInfo(handle, byref(mem)) == 0
assert (mem.total, mem.used, mem.free) == (quota, quota // 2, quota - quota // 2), (mem.total, mem.used, mem.free)
assert cuda.cuMemFree_v2(b) == 0
print(f"total={total.value}")
print("ok python")
