"""Static checks of the generated kernel source (no simulator, no compiler)."""

import ast
import itertools
import re

import pytest

from wtconv_cuda.kernels.codegen import (
    FinalizeSpec, PlaneSpec, _compiled_level_table, _floor_div, _floor_mod,
    finalize_kernel_source, plane_kernel_source,
)
from wtconv_cuda.kernels.launch import Problem, Tuning, plan_plane
from wtconv_cuda.kernels.layout import LEVEL_BASE
from wtconv_cuda.kernels.tiles import (
    TileSpec, analysis_plan, item_row, output_strip, phase_stride, spec_geometry, tile_geometry,
    tile_kernel_source,
)

PLANE_SPECS = [
    PlaneSpec(k, storage, in_stride, out_stride, backward, scratch, threads, strip, 0, group,
              threads <= 32)
    for k, storage, (in_stride, out_stride), backward, scratch, (threads, strip, group)
    in itertools.product((1, 3, 5), ("float32", "bfloat16"), ((1, 1), (2, 1), (1, 2), (1, 3)),
                         (False, True), (False, True),
                         ((16, 1, 16), (32, 1, 8), (64, 2, 2), (128, 4, 1)))
] + [  # backwards that write the gradients themselves
    PlaneSpec(k, storage, 1, 1, True, scratch, threads, 1, 0, group, threads <= 32, True)
    for k, storage, scratch, (threads, group)
    in itertools.product((1, 5), ("float32", "bfloat16"), (False, True), ((16, 16), (128, 1)))
] + [  # weight gradients alone, with the plane's level table compiled in
    PlaneSpec(k, "float32", 1, 1, True, False, threads, strip, 0, group, threads <= 32,
              weights_only=True, plane=plane)
    for k, plane, (threads, strip, group)
    in itertools.product((1, 5), ((17, 23, 5), (3, 2, 4), (6, 7, 1)), ((32, 1, 8), (64, 2, 2)))
]


def bound_names(target: ast.AST) -> set[str]:
    """Names a target rebinds (``a``, ``a, b``), not those it only indexes (``S[a] = ...``)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(bound_names(t) for t in target.elts))
    return set()


def assigned_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)):
            targets = [node.target]
        for target in targets:
            names |= bound_names(target)
    return names


def test_the_check_sees_a_rebinding():
    tree = ast.parse("def f(a, b, S):\n    S[a] = 1\n    b += 1\n    for c, d in x:\n        pass")
    assert assigned_names(tree) == {"b", "c", "d"}


@pytest.mark.parametrize("spec", PLANE_SPECS, ids=repr)
def test_plane_kernel_never_assigns_its_parameters(spec):
    """Header fields and pointers are kernel parameters; a local of the same name would
    silently replace them (as a strip-row index once replaced the batch chunk)."""
    function = ast.parse(plane_kernel_source(spec)).body[0]
    parameters = {a.arg for a in function.args.args}
    assert not parameters & assigned_names(function)


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_finalize_kernel_never_assigns_its_parameters(k):
    function = ast.parse(finalize_kernel_source(FinalizeSpec(k, "float32", 128))).body[0]
    parameters = {a.arg for a in function.args.args}
    assert not parameters & assigned_names(function)


@pytest.mark.parametrize("threads,group,ok", [(32, 1, True), (16, 2, True), (8, 4, True),
                                              (16, 1, False), (64, 2, False), (24, 4, False)])
def test_warp_sync_needs_groups_that_tile_whole_warps(threads, group, ok):
    spec = PlaneSpec(3, "float32", threads=threads, strip=1, planes_per_block=group,
                     warp_sync=True)
    if ok:
        assert "cuda.syncwarp()" in plane_kernel_source(spec)
        assert "cuda.syncthreads()" not in plane_kernel_source(spec)
    else:
        with pytest.raises(ValueError, match="whole warps"):
            plane_kernel_source(spec)


def test_plane_is_a_weights_only_variant():
    with pytest.raises(ValueError, match="weights_only"):
        plane_kernel_source(PlaneSpec(3, "float32", backward=True, plane=(8, 8, 2)))


@pytest.mark.parametrize("shape,k,threads", [((64, 192, 28, 28, 4), 5, None),
                                             ((2, 3, 17, 23, 5), 3, 32),
                                             ((1, 2, 9, 6, 6), 7, 16),
                                             ((4, 5, 56, 56, 5), 5, None)])
def test_weights_only_variant_compiles_the_planners_level_table(shape, k, threads):
    """The planner gives every weights-only spec its plane; the table the kernel then
    compiles in is the one the launch passes (the header, filled in per call, aside), and
    the raw-LL chains and the level taps' phases no longer read it."""
    b, c, h, w, levels = shape
    launch = plan_plane(Problem(b, c, h, w, k, levels, 1, "float32", True), True, 227 * 1024,
                        264, Tuning(threads=threads, dx_forward=True))
    assert launch.spec.weights_only and launch.spec.plane == (h, w, levels)
    compiled = _compiled_level_table(launch.spec)
    assert (compiled[LEVEL_BASE:] == launch.geo[LEVEL_BASE:]).all()
    source = plane_kernel_source(launch.spec)
    runtime = plane_kernel_source(launch.spec._replace(plane=()))
    assert "for j in range(1, L)" in runtime and "for j in range(1, L)" not in source
    assert "while j0 <= L" in runtime and "while j0 <= L" not in source
    reads = re.findall(r"geo\[([^\]]*)\]", source)
    assert reads and all("j" in index for index in reads)  # only at a run-time level


