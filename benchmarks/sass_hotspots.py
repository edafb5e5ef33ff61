"""Where a kernel's warp samples fall, loop by loop of its SASS (from Nsight Compute).

Reads the per-instruction table of one profiled launch, as written by

    ncu --section SourceCounters ... -o report python3 target.py
    ncu -i report.ncu-rep --page source --csv --print-source sass > sass.csv

(optionally gzipped), and prints the kernel's totals, then the loops (the
instructions between a backward branch and its target) with the largest
share of warp-state samples: their share of samples and of executed
instructions, their shared-memory wavefronts and the excess ones (bank
conflicts), barrier-stall samples, and their most frequent opcodes. The
samples say where warps spend their time, the instruction counts where the
issue slots go; a loop with many samples per instruction waits (on memory, a
barrier). Loops nest, so shares of nested loops overlap.

    python benchmarks/sass_hotspots.py sass.csv.gz --top 14
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re

_BRANCH = re.compile(r"BRA\s+(?:`\()?(0x[0-9a-f]+)")
_PREDICATE = re.compile(r"^@!?U?P\w+\s+")

COLUMNS = {"samples": "Warp Stall Sampling (All Samples)", "executed": "Instructions Executed",
           "excess": "L1 Wavefronts Shared Excessive", "wavefronts": "L1 Wavefronts Shared",
           "barrier": "stall_barrier"}


def read_table(path: str) -> list[dict]:
    """One dict per SASS instruction: ``address``, ``text`` and the `COLUMNS` as ints."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as handle:
        rows = list(csv.reader(handle))
    start = next(i for i, row in enumerate(rows) if row and row[0] == "Address")
    head = rows[start]
    index = {name: head.index(column) for name, column in COLUMNS.items()}
    table = []
    for row in rows[start + 1:]:
        if len(row) < len(head):
            continue
        entry = {"address": int(row[head.index("Address")], 16),
                 "text": row[head.index("Source")].strip()}
        for name, i in index.items():
            entry[name] = int(row[i].replace(",", "") or 0)
        table.append(entry)
    return table


def loops(table: list[dict]) -> list[tuple[int, int]]:
    """``(first, last)`` instruction indices of every backward branch's loop."""
    where = {entry["address"]: i for i, entry in enumerate(table)}
    found = []
    for i, entry in enumerate(table):
        match = _BRANCH.search(entry["text"])
        if match:
            target = int(match.group(1), 16)
            if target <= entry["address"] and target in where:
                found.append((where[target], i))
    return found


def opcode(text: str) -> str:
    """The opcode of one SASS line, without its predicate and modifiers."""
    return _PREDICATE.sub("", text).split()[0].split(".")[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=12, help="loops to list")
    args = parser.parse_args(argv)
    table = read_table(args.table)
    totals = {name: sum(entry[name] for entry in table) for name in COLUMNS}
    print(f"{len(table)} instructions; samples {totals['samples']}, executed "
          f"{totals['executed']}, shared wavefronts {totals['wavefronts']} (excess "
          f"{totals['excess']}), barrier-stall samples "
          f"{100 * totals['barrier'] / max(totals['samples'], 1):.1f}%")
    rows = []
    for first, last in loops(table):
        body = table[first:last + 1]
        sums = {name: sum(entry[name] for entry in body) for name in COLUMNS}
        ops = collections.Counter(opcode(entry["text"]) for entry in body)
        rows.append((sums["samples"], first, last, sums, ops))
    rows.sort(key=lambda row: -row[0])
    print("loop (SASS lines)   length  samples  executed  shared wf  excess wf  barrier  opcodes")
    for _, first, last, sums, ops in rows[:args.top]:
        share = {name: 100 * sums[name] / max(totals[name], 1) for name in ("samples", "executed")}
        top_ops = " ".join(f"{name}:{count}" for name, count in ops.most_common(6))
        print(f"[{first:5d}, {last:5d}]  {last - first + 1:8d}  {share['samples']:6.1f}%  "
              f"{share['executed']:7.1f}%  {sums['wavefronts']:9d}  {sums['excess']:9d}  "
              f"{sums['barrier']:7d}  {top_ops}")


if __name__ == "__main__":
    main()
