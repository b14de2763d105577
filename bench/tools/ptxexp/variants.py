# Makes cache-hint variants of emitted PTX kernels (run here): for each ld/st.global, find the
# kernel parameter its address derives from, then rewrite by role (row input, weight, output).
import re, os, json, sys
SRC = sys.argv[1] if len(sys.argv) > 1 else None  # an --emit-cuda directory
QUARTER = sys.argv[2] if len(sys.argv) > 2 else None  # one at --scale 0.25 (the full sum over 64M f32)
HERE = os.path.dirname(os.path.abspath(__file__))

def param_of_regs(ptx):
    origin = {}
    for line in ptx.split("\n"):
        m = re.match(r"\s*ld\.param\.u64 (%rd\d+), \[\w+_param_(\d+)\];", line)
        if m: origin[m.group(1)] = int(m.group(2)); continue
        m = re.match(r"\s*(?:cvta\.to\.global\.u64|mov\.b64|mov\.u64) (%rd\d+), (%rd\d+);", line)
        if m and m.group(2) in origin: origin[m.group(1)] = origin[m.group(2)]; continue
        m = re.match(r"\s*add\.s64 (%rd\d+), (%rd\d+), (%rd\d+|-?\d+);", line)
        if m:
            for s in (m.group(2), m.group(3)):
                if s in origin: origin[m.group(1)] = origin[s]
    return origin

def rewrite(ptx, roles, hints):
    origin = param_of_regs(ptx)
    out = []
    for line in ptx.split("\n"):
        m = re.match(r"(\s*(?:@%p\d+ )?)(ld|st)\.global\.(.*)\[(%rd\d+)(\+\d+)?\](.*)", line)
        if m and m.group(4) in origin:
            role = roles.get(origin[m.group(4)])
            h = hints.get((m.group(2), role))
            if h:
                line = f"{m.group(1)}{m.group(2)}.global{h}.{m.group(3)}[{m.group(4)}{m.group(5) or ''}]{m.group(6)}"
        out.append(line)
    return "\n".join(out)

# workload -> (kernel file, {param: role}, launch, args)
SPECS = {
    "rmsnorm_bf16_8192x4096": ("per_fused_add_cast_div_mul_pow_0", {0: "row", 1: "w", 2: "out"}, [8192, 256],
        [["in", "bf16", [8192, 4096]], ["in", "bf16", [4096]], ["out", "bf16", [8192, 4096]], ["status"]]),
    "layernorm_bf16_8192x4096": ("per_fused_add_cast_div_mul_rsqrt_0", {0: "row", 1: "w", 2: "w", 3: "out"}, [8192, 256],
        [["in", "bf16", [8192, 4096]], ["in", "bf16", [4096]], ["in", "bf16", [4096]], ["out", "bf16", [8192, 4096]], ["status"]]),
    "add_layernorm_bf16_8192x4096": ("per_fused_add_cast_div_mul_rsqrt_0", {0: "row", 1: "row", 2: "out", 3: "w", 4: "w", 5: "out"}, [8192, 256],
        [["in", "bf16", [8192, 4096]], ["in", "bf16", [8192, 4096]], ["out", "bf16", [8192, 4096]], ["in", "bf16", [4096]], ["in", "bf16", [4096]], ["out", "bf16", [8192, 4096]], ["status"]]),
    "softmax_f32_8192x4096": ("per_fused_amax_div_exp_sub_sum_0", {0: "row", 1: "out"}, [8192, 256],
        [["in", "f32", [8192, 4096]], ["out", "f32", [8192, 4096]], ["status"]]),
    "col_sum_f32_8192x8192": ("per_fused_sum_0", {0: "row", 1: "out"}, [128, 1024],
        [["in", "f32", [8192, 8192]], ["out", "f32", [8192]], ["status"]]),
    # the first stage of the full sum over 64M f32: the column sum's 256 MiB, read contiguously
    "fullsum_f32_64M": ("red_fused_sum_0", {0: "row", 1: "out"}, [512, 1024],
        [["in", "f32", [67108864]], ["out", "f32", [512]], ["status"]]),
}
VARIANTS = {
    "base": {},
    "row_na": {("ld", "row"): ".L1::no_allocate"},
    "w_el": {("ld", "w"): ".L1::evict_last"},
    "row_ef_w_el": {("ld", "row"): ".L1::evict_first", ("ld", "w"): ".L1::evict_last"},
    "row_na_w_el": {("ld", "row"): ".L1::no_allocate", ("ld", "w"): ".L1::evict_last"},
    "st_cs": {("st", "out"): ".cs"},
    "st_l2ef": {("st", "out"): ".L2::cache_hint"},
}
manifest = {}
if SRC is None: SPECS = {}
for wl, (kern, roles, launch, args) in SPECS.items():
    if wl == "fullsum_f32_64M":
        if QUARTER is None: continue
        ptx = open(os.path.join(QUARTER, "full_sum_f32_256M", kern + ".ptx")).read()
    else:
        ptx = open(os.path.join(SRC, wl, kern + ".ptx")).read()
    d = os.path.join(HERE, wl); os.makedirs(d, exist_ok=True)
    names = []
    for v, hints in VARIANTS.items():
        if any(r not in roles.values() for (_, r) in hints): continue
        text = rewrite(ptx, roles, hints)
        if ".L2::cache_hint" in text:
            # stores with an evict-first L2 policy: one createpolicy, the policy as the last operand
            text = re.sub(r"(\.reg \.b64 %rd<\d+>;)", r"\1\n\t.reg .b64 %pol;", text, count=1)
            text = re.sub(r"(\tld\.param\.u64 [^\n]*\n)", r"\1\tcreatepolicy.fractional.L2::evict_first.b64 %pol, 1.0;\n", text, count=1)
            text = re.sub(r"(st\.global\.L2::cache_hint[^;]*);", r"\1, %pol;", text)
        if v != "base" and text == ptx: print("unchanged", wl, v); continue
        open(os.path.join(d, v + ".ptx"), "w").write(text); names.append(v)
    manifest[wl] = {"kernel": kern, "launch": launch, "args": args, "variants": names}
if SRC:
    json.dump(manifest, open(os.path.join(HERE, "manifest.json"), "w"), indent=1)
    print(json.dumps({k: v["variants"] for k, v in manifest.items()}))
