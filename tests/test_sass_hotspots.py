"""CPU tests of ``benchmarks/sass_hotspots.py`` on a small hand-written ncu source table."""

import csv
import gzip
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sass_hotspots  # noqa: E402

HEAD = ["Address", "Source", *sass_hotspots.COLUMNS.values(), "stall_barrier", "stall_no_inst",
        "stall_short_sb", "stall_barrier (Not Issued)", "Divergent Branches"]

#: (address, source, samples, executed, excess, wavefronts, then the samples by stall
#: reason: barrier, no_inst, short_sb, and barrier not issued): a prologue, an outer loop
#: (0x20..0x60) around an inner one (0x30..0x50), a forward branch.
ROWS = [
    (0x00, "S2R R0, SR_TID.X", 5, 100, 0, 0, 0, 5, 0, 0),
    (0x10, "@P0 BRA `(0x70)", 1, 100, 0, 0, 0, 1, 0, 0),
    (0x20, "LDS R1, [R0]", 10, 400, 40, 80, 0, 2, 8, 0),
    (0x30, "FFMA R2, R1, R1, R2", 20, 1600, 0, 0, 0, 5, 15, 0),
    (0x40, "LDS.128 R4, [R0+0x10]", 30, 1600, 0, 160, 0, 27, 3, 0),
    (0x50, "@!P1 BRA `(0x30)", 2, 1600, 0, 0, 0, 2, 0, 0),
    (0x60, "BAR.SYNC.DEFER_BLOCKING 0x0", 12, 400, 0, 0, 12, 0, 0, 12),
    (0x70, "@P2 BRA 0x20", 0, 400, 0, 0, 0, 0, 0, 0),
    (0x80, "EXIT", 1, 100, 0, 0, 0, 1, 0, 0),
]


def write_table(path, gzipped):
    opener = gzip.open if gzipped else open
    with opener(path, "wt", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Kernel Name", "wtconv_plane(...)"])
        writer.writerow(HEAD)
        for address, source, *values in ROWS:
            writer.writerow([hex(address), f"      {source}",
                             *(f"{v:,}" for v in values), "0"])


def test_reads_the_table_and_finds_nested_loops(tmp_path):
    path = tmp_path / "sass.csv.gz"
    write_table(path, gzipped=True)
    table = sass_hotspots.read_table(str(path))
    assert [entry["samples"] for entry in table] == [row[2] for row in ROWS]
    assert table[4]["text"] == "LDS.128 R4, [R0+0x10]" and table[2]["excess"] == 40
    # the stall columns by reason; "(Not Issued)" ones are not read
    assert table[6]["stalls"] == {"barrier": 12, "no_inst": 0, "short_sb": 0}
    assert table[4]["stalls"]["no_inst"] == 27
    # the inner loop (lines 3-5) and the outer one (lines 2-7); the forward branch is none
    assert sorted(sass_hotspots.loops(table)) == [(2, 7), (3, 5)]
    assert sass_hotspots.opcode("@!P1 BRA `(0x30)") == "BRA"
    assert sass_hotspots.opcode("LDS.128 R4, [R0+0x10]") == "LDS"


def test_prints_loops_by_their_share_of_samples(tmp_path, capsys):
    path = tmp_path / "sass.csv"
    write_table(path, gzipped=False)
    sass_hotspots.main([str(path), "--top", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("9 instructions; samples 81, executed 6300")
    # 43 no_inst, 26 short_sb, 12 barrier of 81
    assert lines[0].endswith("stalls no_inst 53% short_sb 32% barrier 15%")
    outer, inner = lines[2], lines[3]
    assert outer.startswith("[    2,     7]") and " 91.4% " in outer
    assert inner.startswith("[    3,     5]") and " 64.2% " in inner and "LDS:1" in inner
    # the inner loop's 52 samples: 34 no_inst, 18 short_sb (no barrier there)
    assert "no_inst 65% short_sb 35% |" in inner and "barrier" not in inner
