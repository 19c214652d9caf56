"""Which device memory takes CUDA's stream memory operations on this machine.

cuStreamWriteValue32_v2 / cuStreamWaitValue32_v2 on memory from cuMemAlloc, from the
stream-ordered allocator (cuMemAllocAsync, what cubecl 0.10 allocates with), and pinned host
memory, through ctypes on libcuda. Prints one line per case with the driver's status.
"""
import ctypes as C

cu = C.CDLL("libcuda.so.1")
def ok(name, r):
    print(f"{name}: {r}")
    return r == 0
ok("cuInit", cu.cuInit(0))
dev = C.c_int(); cu.cuDeviceGet(C.byref(dev), 0)
ctx = C.c_void_p(); ok("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev))
ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
for attr, name in [(92, "CAN_USE_STREAM_MEM_OPS_V1"), (93, "CAN_USE_64_BIT_STREAM_MEM_OPS"),
                   (94, "CAN_USE_STREAM_WAIT_VALUE_NOR"), (115, "MEMORY_POOLS_SUPPORTED")]:
    v = C.c_int(); r = cu.cuDeviceGetAttribute(C.byref(v), attr, dev); print(f"attr {name} ({attr}): r={r} v={v.value}")
s = C.c_void_p(); ok("cuStreamCreate", cu.cuStreamCreate(C.byref(s), 1))
cu.cuStreamWriteValue32_v2.argtypes = [C.c_void_p, C.c_uint64, C.c_uint32, C.c_uint]
cu.cuStreamWaitValue32_v2.argtypes = [C.c_void_p, C.c_uint64, C.c_uint32, C.c_uint]

def trial(label, ptr):
    w = cu.cuStreamWriteValue32_v2(s, ptr, 7, 0)
    a = cu.cuStreamWaitValue32_v2(s, ptr, 7, 1)
    y = cu.cuStreamSynchronize(s)
    print(f"{label}: ptr=0x{ptr:x} write={w} wait={a} sync={y}")

p = C.c_uint64(); ok("cuMemAlloc", cu.cuMemAlloc_v2(C.byref(p), 256)); trial("cuMemAlloc", p.value)
q = C.c_uint64(); ok("cuMemAllocAsync", cu.cuMemAllocAsync(C.byref(q), 1 << 20, s)); cu.cuStreamSynchronize(s)
trial("cuMemAllocAsync", q.value); trial("cuMemAllocAsync+256", q.value + 256)
h = C.c_void_p(); ok("cuMemHostAlloc", cu.cuMemHostAlloc(C.byref(h), 256, 0x2 | 0x1))
hd = C.c_uint64(); ok("cuMemHostGetDevicePointer", cu.cuMemHostGetDevicePointer_v2(C.byref(hd), h, 0)); trial("pinned host", hd.value)
