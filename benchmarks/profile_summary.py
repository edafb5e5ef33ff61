"""Condense an ``ncu --csv --page details`` report to the lines that explain time.

Prints, per profiled kernel: duration, registers, shared memory, occupancy
(theoretical and achieved, and the block limits), issue statistics, and the
warp stall reasons in cycles per issued instruction, largest first.

    python benchmarks/profile_summary.py profile.csv TAG
"""

import csv
import sys

KEEP = ("Duration", "Registers Per Thread", "Dynamic Shared Memory Per Block", "Block Limit",
        "Theoretical Occupancy", "Achieved Occupancy", "Executed Ipc Active",
        "Issued Warp Per Scheduler", "No Eligible", "Active Warps Per Scheduler",
        "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction",
        "Compute (SM) Throughput", "Memory Throughput", "smsp__inst_executed.sum",
        "l1tex__data_bank_conflicts", "smsp__sass_inst_executed_op", "dram__bytes",
        "smsp__thread_inst_executed_per_inst_executed", "smsp__inst_executed_op_branch")
STALL = "smsp__average_warps_issue_stalled_"


def main(path: str, tag: str) -> None:
    rows = [r for r in csv.reader(open(path)) if len(r) > 5]
    if not rows:
        print(tag, "no rows in", path)
        return
    head, body = rows[0], rows[1:]
    ix = {n: head.index(n) for n in ("ID", "Kernel Name", "Metric Name", "Metric Unit",
                                     "Metric Value")}
    stalls: dict = {}
    for r in body:
        name, value = r[ix["Metric Name"]], r[ix["Metric Value"]]
        kid = f"{r[ix['ID']]}:{r[ix['Kernel Name']][:20]}"
        if name.startswith(STALL):
            try:
                v = float(value.replace(",", ""))
            except ValueError:
                continue
            stalls.setdefault(kid, []).append((v, name[len(STALL):]))
        elif name.startswith(KEEP):
            print(f"{tag} {kid} {name:42s} {value:>12s} {r[ix['Metric Unit']]}")
    for kid, items in stalls.items():
        for v, name in sorted(items, reverse=True):
            if v >= 0.05:
                print(f"{tag} {kid} stall {name:55s} {v:8.2f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
