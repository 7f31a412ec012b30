"""Reads a memcg-trace HdrHistogram interval log with HdrHistogram_py's HistogramLogReader, an
independent reader, and checks it against the recording of the same run: per tag
(`probe.context`, `probe.workload`) the intervals add up to the recording's count exactly, their
maximum is in the bucket of the recording's max, the intervals follow each other in time, and in
every interval a probe's workload calls are no more than its task-context calls (one snapshot).

Usage: hdr_log_check.py LOG RECORDING.json
Prints one line per tag and `hdr_log_check: N tags, M intervals, K failures`; exits 1 on any
failure (or when the log holds no interval).
"""

import json
import sys

from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader


def rows(doc):
    """tag -> (count, latency) of every row with a latency histogram."""
    out = {}
    for p in doc["probes"]:
        for c in p["contexts"]:
            if c.get("latency"):
                out[f'{p["name"]}.{c["context"]}'] = (c["count"], c["latency"])
        w = p.get("workload")
        if w and w.get("latency"):
            out[f'{p["name"]}.workload'] = (w["count"], w["latency"])
    return out


def main():
    log_path, rec_path = sys.argv[1], sys.argv[2]
    with open(rec_path) as f:
        doc = json.load(f)
    want = rows(doc)
    reader = HistogramLogReader(log_path, HdrHistogram(1, 1 << 40, 1))
    merged = {}
    by_interval = {}
    last_start = {}
    per_tag = {}
    intervals = 0
    failures = []
    while True:
        h = reader.get_next_interval_histogram()
        if h is None:
            break
        intervals += 1
        tag = h.get_tag()
        start = h.get_start_time_stamp()
        if tag in last_start and start <= last_start[tag]:
            failures.append(f"{tag}: interval at {start} ms does not follow {last_start[tag]} ms")
        last_start[tag] = start
        per_tag[tag] = per_tag.get(tag, 0) + 1
        by_interval.setdefault(start, {})[tag] = h.get_total_count()
        if tag not in merged:
            merged[tag] = HdrHistogram(1, 1 << 40, 1)
        merged[tag].add(h)
    for tag, (count, lat) in sorted(want.items()):
        m = merged.get(tag)
        got = m.get_total_count() if m else 0
        if got != count:
            failures.append(f"{tag}: intervals add up to {got} calls, the recording has {count}")
            continue
        if count and not m.values_are_equivalent(m.get_max_value(), lat["max_ns"]):
            failures.append(f"{tag}: max {m.get_max_value()} not in the bucket of {lat['max_ns']}")
            continue
        if count:
            print(f"hdr_log_check: {tag}: {count} calls in {per_tag[tag]} intervals ok")
    # One snapshot per interval: a probe's workload calls are among its task-context calls.
    for start, counts in sorted(by_interval.items()):
        for tag, n in counts.items():
            if tag.endswith(".workload"):
                task = counts.get(tag[: -len("workload")] + "task", 0)
                if n > task:
                    failures.append(f"{tag}: {n} calls in the interval at {start} ms, more than the task context's {task}")
    extra = sorted(set(merged) - set(want))
    if extra:
        failures.append(f"tags the recording does not have: {extra}")
    for f in failures:
        print(f"hdr_log_check: FAILED: {f}")
    print(f"hdr_log_check: {len(merged)} tags, {intervals} intervals, {len(failures)} failures")
    sys.exit(1 if failures or intervals == 0 else 0)


if __name__ == "__main__":
    main()
