"""The kernels torch._scaled_mm launches for each FP8 recipe at 4096^3 (torch.profiler), to
tell whether PyTorch ran cuBLASLt or one of its own kernels. Not part of the test suite."""
import torch
from torch.profiler import profile, ProfilerActivity

M = N = K = 4096
x = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
w = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
kb = K // 128
scales = {
    "tensorwise": (torch.ones((), device="cuda"), torch.ones((), device="cuda")),
    "rowwise": (torch.ones(M, 1, device="cuda"), torch.ones(1, N, device="cuda")),
    "block": (torch.ones(kb, M, device="cuda").t(), torch.ones(N // 128, -(-kb // 4) * 4, device="cuda").t()[:kb]),
}
for name, (sa, sb) in scales.items():
    f = lambda: torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        f()
        torch.cuda.synchronize()
    kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print(f"{name}: {kernels}")
