# What the bench's timing method allows at each size: device-to-device copies timed as the torch
# suite times everything (triton.testing.do_bench: a 256 MiB memset before each run), beside
# the 2 GiB copy of the suite's copy ceiling.
import torch
from triton.testing import do_bench
for mib in (64, 128, 256, 2048):
    a = torch.empty(mib * 2**20 // 4, device="cuda"); b = torch.empty_like(a)
    t = do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    print(f"copy of {mib:5} MiB: {t * 1e3:8.1f} us  {2 * mib * 2**20 / (t * 1e-3) / 1e12:.2f} TB/s (read + written)", flush=True)
    del a, b
