# Times PTX variants of a kernel (made by variants.py) on the GPU: loaded through the driver's
# assembler, random inputs, outputs checked bitwise against the base variant's, median of REPS
# launches after a 256 MiB memset each (as the bench and triton's do_bench), rounds interleaved.
import ctypes, json, os, statistics, sys, torch
HERE = os.path.dirname(os.path.abspath(__file__))
cuda = ctypes.CDLL("libcuda.so.1")
torch.zeros(1, device="cuda")
def ck(r, w):
    if r != 0: raise RuntimeError(f"{w}: {r}")
FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
DT = {"bf16": torch.bfloat16, "f32": torch.float32}
# FLUSHMODE: zero (a memset: 256 MiB of dirty lines, as the bench), read (a read: clean lines), none
FLUSHMODE = os.environ.get("FLUSHMODE", "zero")
def flush():
    if FLUSHMODE == "zero": FLUSH.zero_()
    elif FLUSHMODE == "read": FLUSH.view(torch.int64).sum()
REPS, ROUNDS = int(os.environ.get("REPS", 100)), int(os.environ.get("ROUNDS", 3))
# how each variant is assembled: "load" (cuModuleLoadData of the PTX: whole program), "link"
# (cuLink*, as coil does), "link_pic0" (cuLink* with CU_JIT_POSITION_INDEPENDENT_CODE = 0)
LOADS = os.environ.get("LOADS", "load").split(",")
def link(ptx, how):
    opts = {"link": [], "link_pic0": [(30, 0)], "link_o3": [(7, 3)]}[how]
    n = len(opts)
    o = (ctypes.c_int * max(n, 1))(*[k for k, _ in opts])
    vals = (ctypes.c_void_p * max(n, 1))(*[v for _, v in opts])
    st = ctypes.c_void_p()
    ck(cuda.cuLinkCreate_v2(n, o, vals, ctypes.byref(st)), "linkcreate")
    ck(cuda.cuLinkAddData_v2(st, 1, ptx, len(ptx), b"k.ptx", 0, None, None), "linkadd")
    cub, size = ctypes.c_void_p(), ctypes.c_size_t()
    ck(cuda.cuLinkComplete(st, ctypes.byref(cub), ctypes.byref(size)), "linkcomplete")
    data = ctypes.string_at(cub, size.value)
    cuda.cuLinkDestroy(st)
    return data
man = json.load(open(os.path.join(HERE, "manifest.json")))
only = sys.argv[1:] or list(man)
for wl in only:
    m = man[wl]
    torch.manual_seed(0)
    args = []
    for a in m["args"]:
        if a[0] == "status": args.append(torch.zeros(4, dtype=torch.int64, device="cuda"))
        elif a[0] == "in": args.append(torch.randn(a[2], device="cuda").to(DT[a[1]]))
        else: args.append(torch.zeros(a[2], device="cuda", dtype=DT[a[1]]))
    outs = [t for t, a in zip(args, m["args"]) if a[0] == "out"]
    nbytes = sum(t.numel() * t.element_size() for t, a in zip(args, m["args"]) if a[0] != "status")
    fns = {}
    import glob
    extra = sorted(os.path.basename(f)[:-4] for f in glob.glob(os.path.join(HERE, wl, "*.ptx")))
    for v in m["variants"] + [e for e in extra if e not in m["variants"]]:
        ptx = open(os.path.join(HERE, wl, v + ".ptx"), "rb").read() + b"\0"
        for how in LOADS:
            mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
            if how == "load":
                ck(cuda.cuModuleLoadData(ctypes.byref(mod), ptx), f"load {wl}/{v}")
            else:
                ck(cuda.cuModuleLoadData(ctypes.byref(mod), link(ptx, how)), f"load linked {wl}/{v}")
            ck(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, m["kernel"].encode()), "getfn")
            regs = ctypes.c_int(); cuda.cuFuncGetAttribute(ctypes.byref(regs), 4, fn)
            fns[v + ("" if how == "load" else "/" + how)] = (fn, regs.value)
    holders = [ctypes.c_void_p(t.data_ptr()) for t in args]
    ptrs = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    def grid(v): return m.get("launches", {}).get(v.split("/")[0], m["launch"])
    def launch(fn, v):
        g, b = grid(v)
        ck(cuda.cuLaunchKernel(fn, g, 1, 1, b, 1, 1, 0, stream, ptrs, None), "launch")
    want = None
    for v, (fn, _) in fns.items():
        for o in outs: o.zero_()
        launch(fn, v); torch.cuda.synchronize()
        got = [o.clone() for o in outs]
        if want is None: want = got
        elif not all(torch.equal(x, y) for x, y in zip(got, want)): print(f"{wl} {v}: OUTPUT DIFFERS")
    times = {v: [] for v in fns}
    for r in range(ROUNDS):
        for v, (fn, _) in fns.items():
            for _ in range(5): launch(fn, v)
            ts = []
            for _ in range(REPS):
                flush()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record(); launch(fn, v); e.record(); torch.cuda.synchronize()
                ts.append(s.elapsed_time(e) * 1e3)
            times[v].append(statistics.median(ts))
    for v, t in times.items():
        print(f"{wl:30} {v:12} regs {fns[v][1]:3}  " + "  ".join(f"{x:7.1f}" for x in t) + f"  us  ({nbytes / min(t) / 1e3:.0f} GB/s)", flush=True)
