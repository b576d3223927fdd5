#!/usr/bin/env python3
"""How many small kernels a Kineto trace's steps launch, and which.

Reads the Chrome trace that `slipstream bench --profile` writes and prints
the kernels (copies and memsets included) per step, how many of them and
how much device time run under 5, 10, 20 and 50 us, and the 25 commonest
kernels under 20 us: in a CUDA graph each still costs its launch ramp and a
gap of about a microsecond, which a per-kernel time table hides. Then the
same small kernels by where the host launched them (the two innermost
operators open at the launch call, or DEPTH of them, through the trace's
correlation ids):
a graph's replay has no such link, so profile with the graph off
(training.cuda_graph=false) to see it.
Usage: trace_small.py TRACE.json [STEPS] [COMMONEST (default 25)] [DEPTH (default 2)]
"""
import collections
import json
import sys

from trace_index import TraceIndex


def main():
    events = json.load(open(sys.argv[1])).get("traceEvents", [])
    steps = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    k = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    print("kernels+copies per step %.0f, total %.2f ms/step"
          % (len(k) / steps, sum(e["dur"] for e in k) / 1e3 / steps))
    for limit in (5, 10, 20, 50):
        s = [e for e in k if e["dur"] < limit]
        print("under %d us: %.0f a step, %.2f ms a step"
              % (limit, len(s) / steps, sum(e["dur"] for e in s) / 1e3 / steps))
    count, time = collections.Counter(), collections.Counter()
    for e in k:
        if e["dur"] < 20:
            name = e["name"][:90]
            count[name] += 1
            time[name] += e["dur"]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    for name, n in count.most_common(top):
        print("%6.0f %7.3f ms  %s" % (n / steps, time[name] / 1e3 / steps, name))

    index = TraceIndex(events)
    depth = int(sys.argv[4]) if len(sys.argv) > 4 else 2

    def origin(kernel):
        launch = index.launch_of(kernel)
        if launch is None:
            return "(no launch call: a graph replay?)"
        open_ops = [e["name"] for e in index.open_ops(launch.get("tid"), launch["ts"])]
        return " < ".join(reversed(open_ops[-depth:])) if open_ops else "(no operator)"

    by, by_time = collections.Counter(), collections.Counter()
    for e in k:
        if e["dur"] < 20:
            key = "%s  [%s]" % (e["name"][:40], origin(e)[:60 + 45 * depth])
            by[key] += 1
            by_time[key] += e["dur"]
    print("by origin (kernel [innermost < outer operators open at its launch, %d deep]):" % depth)
    for key, n in by.most_common(top):
        print("%6.0f %7.3f ms  %s" % (n / steps, by_time[key] / 1e3 / steps, key))


if __name__ == "__main__":
    main()
