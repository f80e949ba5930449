#!/usr/bin/env python3
"""Host check of fp8_mma_kernel's index math (src/backend/cuda/fp8_mma.cu),
restated line by line: the loader's swizzled stage layout, the lanes'
16-byte fragment loads, the mma.m16n8k16 fragment tables of the PTX ISA
(A a0..a3, B b0/b1, C c0..c3), the epilogue tile; small integer operands so
the emulated sums must equal the direct product exactly, for the e4m3-x and
the bf16-x forms, partial token tiles, partial rows and a stage with only
16 valid columns. Then the shared-memory bank check: every quarter-warp's
16-byte loads and copies fall on 8 distinct bank groups. Needs numpy.
Written before the kernel first ran on a GPU (branch fp8mma23)."""
import numpy as np

rng = np.random.default_rng(1)
kBM, kKT, kThreads = 128, 128, 256

def swz(r, c): return r * kKT + ((c ^ ((r & 1) << 2)) << 4)
def xswz(xb, r, c):
    return r * 2 * kKT + ((c ^ (r & 1)) << 4) if xb else swz(r, c)

def mma(acc, a, b):
    # a[lane] = 4 regs each a pair (lo, hi); b[lane] = 2 regs pairs. Build A 16x16, B 16x8 per PTX tables.
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for reg, (row, col) in enumerate([(g, 2*t), (g+8, 2*t), (g, 2*t+8), (g+8, 2*t+8)]):
            A[row, col], A[row, col+1] = a[lane][reg]
        for reg, krow in enumerate([2*t, 2*t+8]):
            B[krow, g], B[krow+1, g] = b[lane][reg]
    D = A @ B
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        acc[lane][0] += D[g, 2*t]; acc[lane][1] += D[g, 2*t+1]
        acc[lane][2] += D[g+8, 2*t]; acc[lane][3] += D[g+8, 2*t+1]

