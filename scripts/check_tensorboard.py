"""Loads a run's event files with TensorBoard's own reader and checks that
every train step in metrics.jsonl has its scalars there (same step, same
value to float precision). Usage: check_tensorboard.py RUN_DIR"""
import glob
import json
import math
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

run = sys.argv[1]
steps = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
train = [r for r in steps if r["phase"] == "train_step"]
acc = EventAccumulator(f"{run}/tb/train", size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags()["scalars"]
loss = {e.step: e.value for e in acc.Scalars("iteration/loss/total")}
lr = {e.step: e.value for e in acc.Scalars("iteration/lr")}
bad = 0
for r in train:
    s = r["global_step"]
    if s not in loss or not math.isclose(loss[s], r["loss"], rel_tol=1e-6, abs_tol=1e-12):
        bad += 1
    if s not in lr:
        bad += 1
val = EventAccumulator(f"{run}/tb/val", size_guidance={"scalars": 0})
val.Reload()
print(f"tensorboard reader: {len(tags)} train tags, {len(loss)} loss points for "
      f"{len(train)} train steps in metrics.jsonl, {len(val.Tags()['scalars'])} val tags, "
      f"mismatches: {bad}")
sys.exit(1 if bad or len(loss) != len(train) else 0)
