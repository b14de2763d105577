# Evict-first L2 policies on the loads of data read once (run here, after variants.py made base.ptx):
# the row loads with an L2 cache-hint operand from createpolicy, alone, with the stores too, with
# L1 evict-first (Triton's eviction_policy="evict_first" on sm_90), and .cs loads.
import re, os, json
HERE = os.path.dirname(os.path.abspath(__file__))
from variants import rewrite, SPECS as _S
ROLES = {"rmsnorm_bf16_8192x4096": {0: "row", 1: "w", 2: "out"}, "layernorm_bf16_8192x4096": {0: "row", 1: "w", 2: "w", 3: "out"},
         "add_layernorm_bf16_8192x4096": {0: "row", 1: "row", 2: "out", 3: "w", 4: "w", 5: "out"},
         "softmax_f32_8192x4096": {0: "row", 1: "out"}, "col_sum_f32_8192x8192": {0: "row", 1: "out"}}
VARIANTS = {
    "ld_l2ef": {("ld", "row"): ".L2::cache_hint"},
    "ld_l2ef_st_l2ef": {("ld", "row"): ".L2::cache_hint", ("st", "out"): ".L2::cache_hint"},
    "ld_l1ef_l2ef": {("ld", "row"): ".L1::evict_first.L2::cache_hint"},
    "ld_cs": {("ld", "row"): ".cs"},
}
def with_policy(text):
    if ".L2::cache_hint" not in text: return text
    text = re.sub(r"(\.reg \.b64 %rd<\d+>;)", r"\1\n\t.reg .b64 %pol;", text, count=1)
    text = re.sub(r"(\tld\.param\.u64 [^\n]*\n)", r"\1\tcreatepolicy.fractional.L2::evict_first.b64 %pol, 1.0;\n", text, count=1)
    return re.sub(r"((?:ld|st)\.global[\w.:]*\.L2::cache_hint[^;]*);", r"\1, %pol;", text)
man = json.load(open(os.path.join(HERE, "manifest.json")))
for wl, roles in ROLES.items():
    base = open(os.path.join(HERE, wl, "base.ptx")).read()
    for v, hints in VARIANTS.items():
        text = with_policy(rewrite(base, roles, hints))
        assert text != base, (wl, v)
        open(os.path.join(HERE, wl, v + ".ptx"), "w").write(text)
        if v not in man[wl]["variants"]: man[wl]["variants"].append(v)
json.dump(man, open(os.path.join(HERE, "manifest.json"), "w"), indent=1)
print({k: v["variants"] for k, v in man.items()})
