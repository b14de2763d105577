# Structural variants of norm/softmax PTX (run here): drop each reduction's trailing barrier
# (every reduction has its own shared array and a block does one row), and load the weights
# right after the row (the address chain moved up with them).
import re, os, json, sys
HERE = os.path.dirname(os.path.abspath(__file__))
from variants import param_of_regs
man = json.load(open(os.path.join(HERE, "manifest.json")))
ROLES = {"rmsnorm_bf16_8192x4096": {0: "row", 1: "w"}, "layernorm_bf16_8192x4096": {0: "row", 1: "w", 2: "w"},
         "add_layernorm_bf16_8192x4096": {0: "row", 1: "row", 3: "w", 4: "w"}, "softmax_f32_8192x4096": {0: "row"}}

def no_trailing_barrier(ptx):
    lines = ptx.split("\n"); out = []
    for i, l in enumerate(lines):
        if l.strip() == "bar.sync 0;" and i > 0 and "ld.shared" in lines[i - 1]:
            continue
        out.append(l)
    return "\n".join(out)

def defs(l):
    m = re.match(r"\s*(?:@%p\d+ )?[a-z][\w.:]* (%\w+),", l)
    return m.group(1) if m else None

def uses(l):
    return set(re.findall(r"%[a-z]+\d+", l.split(",", 1)[1] if "," in l else ""))

def weights_early(ptx, roles):
    origin = param_of_regs(ptx)
    lines = ptx.split("\n")
    kind = []
    for l in lines:
        m = re.search(r"ld\.global[\w.:]* .*\[(%rd\d+)", l)
        kind.append(roles.get(origin.get(m.group(1))) if m else None)
    last_row = max(i for i, k in enumerate(kind) if k == "row")
    wl = [i for i, k in enumerate(kind) if k == "w" and i > last_row]
    need, move = set(), set()
    for i in wl:
        move.add(i); need |= set(re.findall(r"\[(%rd\d+)", lines[i]))
    for i in range(max(wl), last_row, -1):
        d = defs(lines[i])
        if d in need and i not in move:
            move.add(i); need |= uses(lines[i])
    defined_before = {defs(l) for l in lines[:last_row + 1]}
    for i in move:
        for u in uses(lines[i]) if not kind[i] else re.findall(r"\[(%rd\d+)", lines[i]):
            assert u in defined_before or any(defs(lines[j]) == u for j in move if j < i), (u, lines[i])
    moved = [lines[i] for i in sorted(move)]
    rest = [l for i, l in enumerate(lines) if i not in move]
    k = rest.index(lines[last_row]) + 1
    return "\n".join(rest[:k] + moved + rest[k:])

for wl, roles in ROLES.items():
    base = open(os.path.join(HERE, wl, "base.ptx")).read()
    v = {"nobar2": no_trailing_barrier(base)}
    if "w" in roles.values():
        v["wearly"] = weights_early(base, roles)
        v["wearly_nobar2"] = no_trailing_barrier(v["wearly"])
    for name, text in v.items():
        open(os.path.join(HERE, wl, name + ".ptx"), "w").write(text)
    print(wl, list(v))
