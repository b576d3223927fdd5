"""What trace_gaps.py and trace_small.py read from a Kineto trace alike.

TraceIndex(events) indexes a Chrome trace's events (as `slipstream bench
--profile` writes them): each GPU activity's launch call, by the
correlation id that the kernel and the runtime call share, and the host's
operators (cpu_op and user_annotation events) per thread, sorted by start,
so that open_ops(tid, ts) can say which operators were open on a thread at
a time (outermost first).
"""
import bisect
import collections


class TraceIndex:
    def __init__(self, events):
        self.launches = {}
        for e in events:
            if e.get("cat") == "cuda_runtime":
                c = e.get("args", {}).get("correlation")
                if c is not None:
                    self.launches[c] = e
        self.ops = collections.defaultdict(list)
        for e in events:
            if e.get("cat") in ("cpu_op", "user_annotation") and "dur" in e:
                self.ops[e.get("tid")].append(e)
        self.starts = {}
        for tid, lst in self.ops.items():
            lst.sort(key=lambda e: e["ts"])
            self.starts[tid] = [e["ts"] for e in lst]

    def launch_of(self, activity):
        """The runtime call that launched a kernel, copy or set, or None."""
        return self.launches.get(activity.get("args", {}).get("correlation"))

    def open_ops(self, tid, ts):
        """The operators open on thread `tid` at time `ts`, outermost first
        (among the 400 that started last before it)."""
        lst = self.ops.get(tid, [])
        hi = bisect.bisect_right(self.starts.get(tid, []), ts)
        return [e for e in lst[max(0, hi - 400):hi] if e["ts"] + e["dur"] >= ts]
