"""A Python ctypes client of libcuda.so.1 and libnvidia-ml.so.1, loaded by soname.

Prints key=value lines for tests/python_ctypes.rs.
"""
import ctypes
import os

cuda = ctypes.CDLL("libcuda.so.1")
nvml = ctypes.CDLL("libnvidia-ml.so.1")


def check(result, what):
    if result != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(result, ctypes.byref(name))
        raise SystemExit(f"{what} failed: {name.value.decode()}")


check(cuda.cuInit(0), "cuInit")
count = ctypes.c_int()
check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
print(f"count={count.value}")
dev = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
name = ctypes.create_string_buffer(128)
check(cuda.cuDeviceGetName(name, 128, dev), "cuDeviceGetName")
print(f"name={name.value.decode()}")
ctx = ctypes.c_void_p()
check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate_v2")
ptr = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(256 << 20)), "cuMemAlloc_v2")
free, total = ctypes.c_size_t(), ctypes.c_size_t()
check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
print(f"cuda_used={total.value - free.value}")


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


assert nvml.nvmlInit_v2() == 0
handle = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
nvml_name = ctypes.create_string_buffer(96)
assert nvml.nvmlDeviceGetName(handle, nvml_name, 96) == 0
print(f"nvml_name={nvml_name.value.decode()}")
memory = Memory()
assert nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0
print(f"nvml_used={memory.used}")
print(f"nvml_total={memory.total}")


class MemoryV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


memory2 = MemoryV2()
print(f"v2_unversioned={nvml.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(memory2))}")
memory2.version = ctypes.sizeof(MemoryV2) | (2 << 24)  # nvml.h: nvmlMemory_v2
print(f"v2={nvml.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(memory2))}")
print(f"v2_used={memory2.used}")
small = ctypes.create_string_buffer(4)
print(f"small_buffer={nvml.nvmlDeviceGetName(handle, small, 4)}")
nvml.nvmlErrorString.restype = ctypes.c_char_p
print(f"error_string={nvml.nvmlErrorString(7).decode()}")
count = ctypes.c_uint(0)
print(f"process_count_rc={nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), None)}")
print(f"process_count={count.value}")
print(f"pid={os.getpid()}")
check(cuda.cuMemFree_v2(ptr), "cuMemFree_v2")
assert nvml.nvmlShutdown() == 0
print(f"shutdown_again={nvml.nvmlShutdown()}")