def test_fused_finalize_is_a_backward_variant():
    with pytest.raises(ValueError, match="backward"):
        plane_kernel_source(PlaneSpec(3, "float32", fused_finalize=True))
    fused = plane_kernel_source(PlaneSpec(3, "float32", backward=True, fused_finalize=True))
    assert "gw0, gb0, gs0, gww, gws" in fused.splitlines()[0]
    assert "part[" not in fused  # no partials: the gradients are written directly


def test_warmup_compiles_both_finalize_choices_of_each_backward():
    """Whether a backward fuses the finalize depends on B, which warmup does not know."""
    from wtconv_cuda.kernels.warmup import variants

    specs = variants([5], ["float32"], [1], [(7, 7), (56, 56)], levels=[2])
    backward = [s for s in specs if isinstance(s, PlaneSpec) and s.backward]
    assert {s._replace(fused_finalize=False) for s in backward} == \
        {s._replace(fused_finalize=False) for s in backward if s.fused_finalize} == \
        {s for s in backward if not s.fused_finalize}


def test_warmup_lists_the_default_split_of_14x14_planes():
    """The 16-pixel-tile split needs more pixels than the other split rules; warmup plans
    with a problem large enough for it."""
    from wtconv_cuda.kernels.warmup import variants

    specs = variants([5], ["float32"], [1], [(14, 14)], levels=[3])
    assert any(isinstance(s, TileSpec) and s.tile == 16 and s.coarse and s.levels == 1
               for s in specs)


def test_warmup_lists_the_28x28_tile_with_and_without_its_planes():
    """The 28 x 28 split tile runs four planes a block where B is a multiple of four,
    else one: warmup lists both."""
    from wtconv_cuda.kernels.warmup import variants

    specs = variants([5], ["float32"], [1], [(28, 28)], levels=[4])
    planes = {s.planes for s in specs if isinstance(s, TileSpec) and s.coarse and s.tile == 32}
    assert planes == {1, 4}


def window_moves(source: str) -> list[str]:
    """Assignments of one window register to another: base taps' (``win_1 = win_3``) or
    level taps' (``xu2_0 = xu2_1``)."""
    return [ast.unparse(node) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
            and node.value.id.startswith(("win_", "xu"))]


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_tap_windows_turn_without_moves(k):
    """The base and level taps' windows rotate by renaming (their loops are unrolled): no
    register copies, in the plane kernel (both backward variants) and the tile kernel."""
    plane = plane_kernel_source(PlaneSpec(k, "float32", 1, 1, True, False, 32, 1, 0, 8, True))
    weights = plane_kernel_source(PlaneSpec(k, "float32", 1, 1, True, False, 32, 1, 0, 8, True,
                                            weights_only=True))
    compiled = plane_kernel_source(PlaneSpec(k, "float32", 1, 1, True, False, 32, 1, 0, 8, True,
                                             weights_only=True, plane=(17, 23, 3)))
    tile = tile_kernel_source(TileSpec(k, "float32", 2, 16, 32, 2, backward=True))
    for source in (plane, weights, compiled, tile):
        assert "win_0" in source and "xu0_0" in source
        assert window_moves(source) == []


