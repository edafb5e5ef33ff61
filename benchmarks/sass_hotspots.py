"""Where a kernel's warp samples fall, loop by loop of its SASS (from Nsight Compute).

Reads the per-instruction table of one profiled launch, as written by

    ncu --section SourceCounters ... -o report python3 target.py
    ncu -i report.ncu-rep --page source --csv --print-source sass > sass.csv

(optionally gzipped), and prints the kernel's totals, then the loops (the
instructions between a backward branch and its target) with the largest
share of warp-state samples: their share of samples and of executed
instructions, their shared-memory wavefronts and the excess ones (bank
conflicts), their most frequent stall reasons (the table's ``stall_*``
columns, as shares of the loop's samples) and their most frequent opcodes.
The samples say where warps spend their time, the instruction counts where
the issue slots go; a loop with many samples per instruction waits, and its
stall reasons say on what (``no_inst``: instruction fetch, ``short_sb``:
shared memory, ``long_sb``: global memory, ``wait``: a fixed-latency
dependency, ``barrier``). Loops nest, so shares of nested loops overlap.

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
           "excess": "L1 Wavefronts Shared Excessive", "wavefronts": "L1 Wavefronts Shared"}
#: Stall-reason columns: ``stall_<reason>`` (all samples; the "(Not Issued)" ones are skipped).
_STALL = re.compile(r"^stall_(\w+)$")


def _count(text: str) -> int:
    return int(text.replace(",", "") or 0)


def read_table(path: str) -> list[dict]:
    """One dict per SASS instruction: ``address``, ``text``, the `COLUMNS` as ints and
    ``stalls``, a Counter of the samples by stall reason (empty where the table has no
    ``stall_*`` columns)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as handle:
        rows = list(csv.reader(handle))
    start = next(i for i, row in enumerate(rows) if row and row[0] == "Address")
    head = rows[start]
    index = {name: head.index(column) for name, column in COLUMNS.items()}
    stalls = {match.group(1): i for i, column in enumerate(head)
              if (match := _STALL.match(column))}
    table = []
    for row in rows[start + 1:]:
        if len(row) < len(head):
            continue
        entry = {"address": int(row[head.index("Address")], 16),
                 "text": row[head.index("Source")].strip()}
        for name, i in index.items():
            entry[name] = _count(row[i])
        entry["stalls"] = collections.Counter(
            {reason: _count(row[i]) for reason, i in stalls.items()})
        table.append(entry)
    return table


def top_stalls(stalls: collections.Counter, count: int) -> str:
    """The ``count`` most frequent stall reasons, as shares of all the samples counted."""
    total = max(sum(stalls.values()), 1)
    return " ".join(f"{reason} {100 * n / total:.0f}%"
                    for reason, n in stalls.most_common(count) if n)


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
    stalls = sum((entry["stalls"] for entry in table), collections.Counter())
    print(f"{len(table)} instructions; samples {totals['samples']}, executed "
          f"{totals['executed']}, shared wavefronts {totals['wavefronts']} (excess "
          f"{totals['excess']}); stalls {top_stalls(stalls, 6) or 'not in the table'}")
    rows = []
    for first, last in loops(table):
        body = table[first:last + 1]
        sums = {name: sum(entry[name] for entry in body) for name in COLUMNS}
        reasons = sum((entry["stalls"] for entry in body), collections.Counter())
        ops = collections.Counter(opcode(entry["text"]) for entry in body)
        rows.append((sums["samples"], first, last, sums, reasons, ops))
    rows.sort(key=lambda row: -row[0])
    print("loop (SASS lines)   length  samples  executed  shared wf  excess wf  "
          "stalls | opcodes")
    for _, first, last, sums, reasons, ops in rows[:args.top]:
        share = {name: 100 * sums[name] / max(totals[name], 1) for name in ("samples", "executed")}
        top_ops = " ".join(f"{name}:{count}" for name, count in ops.most_common(6))
        print(f"[{first:5d}, {last:5d}]  {last - first + 1:8d}  {share['samples']:6.1f}%  "
              f"{share['executed']:7.1f}%  {sums['wavefronts']:9d}  {sums['excess']:9d}  "
              f"{top_stalls(reasons, 3)} | {top_ops}")


if __name__ == "__main__":
    main()
