#!/usr/bin/env python3
"""Host check of fp8_mma_kernel's index math (src/backend/cuda/fp8_mma.cu),
restated line by line: the loader's swizzled stage layout, the lanes'
16-byte fragment loads, the mma.m16n8k16 fragment tables of the PTX ISA
(A a0..a3, B b0/b1, C c0..c3), the epilogue tile; small integer operands so
the emulated sums must equal the direct product exactly, for the e4m3-x and
the bf16-x forms, partial token tiles, partial rows and a stage with only
16 valid columns, plain and GLU slabs (gate rows then up rows), slab 0 and
a later one. The copies are replayed in the kernel's form since issue 23
(a block-wide row base + 32-bit offsets, slot swz(lr, cc) + i 32 kKT) and
checked against the direct form (slab row lr + 32 i at swz(lr + 32 i, cc)).
Then the shared-memory bank check: every quarter-warp's 16-byte loads and
copies fall on 8 distinct bank groups. Needs numpy.
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

def slab_row(n_rows, n_ff, slab, lr):
    # fp8_mma.cu slab_row: (global row, valid)
    if n_ff > 0:
        i = slab * (kBM // 2) + (lr & (kBM // 2 - 1))
        return (i if lr < kBM // 2 else n_ff + i), i < n_ff
    r = slab * kBM + lr
    return r, r < n_rows

def run(xb, NT, n_tokens, n_rows, n_cols, c_begin, n_iter, glu=False, slab=0):
    W = rng.integers(-8, 9, size=(n_rows, n_cols)).astype(float)
    X = rng.integers(-8, 9, size=(n_tokens, n_cols)).astype(float)
    n_ff = n_rows // 2 if glu else 0
    kNP = 8 * NT
    xbytes = 2 if xb else 1
    kXChunks = kKT * xbytes // 16
    kTokStep = kThreads // kXChunks
    ld = 16 + n_cols  # fp8_row_bytes: a 16-byte header, then the codes
    x_ld = n_cols * xbytes
    # the matrix and x as the kernel addresses them: element of byte offset
    wmem = np.full(n_rows * ld, np.nan); xmem = np.full(n_tokens * x_ld, np.nan)
    for r in range(n_rows): wmem[r * ld + 16: r * ld + 16 + n_cols] = W[r]
    for tk in range(n_tokens): xmem[tk * x_ld: (tk + 1) * x_ld: xbytes] = X[tk]
    # the kernel's block-wide part: row0[h], n_ok[h], n_cols_left
    row0 = [slab_row(n_rows, n_ff, slab, kBM // 2 * h)[0] for h in range(2)]
    ends = [n_ff if glu else n_rows, n_rows]
    n_ok = [max(0, min(ends[h] - row0[h], kBM // 2)) for h in range(2)]
    n_cols_left = n_cols - c_begin * kKT
    # smem per stage as element arrays: weights one element per byte; x: e4m3 one per byte, bf16 one per 2 bytes
    acc = {w: [[[0.0]*4 for _ in range(32)] for _ in range(2 * NT)] for w in range(8)}
    for it in range(n_iter):
        k = (c_begin + it) * kKT
        sa = np.zeros(kBM * kKT); sb = np.zeros(kNP * kKT)  # indexed by element
        filled_a = np.zeros(kBM * kKT, bool)
        for tid in range(kThreads):
            # load_w: the kernel's form
            cc, lr = tid & 7, tid >> 3
            a_off = lr * ld + 16 + cc * 16  # bytes past row0[h] (16: the row header)
            a_dst = swz(lr, cc)
            inn = cc * 16 + it * kKT < n_cols_left
            for i in range(kBM * (kKT // 16) // kThreads):
                h, step = i >> 1, 32 * (i & 1)
                ok = lr + step < n_ok[h] and inn
                src = row0[h] * ld + (c_begin + it) * kKT + a_off + step * ld  # bytes from the matrix start
                off = a_dst + i * 32 * kKT
                assert a_off + step * ld < 2**32
                # the direct form it stands for
                lr_i = lr + (kThreads // 8) * i
                row, valid = slab_row(n_rows, n_ff, slab, lr_i)
                assert off == swz(lr_i, cc) and ok == (valid and k + cc * 16 < n_cols)
                if ok: assert src == row * ld + 16 + k + cc * 16
                for e in range(16):
                    sa[off + e] = wmem[src + e] if ok else 0.0
                    filled_a[off + e] = True
            # load_x
            cb, tok = tid % kXChunks, tid // kXChunks
            b_dst = xswz(xb, tok, cb)  # byte offset in the x region
            kB = kNP * kXChunks
            inn = cb * 16 // xbytes + it * kKT < n_cols_left
            for i in range((kB + kThreads - 1) // kThreads):
                if tid + kThreads * i >= kB: continue
                tok_i = tok + kTokStep * i
                ok = tok_i < n_tokens and inn
                off = b_dst + i * kTokStep * kXChunks * 16
                assert off == xswz(xb, (tid + kThreads * i) // kXChunks, cb)
                b_off = tok * x_ld + cb * 16
                src = (c_begin + it) * kKT * xbytes + b_off + kTokStep * i * x_ld
                assert b_off + kTokStep * i * x_ld < 2**32
                if ok: assert src == tok_i * x_ld + (k + cb * 16 // xbytes) * xbytes
                for e in range(16 // xbytes):  # elements of the chunk
                    sb[(off // xbytes) + e] = xmem[src + e * xbytes] if ok else 0.0
        assert filled_a.all() and not np.isnan(sa).any() and not np.isnan(sb).any()
        def lda(byte_off):  # 16 bytes of weights -> 16 elements
            return sa[byte_off:byte_off+16]
        def ldb(byte_off):
            return sb[byte_off // xbytes: byte_off // xbytes + 16 // xbytes]
        for warp in range(8):
            ra = {}; rbv = {}
            for lane in range(32):
                # the main loop's lane coordinates (from a fresh threadIdx.x)
                tid_now = 32 * warp + lane
                g_now = (tid_now & 31) >> 2
                row_now = 32 * ((tid_now >> 5) & 3) + g_now
                chunk_now = 4 * (tid_now >> 7) + (tid_now & 3)
                for m in range(2):
                    for h in range(2):
                        ra[(lane, m, h)] = lda(swz(row_now + 16*m + 8*h, chunk_now))
                for j in range(NT):
                    if xb:
                        rbv[(lane, j)] = np.concatenate([ldb(xswz(True, 8*j+g_now, 2*chunk_now+hs)) for hs in range(2)])
                    else:
                        rbv[(lane, j)] = ldb(swz(8*j+g_now, chunk_now))
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
    lrs = [lr for lr in range(kBM) if slab_row(n_rows, n_ff, slab, lr)[1]]
    rows = [slab_row(n_rows, n_ff, slab, lr)[0] for lr in lrs]
    assert lrs
    got = tile[:n_tokens, lrs]
    err = np.abs(got - ref[:, rows]).max()
    print(f"xb={xb} NT={NT} n={n_tokens} rows={n_rows} cols={n_cols} part {c_begin}+{n_iter}"
          f"{' glu' if glu else ''} slab {slab}: max err {err}")
    assert err == 0

for xb in (False, True):
    run(xb, 1, 3, 128, 256, 0, 2)
    run(xb, 2, 13, 100, 400, 1, 3)   # 400 cols: last chunk partial (16-col granularity)
    run(xb, 8, 64, 128, 128, 0, 1)
    run(xb, 3, 20, 300, 256, 0, 2, slab=2)         # the last plain slab: rows 256..299
    run(xb, 2, 9, 200, 256, 1, 1, glu=True, slab=1)  # GLU, n_ff 100: gate 64..99, up 164..199

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
  for i in range(4):  # slot swz(lr, cc) + i 32 kKT
    ok &= check([swz(((32*w+l)>>3), (32*w+l)&7) + i*32*kKT for l in range(32)], "A write")
  ok &= check([xswz(True, (32*w+l)//16, (32*w+l)%16) for l in range(32)], "B bf16 write")
print("all conflict-free" if ok else "conflicts")