def accumulations(source: str) -> list:
    """The right-hand sides of every ``acc... += ...`` statement, as AST nodes."""
    return [node.value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add)
            and isinstance(node.target, ast.Name) and node.target.id.startswith("acc")]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_each_correlation_product_is_added_on_its_own(k):
    """Base and level taps add one product per statement (one fused multiply-add each);
    adding a sum of two products took a multiply, a fused multiply-add and an add."""
    sources = [plane_kernel_source(PlaneSpec(k, "float32", 1, 1, True, False, 32, 1, 0, 8, True,
                                             weights_only=weights_only))
               for weights_only in (False, True)]
    sources.append(tile_kernel_source(TileSpec(k, "float32", 2, 16, 32, 2, backward=True)))
    for source in sources:
        added = accumulations(source)
        assert any(isinstance(v, ast.BinOp) and isinstance(v.op, ast.Mult) for v in added)
        assert all(isinstance(v, ast.BinOp) and isinstance(v.op, ast.Mult) for v in added), \
            [ast.unparse(v) for v in added if not isinstance(v.op, ast.Mult)]


TILE_SPECS = [TileSpec(k, storage, levels, tile, threads, strip, backward=backward)
              for k, storage, levels, (tile, threads, strip), backward
              in itertools.product((1, 3, 5), ("float32", "bfloat16"), (0, 1, 3),
                                   ((8, 32, 2), (64, 256, 4), (32, 64, 1)), (False, True))]


@pytest.mark.parametrize("spec", TILE_SPECS, ids=repr)
def test_tile_kernel_never_assigns_its_parameters(spec):
    function = ast.parse(tile_kernel_source(spec)).body[0]
    parameters = {a.arg for a in function.args.args}
    assert not parameters & assigned_names(function)


def test_tile_geometry_halos_and_layout():
    """H_i = 2P * 2**(L-1-i): LL band i is read 2P values around the tile by level i+1."""
    geo = tile_geometry(5, 3, 64)
    assert geo.halos == (16, 8, 4)
    assert geo.edges == (96, 48, 24)
    # phase planes of 48^2, 24^2 and 12^2 values, strides padded to 16 mod 32
    assert [geo.phase(i) for i in range(3)] == [2320, 592, 144]
    sizes = (4 * 2320, 4 * 592, 4 * 144)
    taps = 25 + 4 * 25 * 3 + 1
    assert geo.grids == (taps, taps + sizes[0], taps + sizes[0] + sizes[1])
    z1 = taps + sum(sizes)
    assert geo.z == (z1, z1 + 4 * 32 ** 2, z1 + 4 * 32 ** 2 + 4 * 16 ** 2)
    assert geo.floats == z1 + 4 * (32 ** 2 + 16 ** 2 + 8 ** 2)
    assert geo.read_amplification == (96 / 64) ** 2
    assert tile_geometry(3, 0, 8).halos == (2,)  # P = 1, rounded up to even
    assert tile_geometry(5, 1, 64).edges == (72,)
    # the backward adds x's grids after z, then the reduction area
    back = tile_geometry(5, 3, 64, backward=True, threads=128)
    assert back.xgrids == (geo.floats, geo.floats + sizes[0], geo.floats + sizes[0] + sizes[1])
    assert back.reduce == geo.floats + sum(sizes)
    # 25 chunks per tap column: base 5 * 25 * 5 + 25 sums, level 1 5 * 25 * 20
    assert back.floats == back.reduce + max(5 * 25 * 5 + 25, 5 * 25 * 20)


