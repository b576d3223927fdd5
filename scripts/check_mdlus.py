#!/usr/bin/env python3
"""Check a .mdlus that `slipstream export` wrote with readers nobody here wrote.

Usage: check_mdlus.py EXPORTED.mdlus REFERENCE.mdlus

Python's zipfile opens the archive (and checks every CRC), torch.load reads
its model.pt with weights_only=True (the safe unpickler PhysicsNeMo's
Module.load gets by default), and the state dict's keys, shapes and dtypes
must equal those of REFERENCE, a .mdlus PhysicsNeMo's own Module.save wrote
for the same configuration; args.json must name the same class and
arguments. Exits 1 on any difference.
"""
import io
import json
import sys
import zipfile

import torch


def load(path):
    with zipfile.ZipFile(path) as z:
        bad = z.testzip()
        if bad is not None:
            sys.exit(f"{path}: entry {bad} fails its CRC")
        names = set(z.namelist())
        for need in ("model.pt", "args.json", "metadata.json"):
            if need not in names:
                sys.exit(f"{path}: no {need}")
        state = torch.load(io.BytesIO(z.read("model.pt")), map_location="cpu", weights_only=True)
        return state, json.loads(z.read("args.json")), json.loads(z.read("metadata.json"))


def main():
    ours, ref = sys.argv[1], sys.argv[2]
    s_ours, a_ours, m_ours = load(ours)
    s_ref, a_ref, _ = load(ref)
    failures = 0
    if list(s_ours.keys()) != list(s_ref.keys()):
        missing = [k for k in s_ref if k not in s_ours]
        extra = [k for k in s_ours if k not in s_ref]
        print(f"keys differ: missing {missing[:5]}, extra {extra[:5]}; same order: "
              f"{sorted(s_ours) == sorted(s_ref)}")
        failures += bool(missing or extra)
    for k, v in s_ref.items():
        if k in s_ours and (s_ours[k].shape != v.shape or s_ours[k].dtype != v.dtype):
            print(f"{k}: ours {tuple(s_ours[k].shape)} {s_ours[k].dtype}, "
                  f"PhysicsNeMo {tuple(v.shape)} {v.dtype}")
            failures += 1
    for key in ("__name__", "__module__"):
        if a_ours[key] != a_ref[key]:
            print(f"args.json {key}: ours {a_ours[key]}, PhysicsNeMo {a_ref[key]}")
            failures += 1
    diff = {k for k in set(a_ours["__args__"]) | set(a_ref["__args__"])
            if a_ours["__args__"].get(k) != a_ref["__args__"].get(k)}
    if diff:
        print(f"args.json __args__ differ in {sorted(diff)}")
        failures += 1
    n = sum(v.numel() for v in s_ours.values())
    print(f"{ours}: {len(s_ours)} tensors, {n} parameters, torch.load(weights_only=True) ok, "
          f"metadata {m_ours}; against {ref}: {failures} differences")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
