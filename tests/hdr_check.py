"""Decodes every histogram of a memcg-trace recording with HdrHistogram_py, an independent
reader, and checks it against the recording's own figures: total count, min, max, p50 and p99,
each within the resolution the histogram's header states.

Usage: hdr_check.py RECORDING.json
Prints one line per histogram and `hdr_check: N histograms decoded, M failures`; exits 1 on any
failure.
"""

import json
import math
import sys

from hdrh.histogram import HdrHistogram


def latencies(doc):
    """(where, count, latency) of every histogram in the recording."""
    for p in doc["probes"]:
        for c in p["contexts"]:
            if c.get("latency"):
                yield f'{p["name"]} {c["context"]}', c["count"], c["latency"]
        w = p.get("workload")
        if w and w.get("latency"):
            yield f'{p["name"]} workload', w["count"], w["latency"]


def pct(latency, q):
    for x in latency["percentiles"]:
        if abs(x["q"] - q) < 1e-9:
            return x["ns"]
    raise KeyError(q)


def check(where, count, lat):
    """Problems with one histogram (empty: none)."""
    enc = lat["hdr_v2"]
    if not enc.startswith("HISTF"):
        return [f"not the compressed V2 form: starts {enc[:6]!r}"]
    h = HdrHistogram.decode(enc)
    bad = []
    if h.get_total_count() != count:
        bad.append(f"total count {h.get_total_count()} != {count}")
    if h.significant_figures != 1:
        bad.append(f"header states {h.significant_figures} significant digits, not 1")

    def same_bucket(name, got, want):
        if not h.values_are_equivalent(got, want):
            lo = h.get_lowest_equivalent_value(want)
            hi = h.get_highest_equivalent_value(want)
            bad.append(f"{name} {got} outside the bucket of {want} [{lo}, {hi}]")

    if count > 0:
        same_bucket("min", h.get_min_value(), lat["min_ns"])
        same_bucket("max", h.get_max_value(), lat["max_ns"])
        for q in (0.5, 0.99):
            # The percentile's rank, rounded up (memcg-trace, the Rust port) or to the nearest
            # (this reader): the recording's value must be in the bucket of one of them, and
            # this reader's own answer too.
            ranks = sorted({min(max(r, 1), count) for r in (math.ceil(q * count), int(q * count + 0.5))})
            at = [value_at_rank(h, r) for r in ranks]
            want = pct(lat, q)
            if not any(h.values_are_equivalent(v, want) for v in at):
                bad.append(f"p{q * 100:g} {want} not in the bucket of rank {ranks}: {at}")
            got = h.get_value_at_percentile(q * 100)
            if not any(h.values_are_equivalent(v, got) for v in at):
                bad.append(f"reader's p{q * 100:g} {got} not in the bucket of rank {ranks}: {at}")
    return bad


def value_at_rank(h, rank):
    """The (highest equivalent) value of the bucket holding the rank-th smallest call."""
    seen = 0
    for item in h.get_recorded_iterator():
        seen += item.count_at_value_iterated_to
        if seen >= rank:
            return h.get_highest_equivalent_value(item.value_iterated_to)
    return h.get_max_value()


def main():
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    n = failures = 0
    for where, count, lat in latencies(doc):
        n += 1
        bad = check(where, count, lat)
        if bad:
            failures += 1
            print(f"hdr_check: {where}: FAILED: {'; '.join(bad)}")
        else:
            print(f"hdr_check: {where}: {count} calls ok")
    print(f"hdr_check: {n} histograms decoded, {failures} failures")
    sys.exit(1 if failures or n == 0 else 0)


if __name__ == "__main__":
    main()