@pytest.mark.parametrize("edge", [2, 8, 24, 48, 68, 72, 80, 96, 128])
def test_phase_stride_holds_a_plane_and_spreads_banks(edge):
    stride = phase_stride(edge)
    assert (edge // 2) ** 2 <= stride < (edge // 2) ** 2 + 32
    assert stride % 32 == 16
    # a row of 32 consecutive columns (even ones in plane 0, odd ones in plane 1)
    banks = {((c & 1) * stride + (c >> 1)) % 32 for c in range(32)}
    assert len(banks) == 32


@pytest.mark.parametrize("k,levels,tile", [(3, 1, 3), (3, 3, 4), (3, 1, 0), (3, 2, 26),
                                           (3, 0, 7)])
def test_tile_edge_must_be_a_multiple_of_the_coarsest_coefficient(k, levels, tile):
    with pytest.raises(ValueError, match="multiple of 2"):
        tile_geometry(k, levels, tile)


def test_tile_fitted_to_a_convnext_plane():
    """A 56 x 56 plane split at level 2 takes one 56-pixel tile: 72- and 36-value grids."""
    geo = tile_geometry(5, 2, 56)
    assert geo.halos == (8, 4) and geo.edges == (72, 36)
    assert [geo.phase(i) for i in range(2)] == [1296, 336]
    assert geo.z == (geo.grids[1] + 4 * 336, geo.grids[1] + 4 * 336 + 4 * 28 ** 2)
    assert geo.floats == geo.z[1] + 4 * 14 ** 2


def test_tile_over_its_whole_plane_keeps_2p_on_every_grid():
    """The 28 x 28 stage's tile (32, split at 2): the LL bands are formed over the tile
    alone, so grid 0 keeps 2P = 4 values around it, not 8, and z_1 lies over grid 1
    (level 1 runs last). 12.1 KB a block instead of 17.4: 17 one-warp blocks per
    multiprocessor of 228 KB (1 KB each reserved), not 12."""
    plain = tile_geometry(5, 2, 32)
    whole = tile_geometry(5, 2, 32, whole_plane=True)
    assert plain.halos == (8, 4) and whole.halos == (4, 4)
    assert whole.edges == (40, 24) and whole.phase(0) == 400
    # its taps are ordered by tap column, each column on a 16-byte boundary: the base
    # taps' five columns 8 words apart, then the levels'
    assert plain.level_taps == 25 and whole.level_taps == 5 * 8
    assert whole.ntaps == 40 + 4 * 25 * 2 + 1
    assert whole.grids == (241, 241 + 4 * 400)
    assert whole.z == (whole.grids[1], whole.grids[1] + 4 * 16 ** 2)
    assert whole.floats == whole.z[1] + 4 * 8 ** 2
    assert [(228 * 1024) // (4 * g.floats + 1024) for g in (plain, whole)] == [12, 17]
    # three levels: z_1 over grids 1 and 2 and past them, z_2 and z_3 after it
    deep = tile_geometry(5, 3, 64, whole_plane=True)
    assert deep.z[0] == deep.grids[1] and deep.z[1] == deep.z[0] + 4 * 32 ** 2
    # the inner levels reuse grid L - 1 themselves: z_1 keeps its own place
    inner = tile_geometry(5, 2, 56, whole_plane=True, inner_levels=3)
    assert inner.halos == (4, 4) and inner.z[0] == inner.grids[1] + 4 * inner.phase(1)
    # at most one level: the same geometry either way; K = 1: the same (zero) halos
    for args in ((5, 1, 16), (3, 0, 8)):
        assert tile_geometry(*args, whole_plane=True) == tile_geometry(*args)
    assert tile_geometry(1, 3, 8, whole_plane=True).halos == (0, 0, 0)
    with pytest.raises(ValueError, match="forward"):
        tile_geometry(5, 2, 32, backward=True, whole_plane=True)
    spec = TileSpec(5, "float32", 2, 32, 32, 4, height=28, width=28)
    assert spec_geometry(spec) == whole
    assert spec_geometry(spec._replace(height=0, width=0)) == plain


@pytest.mark.parametrize("n,row", [(1, 1), (16, 16), (32, 32), (64, 64), (3, 4), (7, 8),
                                   (14, 16), (28, 32), (56, 64), (100, 128)])
def test_item_rows_pad_to_whole_warps_or_powers_of_two(n, row):
    assert item_row(n) == row


def test_fitted_tiles_take_strips_that_divide_their_rows():
    """Power-of-two edges keep their plans; a 28-coefficient level takes 7-row strips
    (4 strip rows of 32 padded items: one round of 128 threads)."""
    assert [analysis_plan(5, n, 128, 8) for n in (32, 16, 8, 4)] == [8, 2, 0, 0]
    assert analysis_plan(5, 28, 128, 8) == 7
    assert analysis_plan(5, 14, 32, 8) == 7


def test_tile_source_skips_the_padding_items():
    source = tile_kernel_source(TileSpec(5, "float32", 2, 56, 128, 7, 128, 8, False, True))
    assert "qx = ((it) & 31)" in source and "if qx >= 28:" in source  # level 1 and the output
    # level 2: 14 items in rows of 16, a warp's two rows 4 strip rows apart (7 strip
    # rows in 8 item rows: one idle)
    assert "if qx >= 14 or qy0 >= 14:" in source
    pow2 = tile_kernel_source(TileSpec(5, "float32", 2, 64, 128, 4, 128, 8, False, True))
    assert "if qx >=" not in pow2


@pytest.mark.parametrize("tile,threads,most,strip", [
    (64, 128, 7, 4),    # 8 rows of 32 items: two rounds whichever divisor up to 7
    (56, 128, 7, 7),    # 4 rows of 28 items padded to 32: one round (4: two)
    (56, 128, 4, 4),
    (32, 32, 7, 4),     # 4 rows of 16: two rounds (2: four)
    (32, 64, 7, 4),     # one round; 8 would idle half the threads
    (16, 32, 7, 2),     # one round of 32 items (4: one round of 16)
    (28, 64, 7, 7), (14, 32, 7, 7), (14, 32, 4, 1), (16, 32, 2, 2), (2, 32, 4, 1),
])
def test_output_strip_takes_the_fewest_rounds(tile, threads, most, strip):
    assert output_strip(tile, threads, most) == strip


def test_tile_kernel_rejects_bad_shapes():
    with pytest.raises(ValueError, match="strip"):
        tile_kernel_source(TileSpec(3, "float32", 1, 8, 32, 3))
    with pytest.raises(ValueError, match="threads"):
        tile_kernel_source(TileSpec(3, "float32", 1, 8, 48, 2))
    with pytest.raises(ValueError, match="odd"):
        tile_kernel_source(TileSpec(4, "float32", 1, 8, 32, 2))


def test_tile_analysis_plan_picks_strips_for_fine_levels_singles_for_coarse():
    # 64-pixel tiles, 256 threads, K = 5: 32x32 level-1 coefficients in one round of
    # 4-row strips; 16x16 in 1-row strips; 8x8 and 4x4 as single items.
    assert [analysis_plan(5, 64 >> j, 256) for j in (1, 2, 3, 4)] == [4, 1, 0, 0]


@pytest.mark.parametrize("divisor", [1, 2, 3, 7, 8, 16, 24, 64])
def test_floor_div_and_mod_stand_in_any_expression(divisor):
    """The emitted ``//`` and ``%`` (a shift and a mask for powers of two) give Python's
    floor results for every sign, inside larger expressions too: ``slot - slot % 16``
    once became ``slot - (slot) & 15``, which Python (and numba) read as ``(slot -
    slot) & 15``, and the backward tiles of 8 x 32 x 128 x 128 lost their dx."""
    for a in range(-70, 70):
        for b in (-5, 0, 3):
            scope = {"a": a, "b": b}
            assert eval(f"a - {_floor_mod('a', divisor)}", scope) == a - a % divisor
            assert eval(f"b * {_floor_mod('a - b', divisor)} * 2", scope) == (
                b * ((a - b) % divisor) * 2)
            assert eval(f"b - {_floor_div('a - b', divisor)} * 3", scope) == (
                b - (a - b) // divisor * 3)
            assert eval(f"-{_floor_div('a', divisor)} ** 1", scope) == -(a // divisor)


def _guarded_loads(source: str) -> list[str]:
    """The lines binding a name to a conditional expression that indexes a kernel
    argument (a lower-case array; ``S`` is the shared buffer)."""
    return [line.strip() for line in source.splitlines()
            if re.match(r"\s*\w+ = .*\b[a-z]\w*\[.* if .* else ", line)]


@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
def test_guarded_16_bit_loads_leave_the_conversion_to_their_use(storage):
    """A 16-bit element is loaded as stored under its guard and converted where it is
    used: a conversion inside the guard sat in the load's if-converted block, and ptxas
    then waited for every load in turn (the paper grid's 16-bit forward took 454
    against 338 us with it on an H100). Covers the tiles' row-pair and plane loads,
    the plane kernel's loads (quads and single pixels), the coarse pre-pass and the
    lane kernel's staging."""
    from wtconv_cuda.kernels.coarse import CoarseSpec, coarse_in_source
    from wtconv_cuda.kernels.lanes import LaneSpec, lane_kernel_source

    tile = TileSpec(5, storage, 3, 64, 128, 4)
    sources = {
        "tile row pairs": tile_kernel_source(tile),
        "tile row pairs, backward": tile_kernel_source(tile._replace(backward=True,
                                                                     threads=256)),
        "tile plane": tile_kernel_source(TileSpec(5, storage, 2, 56, 128, 7, height=56,
                                                  width=56)),
        "plane": plane_kernel_source(PlaneSpec(5, storage, 1, 1, False, False, 128, 4)),
        "plane, strided": plane_kernel_source(PlaneSpec(5, storage, 2, 1, False, False,
                                                        128, 4)),
        "coarse": coarse_in_source(CoarseSpec(storage, 2, height=32, width=32)),
        "lanes": lane_kernel_source(LaneSpec(5, storage, 13, 11, 2, 2)),
    }
    for name, source in sources.items():
        loads = _guarded_loads(source)
        assert loads, name
        converted = [line for line in loads if "float32(" in line or "int_as_float" in line]
        assert not converted, (name, converted[:3])
