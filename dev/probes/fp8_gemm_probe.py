"""What fp8 would buy a Linear layer of the volume models at 200k rows, before
any of it is built: python3 dev/probes/fp8_gemm_probe.py [rows].

Per GEMM shape of a GALE / Transolver layer (out x in), the three products
of a training step (forward y = x w^T, input gradient g w, weight gradient
g^T x) in bf16 (cuBLAS through PyTorch) and in fp8 (torch._scaled_mm,
cuBLASLt: e4m3 x e4m3 forward, e5m2 x e4m3 backward, bf16 out), and the
passes an fp8 GEMM needs that a bf16 one does not: casting the bf16
activation and gradient to fp8 (one read of 2 bytes, one write of 1 byte
an element) with its amax, and the transposed fp8 copies the weight
gradient's product reads (cuBLASLt takes fp8 operands K-major only). The
casts are timed as PyTorch's eager kernels and as their bandwidth floor
(the bytes over the measured copy bandwidth): a cast fused into the
LayerNorm or GELU that makes the tensor costs about nothing, a separate
pass about the floor."""
import sys

import torch

from cuda_timing import timed

M = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
dev = "cuda"
bf = torch.bfloat16
e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2


big = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
dst = torch.empty_like(big)
copy_ms = timed(lambda: dst.copy_(big))
bw = 2 * big.numel() / copy_ms / 1e9  # TB/s (read + write)
del big, dst
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, rows {M}, copy {bw:.2f} TB/s")
one = torch.ones((), device=dev)
tot = {"bf16": 0.0, "fp8": 0.0, "cast_eager": 0.0, "cast_floor": 0.0}
for out, inp in [(448, 448), (1792, 448), (448, 1792)]:
    x = torch.randn(M, inp, device=dev, dtype=bf)
    g = torch.randn(M, out, device=dev, dtype=bf)
    w = torch.randn(out, inp, device=dev, dtype=bf)
    x8, w8, g8 = x.to(e4), w.to(e4), g.to(e5)
    w8t = w8.t().contiguous()  # (in, out): the input gradient's K-major w
    x8t, g8t = x8.t().contiguous(), g8.t().contiguous()  # the weight gradient's
    flop = 2.0 * M * out * inp
    rows = [
        ("forward", lambda: x.mm(w.t()),
         lambda: torch._scaled_mm(x8, w8.t(), one, one, out_dtype=bf)),
        ("fwd fast", lambda: x.mm(w.t()),
         lambda: torch._scaled_mm(x8, w8.t(), one, one, out_dtype=bf, use_fast_accum=True)),
        ("grad x", lambda: g.mm(w),
         lambda: torch._scaled_mm(g8, w8t.t(), one, one, out_dtype=bf)),
        ("grad w", lambda: g.t().mm(x),
         lambda: torch._scaled_mm(g8t, x8t.t(), one, one, out_dtype=bf)),
    ]
    for name, f16, f8 in rows:
        a, b = timed(f16), timed(f8)
        if name != "fwd fast":  # the totals take the plain forward
            tot["bf16"] += a
            tot["fp8"] += b
        print(f"({out:4d} x {inp:4d}) {name:8s} bf16 {a:6.3f} ms {flop / a / 1e9:5.0f} TFLOP/s"
              f"   fp8 {b:6.3f} ms {flop / b / 1e9:5.0f} TFLOP/s   x{a / b:4.2f}")
    # The casts one Linear's step adds: x to e4m3 (and its transpose for
    # grad w), g to e5m2 (and its transpose); w's casts are (out x in), small.
    ce = (timed(lambda: x.abs().amax()) + timed(lambda: x.to(e4))
          + timed(lambda: g.abs().amax()) + timed(lambda: g.to(e5))
          + timed(lambda: x8.t().contiguous()) + timed(lambda: g8.t().contiguous()))
    floor = (3 * M * inp + 3 * M * out + 2 * M * inp + 2 * M * out) / bw / 1e9
    tot["cast_eager"] += ce
    tot["cast_floor"] += floor
    print(f"({out:4d} x {inp:4d}) casts    eager {ce:6.3f} ms   floor {floor:6.3f} ms")
print(f"the three shapes, three products each: bf16 {tot['bf16']:.3f} ms, fp8 {tot['fp8']:.3f} ms;"
      f" casts eager {tot['cast_eager']:.3f} ms, floor {tot['cast_floor']:.3f} ms;"
      f" fp8 + floor {tot['fp8'] + tot['cast_floor']:.3f} ms")
