# Where cold compile time goes, per generated kernel, on a GPU machine (needs libnvrtc and
# libcuda, no Rust). Input: a folder written by `bench --emit-cuda DIR` (DIR/<workload>/<kernel>.cu).
#
#   python3 bench/tools/nvrtc_phase.py DIR
#
# Columns, in milliseconds, the best of 3 compiles each (every compile gets a unique trailing
# declaration, so no in-process cache serves it):
#   cubin     NVRTC to an sm_90 CUBIN with the runtime's options (what coil does)
#   ptx       NVRTC to PTX only (front end and NVVM, no ptxas)
#   link      the driver's JIT of that PTX to a CUBIN (cuLinkAddData/cuLinkComplete, cache off)
#   Ofc=min   cubin with --Ofast-compile=min
#   O1        cubin with -Xptxas -O1
#   fe, nvvm, ptxas   NVRTC's own phase times of one cubin compile (its -time option): the C++
#             front end, the NVVM optimizer, PTX to SASS
import ctypes, glob, itertools, os, sys, time

os.environ["CUDA_CACHE_DISABLE"] = "1"
nvrtc = ctypes.CDLL("/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so")
cuda = ctypes.CDLL("libcuda.so.1")
unique = itertools.count()
BASE = ["--std=c++17", "-default-device", "-minimal"]


def compile_src(src, opts, want_ptx=False):
    """Seconds NVRTC took, and the PTX when asked for."""
    src = src + f"\n__device__ int coil_unique_{next(unique)};\n"
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None) == 0
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    t = time.perf_counter()
    failed = nvrtc.nvrtcCompileProgram(prog, len(opts), arr) != 0
    dt = time.perf_counter() - t
    ptx = None
    if failed:
        n = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        print("FAILED", opts, log.value.decode()[:400])
        dt = float("nan")
    elif want_ptx:
        n = ctypes.c_size_t()
        nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        nvrtc.nvrtcGetPTX(prog, buf)
        ptx = buf.raw
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return dt, ptx


def phases(src, opts):
    """Seconds of NVRTC's front end, NVVM optimizer and PTX translation for one compile."""
    path = f"/tmp/nvrtc_phase_{os.getpid()}.csv"
    if os.path.exists(path):
        os.remove(path)
    compile_src(src, opts + [f"-time={path}"])
    ms = {}
    for line in open(path).read().strip().splitlines()[1:]:  # file, phase, value, unit
        cells = [c.strip() for c in line.split(",")]
        ms[cells[1]] = float(cells[2]) / 1e3
    os.remove(path)
    return [ms.get("CUDA C++ Frontend", float("nan")), ms.get("NVVM Optimizer", float("nan")),
            ms.get("PTX Translation", float("nan"))]


def link(ptx):
    """Seconds the driver took to JIT `ptx` to a CUBIN."""
    state, cubin, size = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_size_t()
    t = time.perf_counter()
    assert cuda.cuLinkCreate_v2(0, None, None, ctypes.byref(state)) == 0
    ok = cuda.cuLinkAddData_v2(state, 1, ptx, len(ptx), b"k.ptx", 0, None, None) == 0  # CU_JIT_INPUT_PTX
    ok = ok and cuda.cuLinkComplete(state, ctypes.byref(cubin), ctypes.byref(size)) == 0
    dt = time.perf_counter() - t
    cuda.cuLinkDestroy(state)
    return dt if ok else float("nan")


def main(folder):
    assert cuda.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    cuda.cuCtxSetCurrent(ctx)
    files = sorted(glob.glob(os.path.join(folder, "*", "*.cu")))
    if not files:
        sys.exit(f"no .cu files under {folder}/*/")
    sm90 = BASE + ["--gpu-architecture=sm_90"]
    compile_src(open(files[0]).read(), sm90)  # NVRTC's one-time start-up, outside the table
    best = lambda f: min(f() for _ in range(3))
    columns = ["cubin", "ptx", "link", "Ofc=min", "O1", "fe", "nvvm", "ptxas"]
    print(f"{'kernel':46}" + "".join(f"{c:>9}" for c in columns))
    totals = [0.0] * len(columns)
    for f in files:
        src = open(f).read()
        ptx = compile_src(src, BASE + ["--gpu-architecture=compute_90"], want_ptx=True)[1]
        row = [
            best(lambda: compile_src(src, sm90)[0]),
            best(lambda: compile_src(src, BASE + ["--gpu-architecture=compute_90"])[0]),
            best(lambda: link(ptx)) if ptx else float("nan"),
            best(lambda: compile_src(src, sm90 + ["--Ofast-compile=min"])[0]),
            best(lambda: compile_src(src, sm90 + ["-Xptxas", "-O1"])[0]),
            *phases(src, sm90),
        ]
        totals = [t + r for t, r in zip(totals, row)]
        label = (os.path.basename(os.path.dirname(f))[:18] + "/" + os.path.basename(f)[:-3])[:46]
        print(f"{label:46}" + "".join(f"{v * 1e3:9.1f}" for v in row))
    print(f"{'total':46}" + "".join(f"{v * 1e3:9.1f}" for v in totals))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else sys.exit("usage: nvrtc_phase.py DIR (from bench --emit-cuda DIR)"))
