#!/usr/bin/env python3
"""Static instruction counts of a kernel's loops from nvdisasm output.

    sass_loops.py ALL.sass NAME_SUBSTRING [RARE_OPCODE]

ALL.sass: `nvdisasm -c file.cubin` (sm_90). For the first function whose
.text section name contains NAME_SUBSTRING, prints the register count line
count aside (ptxas -v prints it), the function's instruction count and
each loop (a backward branch: BRA to an earlier address) with its length
and its instructions by opcode class: memory (LDG/LDS/STG...), conversions
(F2FP, F2F, I2F, HADD2.F32, PRMT), FP32 (FFMA/FADD/FMUL), shuffles and the
rest. With RARE_OPCODE (e.g. SHFL: a warp reduction at the end of a row),
each loop's common path is counted too: the loop less the region that the
last forward branch before the first RARE_OPCODE instruction skips (its
target past that instruction). Analysis of issue slots only: it says
nothing about latency or stalls.
"""
import collections
import re
import sys

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def functions(path):
    name, body, labels, pending = None, [], {}, []
    for line in open(path):
        if line.startswith(".text."):
            if name:
                yield name, body, labels
            name, body, labels, pending = line.strip()[6:-1], [], {}, []
        elif name:
            lab = re.match(r"^(\.L_x_\d+):", line.strip())
            if lab:
                pending.append(lab.group(1))
                continue
            m = INSN.search(line)
            if m:
                body.append((int(m.group(1), 16), m.group(3), m.group(4), line.strip()))
                for lab_name in pending:
                    labels[lab_name] = int(m.group(1), 16)
                pending = []
    if name:
        yield name, body, labels


def klass(op):
    base = op.split(".")[0]
    if base in ("LDG", "LDS", "STG", "STS", "LD", "ST", "LDC", "ULDC", "LDGSTS", "RED", "ATOM"):
        return "mem:" + base
    if base in ("F2FP", "F2F", "I2F", "F2I", "HADD2", "HMUL2", "HFMA2", "PRMT"):
        return "cvt/f16:" + op
    if base in ("FFMA", "FADD", "FMUL"):
        return "fp32:" + base
    if base in ("SHFL",):
        return "shfl"
    return "other:" + base


def common_path(loop, labels, rare):
    first = next((n for n, b in enumerate(loop) if b[1].split(".")[0] == rare), None)
    if first is None:
        return None
    rare_addr = loop[first][0]
    for n in range(first - 1, -1, -1):
        addr, op, args, _line = loop[n]
        m = re.search(r"(\.L_x_\d+)", args) if op.startswith("BRA") else None
        if m and m.group(1) in labels and labels[m.group(1)] > rare_addr:
            end = labels[m.group(1)]
            return [b for b in loop if b[1] != "NOP" and not (addr < b[0] < end)]
    return None


def main():
    path, want = sys.argv[1], sys.argv[2]
    rare = sys.argv[3] if len(sys.argv) > 3 else None
    for name, body, labels in functions(path):
        if want not in name:
            continue
        real = [b for b in body if b[1] != "NOP"]
        print(f"{name}: {len(real)} instructions (NOPs excluded)")
        addr_index = {a: i for i, (a, *_rest) in enumerate(body)}
        for i, (addr, op, args, _line) in enumerate(body):
            if not op.startswith("BRA"):
                continue
            m = re.search(r"(\.L_x_\d+)", args)
            if not m or m.group(1) not in labels:
                continue
            target = labels[m.group(1)]
            if target > addr or target not in addr_index:
                continue
            loop = [b for b in body[addr_index[target]:i + 1] if b[1] != "NOP"]
            counts = collections.Counter(klass(b[1]) for b in loop)
            print(f"  loop {target:#06x}..{addr:#06x}: {len(loop)} instructions")
            for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
                print(f"    {v:4d} {k}")
            if rare:
                common = common_path(body[addr_index[target]:i + 1], labels, rare)
                if common is not None:
                    counts = collections.Counter(klass(b[1]) for b in common)
                    print(f"    common path (skipping the first {rare}'s region): {len(common)} instructions")
                    for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
                        print(f"      {v:4d} {k}")
        return
    sys.exit(f"no function matching {want}")


if __name__ == "__main__":
    main()
