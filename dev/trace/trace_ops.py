#!/usr/bin/env python3
"""Which operators launch a Kineto trace's most expensive GPU kernels.

Reads the Chrome trace that `slipstream bench --profile` writes and, for the
kernels with the most device time, lists the launching operators (by the
trace's "External id") with their input shapes and dtypes, summed.
Usage: trace_ops.py TRACE.json [TOP_KERNELS] [STEPS]
"""
import collections
import json
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    steps = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    events = json.load(open(path)).get("traceEvents", [])
    ops = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            ext = e.get("args", {}).get("External id")
            if ext is not None:
                # The innermost (shortest) operator with this id launched the kernel.
                if ext not in ops or e.get("dur", 0) < ops[ext].get("dur", 0):
                    ops[ext] = e
    by_kernel = collections.defaultdict(lambda: collections.Counter())
    totals = collections.Counter()
    for e in events:
        if e.get("cat") != "kernel":
            continue
        name = e.get("name", "?")
        totals[name] += e.get("dur", 0.0)
        op = ops.get(e.get("args", {}).get("External id"))
        if op is None:
            key = "(no operator)"
        else:
            a = op.get("args", {})
            key = "%s %s %s" % (op.get("name"), a.get("Input Dims", ""), a.get("Input type", ""))
        by_kernel[name][key] += e.get("dur", 0.0)
    for name, total in totals.most_common(top):
        print("%8.3f ms/step  %s" % (total / steps / 1e3, name[:120]))
        for key, dur in by_kernel[name].most_common(4):
            print("      %8.3f  %s" % (dur / steps / 1e3, key[:200]))


if __name__ == "__main__":
    main()