def run(xb, NT, n_tokens, n_rows, n_cols, c_begin, n_iter):
    W = rng.integers(-8, 9, size=(n_rows, n_cols)).astype(float)
    X = rng.integers(-8, 9, size=(n_tokens, n_cols)).astype(float)
    kNP = 8 * NT
    xbytes = 2 if xb else 1
    kXChunks = kKT * xbytes // 16
    slab = 0
    # smem per stage as element arrays: weights one element per byte; x: e4m3 one per byte, bf16 one per 2 bytes
    acc = {w: [[[0.0]*4 for _ in range(32)] for _ in range(2 * NT)] for w in range(8)}
    for it in range(n_iter):
        k = (c_begin + it) * kKT
        sa = np.zeros(kBM * kKT); sb = np.zeros(kNP * kKT)  # indexed by element
        filled_a = np.zeros(kBM * kKT, bool)
        for tid in range(kThreads):
            cc = tid & 7
            for i in range(kBM * (kKT // 16) // kThreads):
                lr = (tid >> 3) + (kThreads // 8) * i
                row = slab * kBM + lr
                off = swz(lr, cc)
                for e in range(16):
                    col = k + cc * 16 + e
                    ok = row < n_rows and (k + cc * 16) < n_cols
                    sa[off + e] = W[row, col] if ok else 0.0
                    filled_a[off + e] = True
            cb = tid % kXChunks
            kB = kNP * kXChunks
            for i in range((kB + kThreads - 1) // kThreads):
                idd = tid + kThreads * i
                if idd >= kB: continue
                tok = idd // kXChunks
                off = kBM * kKT * 0 + xswz(xb, tok, cb)  # byte offset in the x region
                ok = tok < n_tokens and (k + cb * 16 // xbytes) < n_cols
                for e in range(16 // xbytes):  # elements of the chunk
                    col = k + cb * 16 // xbytes + e
                    sb[(off // xbytes) + e] = X[tok, col] if ok else 0.0
        assert filled_a.all()
        def lda(byte_off):  # 16 bytes of weights -> 16 elements
            return sa[byte_off:byte_off+16]
        def ldb(byte_off):
            return sb[byte_off // xbytes: byte_off // xbytes + 16 // xbytes]
        for warp in range(8):
            rg, kh = warp & 3, warp >> 2
            chunk_l = None
            ra = {}; rbv = {}
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                chunk = 4 * kh + t
                for m in range(2):
                    for h in range(2):
                        ra[(lane, m, h)] = lda(swz(32*rg + 16*m + 8*h + g, chunk))
                for j in range(NT):
                    if xb:
                        rbv[(lane, j)] = np.concatenate([ldb(xswz(True, 8*j+g, 2*chunk+hs)) for hs in range(2)])
                    else:
                        rbv[(lane, j)] = ldb(swz(8*j+g, chunk))
            for s in range(4):
                for j in range(NT):
                    for m in range(2):
                        a = []; b = []
                        for lane in range(32):
                            lo = ra[(lane, m, 0)][4*s:4*s+4]; hi = ra[(lane, m, 1)][4*s:4*s+4]
                            a.append([(lo[0], lo[1]), (hi[0], hi[1]), (lo[2], lo[3]), (hi[2], hi[3])])
                            if xb:
                                hs, s2 = s // 2, s % 2
                                words = rbv[(lane, j)][8*hs:8*hs+8]  # 8 bf16 = 4 words
                                b.append([(words[4*s2], words[4*s2+1]), (words[4*s2+2], words[4*s2+3])])
                            else:
                                wb = rbv[(lane, j)][4*s:4*s+4]
                                b.append([(wb[0], wb[1]), (wb[2], wb[3])])
                        mma(acc[warp][m * NT + j], a, b)
    # epilogue tile
    tile = np.zeros((kNP, kBM + 4))
    for warp in range(8):
        rg, kh = warp & 3, warp >> 2
        for m in range(2):
            for j in range(NT):
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    for e in range(4):
                        lr = 32*rg + 16*m + g + 8*(e >> 1); tok = 8*j + 2*t + (e & 1)
                        tile[tok, lr] += acc[warp][m*NT + j][lane][e]
    k0, k1 = c_begin * kKT, min(n_cols, (c_begin + n_iter) * kKT)
    ref = X[:, k0:k1] @ W[:, k0:k1].T  # [tok, row]
    got = tile[:n_tokens, :min(kBM, n_rows)]
    err = np.abs(got - ref[:, :kBM]).max()
    print(f"xb={xb} NT={NT} n={n_tokens} rows={n_rows} cols={n_cols} part {c_begin}+{n_iter}: max err {err}")
    assert err == 0

for xb in (False, True):
    run(xb, 1, 3, 128, 256, 0, 2)
    run(xb, 2, 13, 100, 400, 1, 3)   # 400 cols: last chunk partial (16-col granularity)
    run(xb, 8, 64, 128, 128, 0, 1)

def check(addrs, what):
    # per quarter-warp: 8 lanes x 16 B -> groups of 4 banks = (addr % 128) // 16 must be distinct
    for q in range(4):
        grp = [(addrs[l] % 128)//16 for l in range(8*q, 8*q+8)]
        if len(set(grp)) != 8: print("CONFLICT", what, q, grp); return False
    return True
ok=True
for xb in (False, True):
  for kh in range(2):
    for rg in range(4):
      for m in range(2):
        for h in range(2):
          ok &= check([swz(32*rg+16*m+8*h+(l>>2), 4*kh+(l&3)) for l in range(32)], f"A kh{kh} rg{rg} m{m} h{h}")
      for j in range(8):
        if xb:
          for hs in range(2):
            ok &= check([xswz(True, 8*j+(l>>2), 2*(4*kh+(l&3))+hs) for l in range(32)], f"Bbf j{j} hs{hs}")
        else:
          ok &= check([swz(8*j+(l>>2), 4*kh+(l&3)) for l in range(32)], f"B j{j}")
# writes: thread tid writes A chunk (tid&7) of row tid>>3 (+32i); B bf16 chunk tid%16 of token tid//16
for w in range(8):
  ok &= check([swz(((32*w+l)>>3), (32*w+l)&7) for l in range(32)], "A write")
  ok &= check([xswz(True, (32*w+l)//16, (32*w+l)%16) for l in range(32)], "B bf16 write")
print("all conflict-free" if ok else "conflicts")
