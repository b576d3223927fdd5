#!/usr/bin/env python3
"""Where a Kineto trace's GPU sits idle, and why.

Reads the Chrome trace that `slipstream bench --profile` writes, lays the
GPU's kernels, copies and sets end to end, and sums the idle gaps between
them. Each gap is put down to the activity that follows it:
  starved  its launch call came after the GPU had gone idle (the host was
           late: the gap is host time), named by the operators around it;
  queued   it had been launched before the gap began (the GPU waited on
           something else: an event, a copy, another stream).
Usage: trace_gaps.py TRACE.json [STEPS] [TOP]
"""
import collections
import json
import sys

from trace_index import TraceIndex


def main():
    path = sys.argv[1]
    steps = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    events = json.load(open(path)).get("traceEvents", [])
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                  and "dur" in e), key=lambda e: e["ts"])
    index = TraceIndex(events)
    ops = index.ops

    def enclosing(tid, ts):
        """Outermost and innermost operators on `tid` open at `ts`."""
        open_ops = index.open_ops(tid, ts)
        if not open_ops:
            return "(none)", "(none)"
        return open_ops[0]["name"], open_ops[-1]["name"]

    if not gpu:
        print("trace_gaps: no GPU activity in", path)
        return
    busy = gpu[0]["dur"]
    idle = collections.Counter()
    count = collections.Counter()
    total_gap = 0.0
    end = gpu[0]["ts"] + gpu[0]["dur"]
    span0 = gpu[0]["ts"]
    for e in gpu[1:]:
        gap = e["ts"] - end
        if gap > 1.0:  # microseconds
            total_gap += gap
            launch = index.launch_of(e)
            if launch is None:
                key = ("unknown", "(no launch record)", e.get("name", "?")[:60])
            elif launch["ts"] > end:
                outer, inner = enclosing(launch.get("tid"), launch["ts"])
                key = ("starved", outer[:50] + " > " + inner[:50], e.get("name", "?")[:60])
            else:
                key = ("queued", launch.get("name", "?"), e.get("name", "?")[:60])
            idle[key] += gap
            count[key] += 1
        busy += e["dur"]
        end = max(end, e["ts"] + e["dur"])
    span = end - span0
    print("GPU span %.2f ms/step, busy %.2f, idle %.2f (gaps > 1 us)" %
          (span / steps / 1e3, busy / steps / 1e3, total_gap / steps / 1e3))
    by_kind = collections.Counter()
    for key, v in idle.items():
        by_kind[key[0]] += v
    for kind, v in by_kind.most_common():
        print("  %-8s %8.3f ms/step" % (kind, v / steps / 1e3))
    for key, v in idle.most_common(top):
        print("  %8.3f ms/step %6.0f gaps  %-8s %s  -> %s" %
              (v / steps / 1e3, count[key] / steps, key[0], key[1], key[2]))
    # The host's time in each phase of the trainer's step (its "step.*"
    # scopes): the sum over the trace per step, and the median of one
    # phase's runs (the sum also holds one-off runs, such as the first
    # step's set-up or the epoch's final drain).
    phases = collections.defaultdict(list)
    for lst in ops.values():
        for e in lst:
            if e["name"].startswith("step."):
                phases[e["name"]].append(e["dur"])
    if phases:
        print("host time per step phase: sum/steps, median run (ms), runs")
        for name, durs in sorted(phases.items(), key=lambda kv: -sum(kv[1])):
            durs.sort()
            print("  %-16s %8.3f %8.3f %5d" %
                  (name, sum(durs) / steps / 1e3, durs[len(durs) // 2] / 1e3, len(durs)))


if __name__ == "__main__":
    main()
