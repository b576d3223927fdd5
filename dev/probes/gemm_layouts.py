"""Times the bf16 GEMMs of a GeoTransolver volume layer (200k rows) in each
operand layout cuBLAS can be handed, so that linear.cpp's choice of layout
rests on a measurement: python3 dev/probes/gemm_layouts.py [rows]."""
import sys

import torch

from cuda_timing import timed

M = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
dev = "cuda"
bf = torch.bfloat16


def report(what, ms, flop):
    print(f"{what:58s} {ms:7.3f} ms {flop / ms / 1e9:6.0f} TFLOP/s")


print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, rows {M}")
for out, inp in [(448, 448), (1792, 448), (448, 1792), (896, 448)]:
    x = torch.randn(M, inp, device=dev, dtype=bf)
    g = torch.randn(M, out, device=dev, dtype=bf)
    w = torch.randn(out, inp, device=dev, dtype=bf)
    b = torch.randn(out, device=dev, dtype=bf)
    wt = w.t().contiguous()  # (in, out)
    flop = 2.0 * M * out * inp
    tag = f"({out} x {inp})"
    report(f"{tag} forward  addmm(b, x, w^T)", timed(lambda: torch.addmm(b, x, w.t())), flop)
    report(f"{tag} forward  addmm(b, x, wt) (w stored transposed)",
           timed(lambda: torch.addmm(b, x, wt)), flop)
    report(f"{tag} grad x   g.mm(w)", timed(lambda: g.mm(w)), flop)
    report(f"{tag} grad x   g.mm(wt^T) (w stored transposed)", timed(lambda: g.mm(wt.t())), flop)
    report(f"{tag} grad x   (w^T.mm(g^T))^T", timed(lambda: w.t().mm(g.t()).t()), flop)
    report(f"{tag} grad w   g^T.mm(x)", timed(lambda: g.t().mm(x)), flop)
    report(f"{tag} grad w   (x^T.mm(g))^T", timed(lambda: x.t().mm(g).t().contiguous()), flop)
    acc = torch.zeros(M, inp, device=dev, dtype=bf)
    report(f"{tag} grad x   acc.addmm_(g, w) (accumulating)",
           timed(lambda: acc.addmm_(g, w)), flop)
    report(f"{tag} grad x   acc.addmm_(g, wt^T) (accumulating, w stored transposed)",
           timed(lambda: acc.addmm_(g, wt.t())), flop)
    report(f"{tag} grad x   acc.add_(g.mm(wt^T)) (a GEMM, then an add)",
           timed(lambda: acc.add_(g.mm(wt.t()))), flop)
# The two projections of a GALE layer (in_project_x, in_project_fx) as one.
x = torch.randn(M, 448, device=dev, dtype=bf)
w2 = torch.randn(896, 448, device=dev, dtype=bf)
g2 = torch.randn(M, 896, device=dev, dtype=bf)
report("(896 x 448) as two (448 x 448) forwards", timed(
    lambda: (torch.mm(x, w2[:448].t()), torch.mm(x, w2[448:].t()))), 2.0 * M * 896 * 448)
report("(896 x 448) grad x as one g.mm(w)", timed(lambda: g2.mm(w2)), 2.0 * M * 896 * 448)
