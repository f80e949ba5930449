#!/usr/bin/env python3
# Screening input for issue 22 (docs/perf.md, "V after k4a"): per layer, per
# KV channel c = kvh * hd + i, the sum over the query heads of KV head kvh
# of W_o's column energy sum_out W_o[out, qh * hd + i]^2, one line "layer
# width" then the width values, as the fake-quant hook's RILL_SCREEN_VW_IN.
# usage: .venv-tools/bin/python tools/kv_wo_energy.py MODEL.gguf OUT.txt
import sys
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
r = GGUFReader(sys.argv[1])
kv = {f.name: f for f in r.fields.values()}
def val(name):
    f = kv[name]
    return int(f.parts[f.data[0]][0])
arch = bytes(kv['general.architecture'].parts[kv['general.architecture'].data[0]]).decode()
n_head = val(f'{arch}.attention.head_count'); n_kv = val(f'{arch}.attention.head_count_kv')
n_embd = val(f'{arch}.embedding_length'); hd = n_embd // n_head
t = {x.name: x for x in r.tensors}
out = open(sys.argv[2], 'w')
l = 0
while f'blk.{l}.attn_output.weight' in t:
    x = t[f'blk.{l}.attn_output.weight']
    w = dequantize(x.data, x.tensor_type).reshape(n_embd, n_head * hd).astype(np.float64)
    col = (w ** 2).sum(axis=0)
    g = n_head // n_kv
    u = np.zeros(n_kv * hd)
    for qh in range(n_head):
        u[(qh // g) * hd:(qh // g + 1) * hd] += col[qh * hd:(qh + 1) * hd]
    out.write(f'{l} {len(u)}\n' + ' '.join(f'{v:.9g}' for v in u) + '\n')
    l += 1
print(arch, n_head, n_kv, hd, l, 'layers')
