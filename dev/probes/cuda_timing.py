"""timed(f): the mean CUDA time of f() in ms over `reps` calls after three
warm-up calls, from CUDA events; for the probe scripts beside it."""
import torch


def timed(f, reps=20):
    for _ in range(3):
        f()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        f()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps
