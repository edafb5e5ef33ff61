"""Host side of the fused kernels: plan a launch and issue it on a backend.

A *backend* supplies compiled kernels, small device tables and float32
buffers. Two exist: :class:`CupyBackend` (real GPU, raw-pointer launches) and
:class:`SimulatorBackend` (numba's CUDA simulator on NumPy arrays, for CI).
Everything else (the buffer layout, which kernel variant, grid sizes, the
order of launches) is shared, so the simulator tests exercise the exact
launch logic the GPU runs.

Arrays passed to :func:`run_forward` / :func:`run_backward` must be
C-contiguous and already in the storage dtype; validation is the caller's job.
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import product
from typing import Callable, NamedTuple

import numpy as np

from . import compiler
from .coarse import (
    COARSE_THREADS, CoarseLayout, CoarseOutSpec, CoarseSpec, PartialSumSpec, coarse_layout,
)
from .codegen import FinalizeSpec, PlaneSpec
from .flip import FLIP_THREADS, FlipSpec
from .lanes import THREADS as LANE_THREADS, LaneForwardSpec, LaneSpec
from .lanes import planes_per_block as lane_planes
from .lanes import planes_per_partial as lane_partial_planes
from .lanes import shared_bytes as lane_shared_bytes
from .registers import MAX_PIXELS as REGISTER_MAX_PIXELS, RegisterSpec
from .registers import shared_bytes as register_shared_bytes
from .tiles import TileSpec, output_strip, shared_floats, spec_geometry, tile_geometry
from .driver import driver_launch
from .weight_blocks import blocked_plan
from .layout import HEADER_FIELDS, plane_layout, with_problem

MAX_THREADS = 256  # per block; a block holds several planes when they are small
#: Default ``.maxnreg``: two 256-thread blocks per multiprocessor. Left free,
#: the driver's ptxas gave one variant 191 registers (half the occupancy).
REGISTER_CAP = 128
FINALIZE_THREADS = 128


class Problem(NamedTuple):
    """Sizes and options of one layer call (forward or backward).

    Attributes
    ----------
    batch, channels, height, width : int
        ``B, C, H, W`` of the input ``x``.
    kernel_size : int
        Odd ``K`` of every convolution.
    levels : int
        Wavelet levels ``L >= 0``.
    stride : int
        Output subsampling factor.
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"``: dtype of the data and
        parameter arrays (the work buffers are float32).
    has_bias : bool
        Whether the layer has a base bias.
    """

    batch: int
    channels: int
    height: int
    width: int
    kernel_size: int
    levels: int
    stride: int
    storage: str
    has_bias: bool


class Weights(NamedTuple):
    """Backend arrays of the five parameters; ``base_bias`` may be a dummy.

    All arrays are C-contiguous, in the storage dtype, on the backend (CuPy
    arrays on the GPU, NumPy arrays in the simulator). As a gradient output,
    each is written in the same shape.

    Attributes
    ----------
    base_weight : array, shape (C, K, K)
        Depthwise base-convolution taps.
    base_bias : array, shape (C,)
        Base bias. Without a bias (``Problem.has_bias`` false) any array of
        the storage dtype (e.g. ``base_scale``): it is neither read nor
        written.
    base_scale : array, shape (C,)
        Per-channel scale of the base branch.
    wavelet_weight : array, shape (L, C, 4, K, K)
        Depthwise taps of every level's four subbands.
    wavelet_scale : array, shape (L, C, 4)
        Per-subband scale of every level.
    """

    base_weight: object
    base_bias: object
    base_scale: object
    wavelet_weight: object
    wavelet_scale: object


class Tuning(NamedTuple):
    """Launch-shape overrides (``None`` picks the default).

    Attributes
    ----------
    threads : int or None
        Threads per plane (one thread group of a block).
    strip : int or None
        Coefficient rows per thread (``Q``).
    max_registers : int or None
        Register cap handed to ptxas; 0 leaves it free.
    planes_per_block : int or None
        Planes a block runs side by side. The default is ``256 // threads``
        planes of 32 threads or fewer (16 of 16, 8 of 32), else
        ``128 // threads`` (at least 1); with shared memory it is halved
        until the planes' buffers fit.
    warp_sync : bool or None
        Planes of one warp or less, synchronised with ``syncwarp`` (see
        :class:`~wtconv_cuda.kernels.codegen.PlaneSpec`). The default is on
        exactly when ``threads`` divides 32 and the block's planes fill whole
        warps.
    batch_chunk : int or None
        Backward: batch entries per work unit (default :func:`batch_chunk`;
        clipped to ``B``; 1 for the global-scratch variant).
    fuse_finalize : bool or None
        Backward: let a block that holds all of its channels' work units
        write their gradients itself (``PlaneSpec.fused_finalize``; one launch,
        no partials). The default (None or True) fuses whenever the plan
        allows it; False always writes partials and runs ``wtconv_finalize``.
    tiles : bool or None
        Run the tiled kernel (:mod:`wtconv_cuda.kernels.tiles`) instead of
        the plane kernel. None lets :func:`plan_tiles` decide (both passes
        on large planes, stride 1, a small enough halo); True takes
        the tiles, in both passes, whenever they can run the problem (stride
        1, the buffer in shared memory), however large the halo; False
        never. With tiles, ``threads``, ``strip`` and ``max_registers`` set
        the tile kernel's (defaults `TILE_THREADS`, 4 and `REGISTER_CAP`).
    tile : int or None
        Tile edge (a power of two; default `TILE_EDGE`).
    split : int or None
        Levels the tiles run when the levels above them go to a coarse
        pre-pass (:mod:`wtconv_cuda.kernels.coarse`, :func:`plan_split`).
        None lets the planner decide; ``c`` with ``1 <= c < L`` splits there
        whenever the tiles can run ``c`` levels (as with ``tiles`` True);
        any other value never splits.
    registers : bool or None
        Run a pass on the register kernel (:mod:`wtconv_cuda.kernels.registers`,
        one thread per plane). None lets :func:`plan_registers` decide
        (planes of at most `REGISTER_MAX_PIXELS` pixels, when no other
        field of the plane kernel's launch shape is set); True takes it for
        planes up to `REGISTER_FORCE_MAX_PIXELS`; False never. With it,
        ``threads`` and ``max_registers`` set its block size and register cap
        (defaults `REGISTER_THREADS`, `REGISTER_KERNEL_CAP`).
    dx_forward : bool or None
        Backward on the plane kernel at stride 1: compute ``dx`` with the
        forward kernels (on ``dy``, flipped filters, no bias; see
        :mod:`wtconv_cuda.kernels.flip`) and run the plane kernel for the
        weight gradients alone (``PlaneSpec.weights_only``). True always
        does so, False never (``dx`` in the plane kernel too: one pass over
        ``dy`` instead of two), None where :func:`dx_from_forward` finds it
        pays and fits.
    dx_batch : int or None
        With ``dx`` from the forward kernels: batch entries per chunk of the
        forward (clipped to ``B``). None lets :func:`dx_forward_plan` choose.
    inner : bool or None
        A forward that would split with one tile per plane runs the levels
        above the split inside the tile's block instead
        (``TileSpec.inner_levels``: one launch, no coarse pre-pass, no work
        buffers; see :func:`inner_tiles`). None does so where the
        small-plane rule says (``SmallTileSplit.inner``: planes of 9 to 16
        pixels below ``inner_max_pixels``, and of 33 to 64) and the block's
        buffer fits; True also above the rule's ``inner_max_pixels``; False
        never.
    lanes : int or None
        Backward where ``dx`` comes from the forward kernels
        (:func:`dx_from_forward`): compute the weight gradients on the lane
        kernel (:mod:`wtconv_cuda.kernels.lanes`) with this many threads per
        plane (1 or 2) instead of the ``weights_only`` plane kernel, where
        ``B`` is a multiple of the block's planes and the block fits. None
        follows :func:`plan_lanes`'s default rule; 0 never.
    lanes_forward : int or None
        A stride-1 forward (the ``dx`` forward's chunks plan with their own
        tuning, so only the default rule reaches them) on the lane kernel's
        forward with this many threads per plane (1, 2 or 4), where ``B`` is a
        multiple of the block's planes and the block fits; None follows
        :func:`plan_lanes_forward`'s default rule; 0 never.
    lane_groups : int or None
        The lane kernel's weight gradients with this many groups of planes a
        block (``LaneSpec.groups``: that many times fewer partials), where
        ``B`` is a multiple of the block's planes times it. None: the
        default rule's count (:func:`plan_lanes`).
    tile_planes : int or None
        A forward on tiles over their whole plane without inner levels (the
        28 x 28 stage's split) runs this many planes of one channel a block
        (``TileSpec.planes``), where ``B`` is a multiple of it and the block's
        buffer fits; None: the plane's `SPLIT_SMALL_TILES` rule (four at 28 x 28),
        else `TILE_PLANES` (1).
    blocked_weights : bool or None
        A ``weights_only`` plane backward correlates on register blocks
        (``PlaneSpec.blocked``, :mod:`wtconv_cuda.kernels.weight_blocks`)
        where its plan exists for the plane; None: `BLOCKED_WEIGHTS`.
    split_batch : int or None
        Backward of a split pass (:func:`plan_split`): batch entries per
        chunk of its coarse pre-pass, coarse problem and tiles (clipped to
        ``B``; the last chunk takes the rest). None lets
        :func:`split_batch_chunks` choose.
    """

    threads: int | None = None
    strip: int | None = None
    max_registers: int | None = None
    planes_per_block: int | None = None
    warp_sync: bool | None = None
    batch_chunk: int | None = None
    fuse_finalize: bool | None = None
    tiles: bool | None = None
    tile: int | None = None
    split: int | None = None
    registers: bool | None = None
    dx_forward: bool | None = None
    dx_batch: int | None = None
    inner: bool | None = None
    lanes: int | None = None
    lanes_forward: int | None = None
    lane_groups: int | None = None
    tile_planes: int | None = None
    blocked_weights: bool | None = None
    split_batch: int | None = None


#: Whether a ``weights_only`` plane backward takes the register-blocked correlations
#: (``PlaneSpec.blocked``) where ``Tuning.blocked_weights`` is None. Off until timed
#: (``scripts/device_check.sh blockedw``).
BLOCKED_WEIGHTS = False


#: Bytes per element of each storage dtype.
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
#: The array dtype of each storage type (bfloat16 travels as raw bits).
_VIEW_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def storage_words(count: int, storage: str) -> int:
    """float32 words that hold ``count`` elements of ``storage`` type (rounded up).

    Parameters
    ----------
    count : int
        Elements.
    storage : str
        ``"float32"``, ``"float16"`` or ``"bfloat16"``.

    Returns
    -------
    int
    """
    return -(-count * ITEMSIZE[storage] // 4)


def _x_bytes(problem: Problem) -> int:
    """Bytes of the call's ``x``: the unit of the planner's work-buffer budgets."""
    return (problem.batch * problem.channels * problem.height * problem.width
            * ITEMSIZE[problem.storage])


#: The backward's weight-gradient partials aim at no more than this fraction
#: of the bytes of ``x`` (see :func:`batch_chunk`).
PARTIAL_FRACTION = 1 / 8
#: Fewest elements of ``x`` for which a stride-1 plane backward computes ``dx``
#: with the forward kernels by default (:func:`dx_from_forward`). Below it the
#: extra launches cost more host time than they save: on an H200 a (1, 8, 16,
#: 16) CuPy training step went from 101-161 us to 235-277 us with them.
DX_FORWARD_MIN_ELEMENTS = 1 << 20
#: Most float32 work-buffer bytes, as a fraction of the bytes of ``x``, that
#: the forward computing a backward's ``dx`` may take by default. They are
#: live where the backward's partials (at most about 1/8) would otherwise set
#: the peak, or beside them within the same bound (`TWO_STREAMS`), so a
#: training step's peak stays within about ``2 1/6`` times the bytes of ``x``
#: above the inputs, against depthwise 7x7's 2 (``y``, ``dx``).
DX_FORWARD_BUFFER_FRACTION = 1 / 6
#: Whether a plane backward whose ``dx`` comes from the forward kernels issues
#: its two independent parts, ``dx`` (``wtconv_flip`` and the forward on
#: ``dy``) and the weight gradients (the ``weights_only`` plane kernel or the
#: lane kernel, then ``wtconv_finalize``), to overlap on two streams where the
#: backend can (a recorded program, :mod:`wtconv_cuda.kernels.program`: the
#: ``dx`` part on a side stream). Both parts' work buffers are then live at once,
#: so they do only where those fit in `SIDE_BY_SIDE_BUFFER_FRACTION` of ``x``'s
#: bytes together, if need be with ``dx`` in more batch chunks
#: (:func:`runs_side_by_side`, :func:`backward_dx_plan`). On an H100 it took the CuPy
#: training step of the ConvNeXt-T stages 56 / 28 / 14, fp32, from 0.701 /
#: 0.444 / 0.153 ms to 0.680 / 0.422 / 0.136 ms, back to back
#: (``benchmarks/lanes_ab.py``, settings ``default`` and ``onestream``).
TWO_STREAMS = True
#: Most work-buffer bytes, as a fraction of the bytes of ``x``, that a backward
#: running its ``dx`` part beside the weight gradients (`TWO_STREAMS`) holds at
#: once: the flipped filters, the largest ``dx`` chunk's forward buffers and the
#: weight partials. Tighter than `DX_FORWARD_BUFFER_FRACTION`: PyTorch's training
#: step peaks above the buffers' sum (its allocator hands out whole cached blocks).
#: At 1/6 an H100's 28 x 28 bf16 step (``dx`` in two chunks, buffers 0.148 of
#: ``x``) peaked at 1.1007 times depthwise 7x7's, 0.053 of ``x`` above its
#: buffers (``results/h100-2026-12-06c/``). At 1/7 the 56 and 14 x 14 stages
#: fork as before, 28 x 28 fp32 with ``dx`` in two chunks (0.307 ms against 0.310
#: with one, peak 1.064 against 1.080), and 28 x 28 in 16 bits not at all.
SIDE_BY_SIDE_BUFFER_FRACTION = 1 / 7
#: Most batch chunks, as a multiple of the planner's, in which a backward's
#: ``dx`` may run so that it fits beside the weight gradients
#: (:func:`backward_dx_plan`). Four chunks lost at 28 x 28 bf16: 0.369 ms side
#: by side against 0.343 for one chunk on one stream (``streams_bench.py``).
SIDE_BY_SIDE_MAX_CHUNK_FACTOR = 2
#: Most batch chunks the forward computing a backward's ``dx`` runs in, so
#: that its work buffers (per chunk, released in between) fit in
#: `DX_FORWARD_BUFFER_FRACTION`: each chunk issues the forward's launches
#: again (three to five for a split forward, ~7 us of host time each).
DX_FORWARD_MAX_CHUNKS = 8


def batch_chunk(problem: Problem, ntaps: int, group: int, max_slots: int) -> int:
    """Batch entries per backward work unit: small partials, enough blocks.

    Each unit's ``ntaps`` float32 sums go into a partial shared by
    :func:`units_per_partial` units, so the partials take ``B * C * ntaps *
    4 / (rb * M)`` bytes (4.6x the bytes of ``x`` at 64x768x7x7, L2, K5,
    fp32, for ``rb = M = 1``). Larger units also mean fewer, longer blocks.
    The choice doubles ``rb`` from 1 while the partials exceed
    `PARTIAL_FRACTION` of the bytes of ``x``, a channel still has more than
    one partial, and the doubled grid still has at least ``max_slots`` (two
    per SM) blocks.

    Parameters
    ----------
    problem : Problem
        The layer call.
    ntaps : int
        Weight-gradient entries per unit.
    group : int
        Thread groups (units in flight) per block.
    max_slots : int
        The backend's persistent-slot count (twice the SM count on a GPU).

    Returns
    -------
    int
        ``rb`` in ``1 .. B``, a power of two unless clipped to ``B``.
    """
    b, c = problem.batch, problem.channels
    x_bytes = _x_bytes(problem)
    rb = 1
    while rb < b:
        nchunks = -(-b // rb)
        per_channel = nchunks // units_per_partial(group, nchunks)
        if per_channel == 1 or c * per_channel * ntaps * 4 <= PARTIAL_FRACTION * x_bytes:
            break
        if -(-(c * -(-b // (2 * rb))) // group) < max_slots:
            break
        rb *= 2
    return min(rb, b)


def units_per_partial(group: int, nchunks: int) -> int:
    """Work units a backward block adds into one weight-gradient partial.

    A block's ``group`` units are consecutive and start at a multiple of
    ``group``; a channel has ``nchunks`` consecutive units. Runs of
    ``gcd(group, nchunks)`` units therefore never straddle two channels. The
    kernel computes the same value (``upart`` in
    :func:`wtconv_cuda.kernels.codegen.plane_kernel_source`).

    Parameters
    ----------
    group : int
        Thread groups (units in flight) per block.
    nchunks : int
        Units per channel, ``ceil(B / rb)``.

    Returns
    -------
    int
        ``M >= 1``, dividing both.
    """
    return math.gcd(group, nchunks)


#: Level-1 grid cells (``ceil(H/2) * ceil(W/2)``) up to which a pass runs two
#: 16-thread planes per warp. Forward: 14x14 planes (49 cells) and smaller;
#: backward: 7x7 (16 cells) and smaller, because 16-thread groups mean more,
#: smaller weight-gradient units (see :func:`batch_chunk`): at 14x14 that
#: doubled the partials for a 3% gain (``benchmarks/NOTES.md``).
SUBWARP_CELLS = {False: 64, True: 16}


def default_tuning(problem: Problem, backward: bool) -> Tuning:
    """Launch shape measured best on an H200 for the plane's size.

    ``benchmarks/tune.py`` sweeps these at the ConvNeXt-T stage shapes
    (56, 28, 14 and 7 pixels): large planes want 128 threads per plane and
    4 coefficient rows per thread, one plane per block; small ones 32
    threads (one warp per plane, see ``warp_sync``), fewer rows and several
    planes per block, and the smallest 16 threads, two planes per warp
    (`SUBWARP_CELLS`; H200, bf16: forward 0.197 -> 0.143 ms at
    64x384x14x14, L3, and 0.244 -> 0.136 ms at 64x768x7x7, L2, backward
    0.501 -> 0.314 ms at 7x7). Registers are capped at `REGISTER_CAP`; a
    64-register cap spills 250+ bytes to local memory.

    Parameters
    ----------
    problem : Problem
        Only ``height`` and ``width`` are used.
    backward : bool
        The pass being planned.

    Returns
    -------
    Tuning
        ``threads`` and ``strip`` from the level-1 grid size, ``max_registers``
        `REGISTER_CAP`; ``planes_per_block`` 16, 8, 2 and 1 for 16, 32, 64
        and 128 threads (:func:`plan_plane` halves it until the planes fit);
        ``warp_sync`` ``None`` (on for 16 and 32 threads).
    """
    h1, w1 = -(-problem.height // 2), -(-problem.width // 2)
    strip = 4 if h1 >= 16 else (2 if h1 >= 6 else 1)
    area = h1 * w1
    threads = 128 if area >= 512 else (64 if area >= 128 else 32)
    if area <= SUBWARP_CELLS[bool(backward)]:
        threads = 16
    return Tuning(threads, strip, REGISTER_CAP, _default_group(threads))


def _default_group(threads: int) -> int:
    """Planes per block before the shared-memory fit.

    Planes that share a block also share its barriers, so a block holds at most
    128 threads of planes that synchronise with block barriers: one plane of 128
    threads (0.39 against 0.43 ms forward at 64x96x56x56, L5, H200), two of 64
    (0.28 against 0.31 ms at 64x192x28x28, L4). Warp-synchronous planes (32
    threads or a divisor of it) wait only for their warp: ``MAX_THREADS //
    threads`` of them.
    """
    if _tiles_warps(threads):
        return MAX_THREADS // threads
    return max(1, 128 // threads)


def _tiles_warps(threads: int) -> bool:
    """Whether groups of ``threads`` tile warps (and so may use ``syncwarp``)."""
    return threads <= 32 and 32 % threads == 0


class Launch(NamedTuple):
    """Everything needed to issue one ``wtconv_plane`` launch.

    Attributes
    ----------
    spec : PlaneSpec
        The kernel variant.
    grid : int
        Blocks in the (one-dimensional) grid.
    block : int
        Threads per block: ``spec.threads * spec.planes_per_block``.
    shared_bytes : int
        Dynamic shared memory per block (0 for a scratch variant).
    scratch_floats : int
        float32 elements of global scratch (0 for a shared-memory variant).
    geo : numpy.ndarray, int64
        The layout table with the problem header filled in; read-only (the
        plan is cached).
    ntaps : int
        Weight-gradient entries per plane (see
        :class:`wtconv_cuda.kernels.layout.PlaneLayout`).
    header : tuple of numpy.int64
        The header of ``geo`` (``HEADER_FIELDS``), passed again as scalar
        kernel arguments.
    batch_chunk : int
        Backward: batch entries per work unit (``rb``, see
        :func:`batch_chunk`); 1 forward.
    units : int
        Backward: work units, ``C * ceil(B / batch_chunk)``; 0 forward.
    units_per_partial : int
        Backward: units whose sums make one ``ntaps``-float weight-gradient
        partial (:func:`units_per_partial`); 1 forward. With
        ``spec.fused_finalize`` these are all of a channel's units, and
        they make its gradients instead.
    finalize_dims : numpy.ndarray or None
        Backward without ``spec.fused_finalize``: the finalize kernel's
        read-only ``dims`` table ``(B, C, L, has_bias, partials per
        channel)``; None otherwise.
    """

    spec: PlaneSpec
    grid: int
    block: int
    shared_bytes: int
    scratch_floats: int
    geo: np.ndarray
    ntaps: int
    header: tuple = ()
    batch_chunk: int = 1
    units: int = 0
    units_per_partial: int = 1
    finalize_dims: np.ndarray | None = None

    @property
    def partial_floats(self) -> int:
        """float32 elements of the backward's weight-gradient partials (0 when fused)."""
        if self.spec.fused_finalize:
            return 0
        return self.units // self.units_per_partial * self.ntaps


#: ``.maxnreg`` of the ``weights_only`` plane backward from ``K`` 9 up (where
#: ``Tuning.max_registers`` is unset). At `REGISTER_CAP` these kernels used 40-64 B of
#: local memory a thread at the ConvNeXt-T stages (fp32 and bf16); at 168, none. Fewer
#: blocks fit an SM by registers (three 128-thread blocks instead of four at 56 x 56), yet
#: on an H100 the whole backward (dx from the forward included) took less, with the same
#: bits, over two rounds: 1.035 against 1.068 ms at 64 x 96 x 56 x 56 (L 5) and 0.828
#: against 0.840 ms at 64 x 192 x 28 x 28 (L 4) in fp32; bf16 1.226 / 1.256 and 0.840 /
#: 0.848 ms, and 0.454 / 0.464 ms at 64 x 384 x 14 x 14 (L 3; fp32 runs the lane kernel
#: there). The split backward's coarse problem (its 64 x 64 planes at 8 x 64 x 256 x 256)
#: takes this cap too: 32 B of local memory at 128, untimed at 168.
PLANE_WEIGHTS_CAP_K9 = 168


@lru_cache(maxsize=1024)
def plan_plane(problem: Problem, backward: bool, shared_limit: int, max_slots: int,
               tuning: Tuning = Tuning()) -> Launch:
    """Choose the kernel variant and launch shape for one plane pass.

    The working set goes to shared memory when one plane's buffer fits in
    ``shared_limit`` bytes. A block then runs ``planes_per_block`` planes side
    by side, one thread group and one buffer slot each: by default 16, 8, 2
    or 1 planes at 16, 32, 64 or 128 threads per plane, halved until their
    slots fit in ``shared_limit`` (warp-synchronous groups smaller than a
    warp stay whole warps; if those do not fit, the scratch path is taken);
    the grid covers every plane. Otherwise the slots are in global scratch
    and the grid is at most ``max_slots // planes_per_block`` persistent blocks (at least
    one), which loop over the planes. A backward plan whose blocks hold
    every work unit of their channels (the units per channel divide the
    planes per block) gets the ``fused_finalize`` variant unless
    ``tuning.fuse_finalize`` is False; a backward plan gets the
    ``weights_only`` variant (``dx`` from the forward kernels), compiled for
    the plane (``PlaneSpec.plane``), where :func:`dx_from_forward` says so; from ``K``
    9 its register cap is `PLANE_WEIGHTS_CAP_K9` unless ``tuning.max_registers`` sets
    one. Plans are cached (``lru_cache``).

    Parameters
    ----------
    problem : Problem
        The layer call.
    backward : bool
        Plan the backward pass (input upsampled by ``stride``) instead of the
        forward one (output subsampled by ``stride``).
    shared_limit : int
        Bytes of dynamic shared memory a block may use.
    max_slots : int
        Most global-scratch slots (planes in flight) of a scratch launch.
    tuning : Tuning, optional
        Launch-shape overrides; unset fields come from :func:`default_tuning`.

    Returns
    -------
    Launch
        Shared by every call with the same arguments: do not modify it.
    """
    p = problem
    in_stride, out_stride = (p.stride, 1) if backward else (1, p.stride)
    default = default_tuning(p, backward)
    strip = tuning.strip or default.strip
    threads = tuning.threads or default.threads
    weights_only = backward and dx_from_forward(p, shared_limit, max_slots, tuning)
    max_registers = tuning.max_registers
    if max_registers is None:
        large_weights = weights_only and p.kernel_size >= 9
        max_registers = PLANE_WEIGHTS_CAP_K9 if large_weights else default.max_registers
    blocked = weights_only and _blocked_weights(p, strip, threads, tuning)
    layout = plane_layout(p.height, p.width, p.levels, p.kernel_size, strip, threads,
                          in_stride, out_stride, backward, weights_only, blocked)
    planes = p.batch * p.channels
    slot_bytes = 4 * layout.slot_floats
    scratch = slot_bytes > shared_limit
    group = tuning.planes_per_block or _default_group(threads)
    warp_sync = tuning.warp_sync
    if warp_sync is None:  # an explicit group that leaves a warp part-filled gets block barriers
        warp_sync = _tiles_warps(threads) and (threads * group) % 32 == 0
    # Warp-synchronous groups smaller than a warp come in whole warps.
    min_group = 32 // threads if warp_sync and threads < 32 else 1
    if not scratch:
        fits = shared_limit // slot_bytes
        if fits < min_group:
            scratch = True
        while group > max(fits, min_group):  # halve, keeping a power of two (fewer variants)
            group //= 2
    spec = PlaneSpec(p.kernel_size, p.storage, in_stride, out_stride, backward, scratch,
                     threads, strip, max_registers, group, warp_sync)
    rb, units, upart, dims = 1, 0, 1, None
    if backward:
        if scratch:
            rb = 1
        elif tuning.batch_chunk is not None:
            rb = max(1, min(int(tuning.batch_chunk), p.batch))
        else:
            rb = batch_chunk(p, layout.ntaps, group, max_slots)
        nchunks = -(-p.batch // rb)
        units, upart = p.channels * nchunks, units_per_partial(group, nchunks)
        if upart == nchunks and tuning.fuse_finalize is not False:
            spec = spec._replace(fused_finalize=True)  # blocks hold whole channels
        else:
            dims = np.array([p.batch, p.channels, p.levels, int(p.has_bias), nchunks // upart],
                            dtype=np.int64)
            dims.setflags(write=False)
        if weights_only:  # dx: the forward kernels; the plane's level table compiled in
            spec = spec._replace(weights_only=True, plane=(p.height, p.width, p.levels),
                                 blocked=blocked)
    geo = with_problem(layout, p.channels, planes, p.has_bias, rb)
    geo.setflags(write=False)  # shared by every call through the plan cache
    header = tuple(np.int64(v) for v in geo[:len(HEADER_FIELDS)])
    blocks = -(-(units if backward else planes) // group)
    block = compiler.block_threads(spec)  # the .maxntid of its PTX
    if scratch:
        blocks = max(1, min(blocks, max_slots // group))
        return Launch(spec, blocks, block, 0, blocks * group * layout.slot_floats,
                      geo, layout.ntaps, header, rb, units, upart, dims)
    return Launch(spec, blocks, block, group * slot_bytes, 0, geo, layout.ntaps,
                  header, rb, units, upart, dims)


def _blocked_weights(p: Problem, strip: int, threads: int, tuning: Tuning) -> bool:
    """Whether a ``weights_only`` plan takes the register-blocked correlations: asked for
    (``tuning.blocked_weights``, else `BLOCKED_WEIGHTS`) and planned for the plane."""
    asked = BLOCKED_WEIGHTS if tuning.blocked_weights is None else tuning.blocked_weights
    if not asked:
        return False
    return blocked_plan(p.height, p.width, p.levels, p.kernel_size, strip, threads) is not None


#: Tile kernel defaults: output tile edge and threads per block.
TILE_EDGE = 64
TILE_THREADS = 128
#: Threads of a tiled backward block when only one block fits per SM: at
#: 8 x 128 x 512 x 512, K 5, L 3 on an H200, 256 threads took 12.2 ms, 128
#: took 14.3 ms and 512 12.3 ms (``benchmarks/tile_bench.py --backward``).
TILE_SOLO_THREADS = 256
#: ``.maxnreg`` of such a block from ``K`` 9 up: one block a multiprocessor leaves it
#: room, and at `REGISTER_CAP` ptxas spilled (88 B of local memory a thread; at 168: the
#: same 128 registers, none): the split backward at 8 x 64 x 256 x 256, L 3 and 5, took
#: 1.1-1.9% less on an H100 (two rounds), with the same bits.
TILE_SOLO_CAP_K9 = 168
#: Planes of one channel a block of a forward tile over its whole plane without inner
#: levels (``TileSpec.planes``) where neither ``Tuning.tile_planes`` nor the plane's
#: `SPLIT_SMALL_TILES` rule sets it (the 28 x 28 stage's rule takes four);
#: ``benchmarks/ncu_target.py`` sets it to profile the default planner's launches with
#: more.
TILE_PLANES = 1
#: Most pixels of ``x`` a tile may load per output pixel (the halo's cost).
TILE_MAX_READ = 2.3
#: Smallest plane, in pixels, that the tiles take by default when the plane
#: kernel would still hold it in shared memory.
TILE_MIN_PIXELS = 128 * 128
#: Most levels the tiles run under a default split. At 8 x C x 512 x 512, K 5,
#: fp32 on an H200, a split at 2 beat one at 3 by 17-20% (forward, L 4 and 5)
#: and 40% (backward, L 5), and one at 1 by 5-50% (``tile_bench.py --splits``).
SPLIT_FINE_LEVELS = 2
#: Planes at least this many pixels on their shorter side split at
#: `SPLIT_FINE_LEVELS` even where whole tiles take the pass, if those load at least
#: `SPLIT_SHALLOW_MIN_READ` pixels per output pixel (L 3 at K 5, L 4 at K 3) and the
#: split's float32 work buffers fit in `SPLIT_SHALLOW_BUFFER_FRACTION` of the bytes
#: of ``x``. On an H100 at 8 x C x 256 x 256 and 512 x 512, L 3, K 5, the split
#: backward took 28-31% less time than whole tiles in fp32 (9.555 -> 6.651 ms at
#: 8 x 128 x 512 x 512) and the forward 1-4% less in fp32 and 9-12% in bf16; on
#: 128 x 128 planes it lost at 8 x 32 (``tile_bench.py --auto-splits``,
#: ``results/h100-2026-12-06c/shallow/``). A split at 1 was faster still
#: backward (5.827 ms) but its buffers take 0.76 times the bytes of an fp32 ``x``.
SPLIT_SHALLOW_MIN_EDGE = 256
#: Fewest pixels of ``x`` whole tiles must load per output pixel
#: (``TileGeometry.read_amplification``) for `SPLIT_SHALLOW_MIN_EDGE` to split them:
#: the split paid where they load 2.25 (K 5 at L 3; K 3 at L 4, 8 x 64 x 256 x 256:
#: backward 1.043 -> 0.684 ms, forward 0.280 -> 0.259 in fp32) and lost where they
#: load 1.56 (K 3 at L 3: backward 0.644 -> 0.677, forward 0.206 -> 0.254;
#: ``results/h100-2026-12-06c/k3/``).
SPLIT_SHALLOW_MIN_READ = 2.0
#: See `SPLIT_SHALLOW_MIN_EDGE`: the work buffers a split at 2 holds at once take
#: 0.125 of an fp32 ``x``'s bytes forward, 0.25 of a 16-bit one's; backward, in batch
#: chunks (`SPLIT_BACKWARD_BUFFER_FRACTION`), as little as their chunks of one entry
#: hold (:func:`_least_split_floats`; a whole batch's 0.19 and 0.38 of ``x``), so
#: only a backward of one batch entry in 16 bits stays whole.
SPLIT_SHALLOW_BUFFER_FRACTION = 1 / 3
#: Most float32 work-buffer bytes, as a fraction of the bytes of ``x``, that a
#: split backward holds at once by default: where the whole batch's pooled
#: arrays, coarse buffer and partials would take more, the pre-pass, coarse
#: problem and tiles run in batch chunks (:func:`split_batch_chunks`). The
#: budget of `DX_FORWARD_BUFFER_FRACTION`: depthwise 7x7's training step peaks at
#: 2 ``x`` above the inputs, and the L 5 split's whole-batch buffers (0.19 of an
#: fp32 ``x``, 0.39 of a 16-bit one) took ours to 1.097-1.134 times that in fp32
#: and 1.19-1.26 in 16 bits on the paper grid (``results/h100-2026-12-06c/``).
SPLIT_BACKWARD_BUFFER_FRACTION = 1 / 6


class SmallTileSplit(NamedTuple):
    """How a plane no larger than one tile splits its forward by default.

    Attributes
    ----------
    level : int
        The split level ``c`` (capped at ``L - 1``).
    min_levels : int
        Least ``L`` that splits.
    threads : int
        Threads of the tile's block (0: `TILE_THREADS`).
    strip : int
        The tile's output-phase strip (0: the tile kernel's default).
    min_pixels : int
        Least problem size of the split, in pixels (0: `SPLIT_MIN_PIXELS`;
        the inner levels run from `SPLIT_MIN_PIXELS`).
    fit : int
        Fit the tile to the plane: its edge is the plane's longer side rounded
        up to a multiple of ``fit`` (itself a multiple of ``2**level``) rather
        than the next power of two, which stays the fallback where the fitted
        tile's halo reads too much (0: the power of two).
    inner : bool
        Run the levels above ``level`` in the tile's block instead of a coarse
        pre-pass (:func:`inner_tiles`).
    inner_max_pixels : int
        With ``inner``: problems of at least this many pixels split instead
        (0: none do).
    max_registers : int
        Register cap of the tile (0: `REGISTER_CAP`).
    max_registers_k7 : int
        Register cap of the tile from ``K`` 7 up (0: ``max_registers``).
    planes : int
        Planes of one channel a tile's block runs (``TileSpec.planes``; 0:
        `TILE_PLANES`), where ``B`` is a multiple of it.
    max_kernel_size : int
        Largest ``K`` the rule splits (0: any that its halo check passes).
    """

    level: int
    min_levels: int
    threads: int = 0
    strip: int = 0
    min_pixels: int = 0
    fit: int = 0
    inner: bool = False
    inner_max_pixels: int = 0
    max_registers: int = 0
    max_registers_k7: int = 0
    planes: int = 0
    max_kernel_size: int = 0

    def register_cap(self, kernel_size: int) -> int:
        """The tile's register cap at ``kernel_size`` (0: `REGISTER_CAP`)."""
        if kernel_size >= 7 and self.max_registers_k7:
            return self.max_registers_k7
        return self.max_registers


#: Planes no larger than a tile split their forward by default, with one tile
#: per plane, by the rule of the plane's next power of two; the coarse planes
#: land on the register kernel (7 x 7 at the ConvNeXt-T stages) or on tiles.
#: Measured on an H200, fp32, K 5, forward (plane kernel -> split):
#:
#: - 64 x 96 x 56 x 56, L 5, 64 tile, c 2: 0.386 -> 0.268 ms (64 threads: 0.310);
#: - 64 x 192 x 28 x 28, L 4, 32 tile, c 2: 0.281 -> 0.175 ms with 64 threads
#:   (0.235 with 128); with the plane's size compile-time (``TileSpec.height``),
#:   151.5-152.3 us with 64 threads, 139.8-140.7 with 32, 221.0-221.8 with 128;
#: - 64 x 384 x 14 x 14, L 3, 16 tile, c 1: 0.145 -> 0.119 ms with 32 threads
#:   and strip 2 (strip 4: 0.128; 64 threads: 0.141-0.159; c 2: 0.156). With a
#:   quarter of the planes (64 x 96 x 14 x 14, the 56 x 56 stage's coarse
#:   problem) the split was slower, 0.043 -> 0.054 ms: its 6,144 coarse planes
#:   fill 48 register-kernel blocks on 132 multiprocessors. Hence its
#:   ``min_pixels``. Between 2^21 and 2^22 pixels the split won at 32 x 384
#:   (58.7 against 73.7 us) and lost at 28 x 384 (77.7 / 72.4) and 64 x 192
#:   (82.5 / 73.4): there a split forward was bound by its host time (three
#:   launches, a work buffer and views: 76 us per call back to back on that
#:   host).
#:
#: Planes of 33 to 64 pixels get a tile fitted to a multiple of 8 (``fit``; its
#: item rows padded to whole warps by :func:`~wtconv_cuda.kernels.tiles.item_row`),
#: with bitwise the same output as the 64 tile. 64 x 96 x H x H, L 5, split
#: forward, 64 tile -> fitted tile (plane kernel): 56: 0.267 -> 0.255 ms
#: (0.387); 48: 0.257 -> 0.222 (0.337); 40: 0.243 -> 0.191 (0.214). A 60
#: tile, a multiple of 4 only, lost (0.296 against 0.275 ms), and so did
#: fitted tiles at 28 x 28 (0.197 against 0.175 ms) and 14 x 14 (0.127 against
#: 0.119).
#:
#: Only the forward: the backward's float32 work buffers (the pooled ``x`` and
#: ``dy``, one partial per tile) raised peak training memory at the ConvNeXt-T
#: stages from 1.04x to 1.14-1.50x depthwise 7x7.
#:
#: The 28 x 28 rule caps registers at 120 (its tile with tap columns, see
#: :func:`~wtconv_cuda.kernels.tiles.tile_geometry`, wants 126). That was meant to
#: keep 17 one-warp blocks per multiprocessor; it does not: a sub-partition's
#: 16,384 registers hold four warps of 120 (or 128), so 16 blocks fit either way
#: (ncu on an H100; 17 needs 96 or fewer). As measured, 118 registers: the 28 x 28
#: forward 0.131 -> 0.129 ms against the tile without tap columns (87 registers, 17
#: blocks; ``benchmarks/results/h100-2026-12-05d/``).
#: Its blocks run four planes of one channel (``planes``): on an H100 at 64 x 192 x
#: 28 x 28, L 4, split at 2 (``tile_bench.py``, two runs of 30), one, two, four, eight
#: and sixteen planes a block: fp32 0.129, 0.130, 0.125, 0.130, 0.142 ms; four against
#: one in bf16 0.127-0.128 against 0.128-0.129 ms
#: (``benchmarks/results/h100-2026-12-05e/tileplanes/``).
#: Split at level 3 instead (``benchmarks/split_threshold.py --edge 32 --max-read 4.5``;
#: H100, back to back, forward / training step in us): fp32 126.2 / 433 -> 143.6 / 464
#: with a 4 x 4 coarse problem, 124.6 / 427 with level 4 inside one-plane tiles (one
#: launch); bf16 128.1 / 471 -> 154.3 / 491 and 135.9 / 469. The 56 x 56 rule split at
#: 3 likewise lost (fp32 194.2 / 681 -> 202.9 / 700;
#: ``benchmarks/results/h100-2026-12-06i/splitrule/``).
#:
#: The halo check reads the geometry of a tile over its whole plane, whose halos hold
#: zeros and are never loaded: the 28 x 28 rule's 32 tile reads 1.9 pixels a pixel at
#: K 7 (3.1 by the halos of a tile inside a plane, which refused it), and the 56 x 56
#: rule's fitted tile 1.65 at K 9 (2.47: it fell back to the 64 tile). H100, back to
#: back, forward / training step in us (``benchmarks/results/h100-2026-12-07/``):
#: 64 x 192 x 28 x 28, L 4, K 7, plane kernel -> split: fp32 364 / 966 -> 222 / 700,
#: bf16 370 / 992 -> 220 / 738. At K 9 the split lost, fp32 490 / 1274 -> 683 / 1707,
#: hence ``max_kernel_size``: at the 120-register cap ptxas (13.5) spills 444 B a thread
#: of this tile at K 7, 916 B at K 9 and none at K 5. At K 7 it is capped at 168
#: (``max_registers_k7``; ptxas 13.0 spills 40 B there, and three blocks fit an SM): H100,
#: back to back, medians of three rounds, the same bits, forward / training step in us,
#: caps 120 (the K 5 cap), 152, 168, 184: fp32 223.1 / 700.4, 216.8 / 694.1, 212.5 /
#: 684.7, 219.7 / 708.7; bf16 219.2 / 738.5, 221.1 / 742.1, 216.3 / 734.0, 228.0 /
#: 755.3. In an earlier call, caps 120, 168, 255: fp32 222.7 / 699.5, 212.3 / 683.8,
#: 219.5 / 702.7; bf16 218.5 / 738.8, 216.9 / 733.8, 229.0 / 757.2
#: (``benchmarks/results/h100-2026-12-07c/``). 64 x 96 x 56 x 56, L 5, K 9,
#: 64 tile -> fitted 56 tile, the same bits: fp32 455 / 1501 -> 436 / 1466, bf16 475 /
#: 1675 -> 449 / 1628.
#:
#: The inner levels (``inner``, :func:`inner_tiles`): on an H200, fp32, K 5, the
#: split forward -> one launch with the coarse levels in the tile's block
#: (``benchmarks/split_stages.py``): 64 x 96 x 56 x 56, L 5: 246.3 -> 227.5 us;
#: 64 x 192 x 28 x 28, L 4: 172.1 -> 181.1 us (its coarse problem is cheap on the
#: register kernel, 17.6 us, and the serial coarse levels idle its 64-thread blocks);
#: with 32-thread tiles, back to back (``benchmarks/split_threshold.py``), 131.2 ->
#: 143.8 us, and at 32 x 192 76.0 -> 75.7 us.
#:
#: At 14 x 14 (split level 1, two inner levels) the inner levels replace the plane
#: kernel below 2^22 pixels and the split stays above (``inner_max_pixels``); fp32,
#: back to back, plane kernel or split -> inner levels (``split_threshold.py``):
#: 16 x 384 42.3 -> 29.6 us, 32 x 384 74.5 -> 53.3, 64 x 192 74.8 -> 53.3, 40 x 384
#: 99.5 -> 65.2, 48 x 384 115.4 -> 77.9; above, split -> inner: 56 x 384 73.5 / 88.1
#: -> 89.3, 64 x 384 77.3 -> 100.7. fp16 alike.
SPLIT_SMALL_TILES = {16: SmallTileSplit(1, 3, 32, 2, min_pixels=1 << 22, inner=True,
                                        inner_max_pixels=1 << 22),
                     32: SmallTileSplit(2, 4, 32, max_registers=120, max_registers_k7=168,
                                        planes=4, max_kernel_size=7),
                     64: SmallTileSplit(2, 4, fit=8, inner=True)}
#: ... where the tile wastes at most this fraction of its pixels ...
SPLIT_MAX_WASTE = 1.35
#: ... and the problem has at least this many pixels: a split issues three to
#: five launches (~7 us of host time each) where the plane kernel issues one or two.
SPLIT_MIN_PIXELS = 1 << 20


class TileLaunch(NamedTuple):
    """Everything needed to issue one ``wtconv_tile`` launch.

    Attributes
    ----------
    spec : TileSpec
        The kernel variant.
    grid : int
        Blocks: one per tile of every plane, ``B * C * tiles_y * tiles_x``.
    block : int
        Threads per block.
    shared_bytes : int
        Dynamic shared memory per block.
    tiles_x, ntiles : int
        Tiles per row and per plane (kernel arguments).
    ntaps : int
        Backward: weight-gradient sums per tile (0 forward).
    finalize_dims : numpy.ndarray or None
        Backward: the finalize kernel's read-only ``dims`` table ``(B, C, L,
        has_bias, B * ntiles)`` (one partial per tile); None forward.
    """

    spec: TileSpec
    grid: int
    block: int
    shared_bytes: int
    tiles_x: int
    ntiles: int
    ntaps: int = 0
    finalize_dims: np.ndarray | None = None

    @property
    def partial_floats(self) -> int:
        """float32 elements of the backward's per-tile partials (0 forward)."""
        return self.grid * self.ntaps


@lru_cache(maxsize=1024)
def plan_tiles(problem: Problem, shared_limit: int, tuning: Tuning = Tuning(),
               backward: bool = False):
    """The tiled kernel's launch for ``problem``, or None where another kernel runs it.

    Whole tiles (:func:`whole_tiles`), else, forward only, one tile per plane
    with the deep levels inside its block (:func:`inner_tiles`).

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit : int
        Bytes of dynamic shared memory a block may use.
    tuning : Tuning, optional
        The overrides :func:`whole_tiles` and :func:`inner_tiles` read.
    backward : bool, default False
        Plan the backward instead of the forward.

    Returns
    -------
    TileLaunch or None
        Shared through the plan cache: do not modify it.
    """
    whole = whole_tiles(problem, shared_limit, tuning, backward)
    if whole is None and not backward:
        return inner_tiles(problem, shared_limit, tuning)
    return whole


def inner_tiles(problem: Problem, shared_limit: int, tuning: Tuning = Tuning()):
    """A forward on one tile per plane that runs the levels above the split in the block.

    Where the default split (:func:`plan_split`) would take one tile per plane
    and its rule says so (`SPLIT_SMALL_TILES`: planes of 33 to 64 pixels, such
    as the 56 x 56 ConvNeXt-T stage, and of 9 to 16 pixels below 2^22 pixels in
    all, such as the 14 x 14 stage at half its batch), that tile covers the
    whole plane, so its LL band of level ``c``
    is the coarse problem's input: the block runs the levels above ``c`` on
    it after its own (``TileSpec.inner_levels``) instead of a coarse
    pre-pass and a coarse problem, with the same sums in the same order.
    One launch instead of three or more, ``x`` read once, no work buffers.
    On an H200 at 64 x 96 x 56 x 56, L 5, the split spent 24.6 us pooling
    ``x`` and 43.0 us on the coarse problem around 177.2 us of tiles
    (``benchmarks/split_stages.py``).

    Parameters
    ----------
    problem : Problem
        The layer call (forward).
    shared_limit : int
        Bytes of dynamic shared memory a block may use.
    tuning : Tuning, optional
        ``inner`` False turns this off; any field that steers the split or
        the tiles (``split``, ``tiles``, ``tile``) leaves the split to them.

    Returns
    -------
    TileLaunch or None
        None where the forward does not run this way.
    """
    p = problem
    if tuning.inner is False or tuning.split is not None or p.stride != 1:
        return None
    small = _small_plane_tiles(p, shared_limit, tuning, False, inner=True)
    if small is None:
        return None
    c, fine = small
    if c < 1 or fine.ntiles != 1 or fine.spec.planes > 1:
        return None
    spec = fine.spec._replace(inner_levels=p.levels - c)
    geo = spec_geometry(spec)
    if 4 * geo.floats > shared_limit:
        return None
    return fine._replace(spec=spec, shared_bytes=4 * geo.floats)


def whole_tiles(problem: Problem, shared_limit: int, tuning: Tuning = Tuning(),
                backward: bool = False):
    """The tiled kernel's launch running every level of ``problem`` on tiles, or None.

    The tiles can run a pass with stride 1 whose buffer fits in
    ``shared_limit``. By default (``tuning.tiles`` None) a pass takes them
    when the halo keeps the pixels a tile loads per output pixel at most
    `TILE_MAX_READ`, the plane is at least one tile each way, and either the
    plane kernel would need global scratch for it or it has at least
    `TILE_MIN_PIXELS` pixels; the forward also needs two blocks to fit in
    ``shared_limit``. A backward of which only one block fits (its buffer
    holds the chains of both ``dy`` and ``x``: 130-133 KB at K 5, L 3) runs
    `TILE_SOLO_THREADS` threads unless ``tuning.threads`` says otherwise,
    from ``K`` 9 capped at `TILE_SOLO_CAP_K9` registers. ``tuning.tiles``
    True takes every problem they can run, False none. The output strip is
    :func:`~wtconv_cuda.kernels.tiles.output_strip`'s for the block, and a
    forward with one tile per plane is compiled for the plane's size
    (``TileSpec.height``/``width``).

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit : int
        Bytes of dynamic shared memory a block may use.
    tuning : Tuning, optional
        ``tiles``, ``tile``, ``threads``, ``strip``, ``max_registers`` and
        (a forward with one tile per plane) ``tile_planes`` are read.
    backward : bool, default False
        Plan the backward (``dx``, then per-tile weight-gradient partials for
        ``wtconv_finalize``) instead of the forward.

    Returns
    -------
    TileLaunch or None
        Shared through the plan cache: do not modify it.
    """
    p = problem
    if tuning.tiles is False or p.stride != 1:
        return None
    edge = tuning.tile or TILE_EDGE
    if edge % 2 ** max(p.levels, 1):  # the coarsest level's coefficients must tile exactly
        return None
    threads = tuning.threads or TILE_THREADS
    if backward and threads < p.kernel_size:  # its correlations take one item per thread
        return None
    geo = tile_geometry(p.kernel_size, p.levels, edge, backward, threads)
    if backward and not tuning.threads and 2 * 4 * geo.floats > shared_limit:
        # one block per SM: more warps to hide latency, if their larger reduction area fits
        solo = tile_geometry(p.kernel_size, p.levels, edge, backward, TILE_SOLO_THREADS)
        if 4 * solo.floats <= shared_limit:
            threads, geo = TILE_SOLO_THREADS, solo
    shared_bytes = 4 * geo.floats
    if shared_bytes > shared_limit:
        return None
    if tuning.tiles is None:
        if geo.read_amplification > TILE_MAX_READ:
            return None
        if not backward and 2 * shared_bytes > shared_limit:
            return None
        if p.height < edge or p.width < edge:
            return None
        if p.height * p.width < TILE_MIN_PIXELS:
            plane = plan_plane(p, backward, shared_limit, 1, tuning._replace(tiles=False))
            if not plane.spec.scratch:
                return None
    strip = tuning.strip or output_strip(edge, threads)
    max_registers = tuning.max_registers
    if max_registers is None:  # one block an SM from K 9: the registers are there
        solo_k9 = (backward and p.kernel_size >= 9 and threads == TILE_SOLO_THREADS
                   and 2 * shared_bytes > shared_limit)
        max_registers = TILE_SOLO_CAP_K9 if solo_k9 else REGISTER_CAP
    tiles_x, tiles_y = -(-p.width // edge), -(-p.height // edge)
    ntiles = tiles_x * tiles_y
    # a forward block with the whole plane loads it as one run (TileSpec.height)
    sizes = (p.height, p.width) if ntiles == 1 and not backward else (0, 0)
    spec = TileSpec(p.kernel_size, p.storage, p.levels, edge, threads, strip, max_registers,
                    backward=backward, height=sizes[0], width=sizes[1])
    grid = p.batch * p.channels * ntiles
    planes = tuning.tile_planes or TILE_PLANES
    if sizes[0] and planes > 1 and p.batch % planes == 0:  # planes of one channel a block
        several = spec._replace(planes=planes)
        if 4 * shared_floats(several) <= shared_limit:
            spec, grid = several, grid // planes
    if sizes[0]:  # the rules above read the general halos; a whole plane needs less
        shared_bytes = 4 * shared_floats(spec)
    block = compiler.block_threads(spec)  # the .maxntid of its PTX
    if not backward:
        return TileLaunch(spec, grid, block, shared_bytes, tiles_x, ntiles)
    ntaps = p.kernel_size ** 2 * (1 + 4 * p.levels) + 1
    dims = np.array([p.batch, p.channels, p.levels, int(p.has_bias), p.batch * ntiles],
                    dtype=np.int64)
    dims.setflags(write=False)
    return TileLaunch(spec, grid, block, shared_bytes, tiles_x, ntiles, ntaps, dims)


#: Threads per block of the register kernel (one plane each).
REGISTER_THREADS = 128
#: ``.maxnreg`` of the register kernel. A 7 x 7 plane (L 2, K 5) fits in 168
#: registers without spills; on an H200 at 64 x 768 x 7 x 7 fp32 the forward
#: took 22.3 us at 168, 28.4 us at 128 (144 B of local memory per thread) and
#: 44.5 us left free (241 registers: fewer resident warps), before its staging load
#: was unrolled (16.6 us at 168 since).
REGISTER_KERNEL_CAP = 168
#: ``.maxnreg`` of its backward. At 7 x 7 (L 2, K 5) a 128-thread block holds
#: 74 KB of shared memory, so three fit in a multiprocessor when the registers
#: allow it (168 per thread): the problem's 1,536 warps then run in one wave.
#: On an H200 at 64 x 768 x 7 x 7 fp32 the backward took 56.4 us at 168 (176 B of
#: local memory per thread) and 92.9 us at 255 (242 registers, two blocks), before
#: its staging load was unrolled (34.7 us at 168 since, 144 B).
REGISTER_BACKWARD_CAP = 168
#: ``.maxnreg`` of its backward from ``K`` 9 up: at 168 ptxas spilled 184 B (fp32) and
#: 248 B (bf16) a thread at 7 x 7, L 2; at 200 none. On an H100 at 64 x 768 x 7 x 7, L 2
#: (two rounds, every output bit for bit the planner's) the backward took 0.112 against
#: 0.132 ms in fp32 and 0.106 against 0.109 ms in bf16. The forward stays at
#: `REGISTER_KERNEL_CAP` (0.025 against 0.020 ms at 200: two blocks an SM, not three).
REGISTER_BACKWARD_CAP_K9 = 200
#: ``Tuning(registers=True)`` forces the register kernel up to this many pixels.
REGISTER_FORCE_MAX_PIXELS = 256
#: Largest batch of a backward on the register kernel (its block holds whole channels).
REGISTER_BACKWARD_MAX_BATCH = 256


class RegisterLaunch(NamedTuple):
    """A pass on the register kernel: one thread per plane.

    Attributes
    ----------
    spec : RegisterSpec
        The ``wtconv_registers`` variant.
    grid, block : int
        Blocks and threads per block (``ceil(B * C / block)`` blocks).
    shared_bytes : int
        Dynamic shared memory per block (the block's planes, in and out).
    scalars : tuple of numpy.int64
        The launch's int64 arguments after its pointers: ``B, C, has_bias``.
    """

    spec: RegisterSpec
    grid: int
    block: int
    shared_bytes: int
    scalars: tuple = ()


_PLANE_SHAPE_FIELDS = ("threads", "strip", "planes_per_block", "warp_sync", "tiles", "tile",
                       "split")


@lru_cache(maxsize=1024)
def plan_registers(problem: Problem, shared_limit: int, tuning: Tuning = Tuning(),
                   backward: bool = False):
    """The register kernel for a pass on tiny planes, or None.

    By default (``tuning.registers`` None) a pass runs on
    :mod:`wtconv_cuda.kernels.registers` when its plane has at most
    `REGISTER_MAX_PIXELS` pixels and no field of the other kernels' launch
    shapes (``threads``, ``strip``, ``planes_per_block``, ``warp_sync``,
    ``tiles``, ``tile``, ``split``) is set; ``tuning.registers`` True takes
    it up to `REGISTER_FORCE_MAX_PIXELS` pixels, False never. Either way the
    block must fit in ``shared_limit``. The backward also needs ``B`` to be
    a multiple of 32 of at most 256: its block holds whole channels (``128``
    threads when ``B`` divides 128, else ``B``) and writes their parameter
    gradients itself.

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit : int
        Bytes of dynamic shared memory a block may use.
    tuning : Tuning, optional
        ``registers``, and ``threads`` and ``max_registers`` for the launch.
    backward : bool, default False
        Plan the backward pass.

    Returns
    -------
    RegisterLaunch or None
        None where the pass runs on another kernel.
    """
    p = problem
    pixels = p.height * p.width
    if tuning.registers is False:
        return None
    if tuning.registers is None:
        if pixels > REGISTER_MAX_PIXELS:
            return None
        if any(getattr(tuning, f) is not None for f in _PLANE_SHAPE_FIELDS):
            return None
    elif pixels > REGISTER_FORCE_MAX_PIXELS:
        return None
    # (by default no ``threads`` is set: it would have selected the other kernels)
    threads = tuning.threads or REGISTER_THREADS
    if backward:
        batch = p.batch
        if batch % 32 or batch > REGISTER_BACKWARD_MAX_BATCH:
            return None
        if not tuning.threads and REGISTER_THREADS % batch:
            threads = batch
        if threads % batch:
            return None
    cap = REGISTER_KERNEL_CAP
    if backward:
        cap = REGISTER_BACKWARD_CAP_K9 if p.kernel_size >= 9 else REGISTER_BACKWARD_CAP
    if tuning.max_registers is not None:
        cap = tuning.max_registers
    spec = RegisterSpec(p.kernel_size, p.storage, p.height, p.width, p.levels, p.stride,
                        threads, cap, backward)
    shared = register_shared_bytes(spec)
    if shared > shared_limit:
        return None
    return RegisterLaunch(spec, -(-p.batch * p.channels // threads), threads, shared,
                          _int64s(p.batch, p.channels, int(p.has_bias)))


#: Largest plane whose weight gradients take the lane kernel by default (with
#: `LANES_DEFAULT` threads per plane, fewer where :func:`plan_lanes` bounds the
#: partials): 14 x 14. At 64x384x14x14, L3, K5 on the H200 the backward took 98
#: us against the plane kernel's 251 (fp32, two threads a plane; bf16 with one:
#: 160 against 245 with the tiles' dx forward; benchmarks/NOTES.md, thirty-first
#: session). Larger planes are untimed (a 28 x 28 block fits twice per
#: multiprocessor).
LANES_MAX_PIXELS = 196
#: Threads per plane of the lane kernel where the default rule takes it.
LANES_DEFAULT = 2
#: Most groups of planes a lane kernel's block takes for the weight gradients by
#: default (``LaneSpec.groups``): the default rule takes the fewest groups, up to
#: this many, that keep a plane's threads within `PARTIAL_FRACTION`. Two let 16-bit
#: 14 x 14 planes keep two threads a plane (partials 0.10x the bytes of ``x``): the
#: bf16 backward at 64x384x14x14, L3, K5 took 97-108 us against 117 with one thread
#: and one group on an H100 (benchmarks/results/h100-2026-12-05).
LANE_GROUPS_MAX = 2
#: Threads per plane of the lane kernel's forward where its default rule takes it.
LANES_FORWARD_DEFAULT = 2
#: Largest plane whose stride-1 forward (and a backward's ``dx`` forward) takes the
#: lane kernel's forward by default, above the register kernel's planes: 14 x 14
#: (45 us against 77 back to back at 64x384x14x14, L3, K5, fp32 and bf16).
LANES_FORWARD_MAX_PIXELS = 196
#: ``Tuning(lanes=...)`` forces the lane kernel up to this many pixels (a
#: plane's slot must still fit the block's shared memory).
LANES_FORCE_MAX_PIXELS = 1024


#: Shared memory of a multiprocessor (bytes; Hopper: 228 KB) and what it sets
#: aside per resident block.
SM_SHARED_BYTES = 228 * 1024
BLOCK_RESERVED_SHARED = 1024


def lane_spec_fitted(spec: LaneSpec) -> LaneSpec:
    """``spec`` with the ``tap_batch`` (16 to 32) that lets the most blocks share a
    multiprocessor, the largest of those.

    A multiprocessor holds `SM_SHARED_BYTES`, each block costing its buffer
    plus `BLOCK_RESERVED_SHARED` (Hopper's figures; elsewhere the choice only
    sizes the tile). At 14 x 14, L 3, two lanes per plane, a 26-tap tile fits
    seven blocks where the 32-tap one fits six.
    """
    def blocks(batch: int) -> int:
        return SM_SHARED_BYTES // (lane_shared_bytes(spec._replace(tap_batch=batch))
                                   + BLOCK_RESERVED_SHARED)

    best = max(range(32, 15, -1), key=blocks)  # the first (largest) of the most blocks
    return spec._replace(tap_batch=best)


class LaneLaunch(NamedTuple):
    """The weight gradients of a backward on the lane kernel (:mod:`wtconv_cuda.kernels.lanes`).

    Attributes
    ----------
    spec : LaneSpec
        The ``wtconv_lanes`` variant.
    grid : int
        Blocks: ``C * nchunks``, one warp each (``nchunks = B / (planes *
        groups)``).
    shared_bytes : int
        Dynamic shared memory per block.
    partial_floats : int
        ``grid * ntaps``: one partial per block.
    finalize_dims : numpy.ndarray
        ``(B, C, L, has_bias, nchunks)`` for ``wtconv_finalize``.
    ntaps : int
        Taps of a partial.
    scalars : tuple of numpy.int64
        ``B, C``: the launch's int64 arguments after its pointers.
    """

    spec: LaneSpec
    grid: int
    shared_bytes: int
    partial_floats: int
    finalize_dims: np.ndarray
    ntaps: int
    scalars: tuple


@lru_cache(maxsize=1024)
def plan_lanes(problem: Problem, shared_limit: int, max_slots: int, tuning: Tuning = Tuning()):
    """The lane kernel for a backward's weight gradients, or None.

    It runs where ``dx`` comes from the forward kernels
    (:func:`dx_forward_plan` has a plan), ``B`` is a multiple of the block's
    ``32 / lanes`` planes and the block's buffer fits ``shared_limit``.
    ``tuning.lanes`` 1 or 2 takes it for planes of up to
    `LANES_FORCE_MAX_PIXELS`; None for planes of up to `LANES_MAX_PIXELS`
    with `LANES_DEFAULT` threads each; 0 never.

    The default rule also keeps the partials (one per block, ``ntaps``
    float32 sums) within `PARTIAL_FRACTION` of the bytes of ``x``, the plane
    kernel's bound: for each count of threads a plane, most first, it takes
    the fewest groups of planes a block (up to `LANE_GROUPS_MAX`; ``n``
    groups, ``n`` times fewer partials) that keep them there, else one thread
    fewer; else nobody. At 64 x 384 x 14 x 14, L 3 in 16-bit storage two
    threads' partials are 0.21 x the bytes of ``x`` with one group (a
    training step's peak 1.13x depthwise 7x7's on the H200), 0.10 x with two.
    One thread a plane (also 0.10 x) measured 160 against 138 us for the
    backward there (bf16, with the tiles' ``dx`` forward, H200); two threads
    in two groups 97-108 against one thread's 117 us (H100).

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit, max_slots : int
        The backend's limits, as passed to :func:`plan_plane`.
    tuning : Tuning, optional
        ``lanes``, and ``max_registers`` for its register cap.

    Returns
    -------
    LaneLaunch or None
    """
    p = problem
    lanes = _lanes_for(p, tuning.lanes, LANES_MAX_PIXELS, LANES_DEFAULT)
    if not lanes:
        return None
    ntaps = p.kernel_size ** 2 * (1 + 4 * p.levels) + 1
    x_bytes = _x_bytes(p)
    forced = tuning.lanes is not None
    counts = ((tuning.lane_groups,) if tuning.lane_groups
              else (1,) if forced else range(1, LANE_GROUPS_MAX + 1))
    for threads, groups in product((lanes,) if forced else range(lanes, 0, -1), counts):
        spec = lane_spec_fitted(LaneSpec(p.kernel_size, p.storage, p.height, p.width,
                                         p.levels, threads, tuning.max_registers or 0,
                                         groups=groups))
        shared = _lane_block_fits(p, spec, shared_limit)
        nchunks = p.batch // lane_partial_planes(spec)
        grid = p.channels * nchunks
        if shared is not None and (forced or grid * ntaps * 4 <= PARTIAL_FRACTION * x_bytes):
            break
    else:
        return None
    if dx_forward_plan(p, shared_limit, max_slots, tuning) is None:
        return None
    dims = np.array([p.batch, p.channels, p.levels, int(p.has_bias), nchunks], np.int64)
    return LaneLaunch(spec, grid, shared, grid * ntaps, dims, ntaps,
                      _int64s(p.batch, p.channels))


class LaneForwardLaunch(NamedTuple):
    """A stride-1 forward on the lane kernel's forward (``wtconv_lanes_forward``).

    Attributes
    ----------
    spec : LaneForwardSpec
        The ``wtconv_lanes_forward`` variant.
    grid : int
        Blocks: ``C * B / planes``, one warp each.
    shared_bytes : int
        Dynamic shared memory per block.
    scalars : tuple of numpy.int64
        ``B, C, has_bias``: the launch's int64 arguments after its pointers.
    """

    spec: LaneForwardSpec
    grid: int
    shared_bytes: int
    scalars: tuple


@lru_cache(maxsize=1024)
def plan_lanes_forward(problem: Problem, shared_limit: int, tuning: Tuning = Tuning()):
    """The lane kernel's forward for a stride-1 pass, or None.

    ``tuning.lanes_forward`` 1, 2 or 4 takes it for planes of up to
    `LANES_FORCE_MAX_PIXELS`; None for planes of up to
    `LANES_FORWARD_MAX_PIXELS` with `LANES_FORWARD_DEFAULT` threads each; 0 never.
    Either way ``B`` must be a multiple of the block's ``32 / lanes`` planes
    and the block must fit ``shared_limit``. (:func:`run_forward` asks the
    register kernel first.)

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit : int
        Bytes of dynamic shared memory a block may use.
    tuning : Tuning, optional
        ``lanes_forward``, and ``max_registers`` for its register cap.

    Returns
    -------
    LaneForwardLaunch or None
    """
    p = problem
    lanes = _lanes_for(p, tuning.lanes_forward, LANES_FORWARD_MAX_PIXELS, LANES_FORWARD_DEFAULT)
    if not lanes:
        return None
    spec = LaneForwardSpec(p.kernel_size, p.storage, p.height, p.width, p.levels, lanes,
                           tuning.max_registers or 0)
    shared = _lane_block_fits(p, spec, shared_limit)
    if shared is None:
        return None
    return LaneForwardLaunch(spec, p.channels * p.batch // lane_planes(spec), shared,
                             _int64s(p.batch, p.channels, int(p.has_bias)))


def _lanes_for(problem: Problem, asked, default_max_pixels: int, default_lanes: int) -> int:
    """Threads per plane a lane kernel takes ``problem`` with (0: it does not): ``asked``
    (a `Tuning` field) for planes of up to `LANES_FORCE_MAX_PIXELS`, or where it is
    None ``default_lanes`` for planes of up to ``default_max_pixels``; stride 1 only."""
    pixels = problem.height * problem.width
    if asked is None:
        asked = default_lanes if pixels <= default_max_pixels else 0
    elif pixels > LANES_FORCE_MAX_PIXELS:
        return 0
    return asked if problem.stride == 1 else 0


def _lane_block_fits(problem: Problem, spec, shared_limit: int):
    """The block's shared bytes where ``B`` fills whole blocks of ``spec``'s planes (all
    its groups) and the buffer fits ``shared_limit``, else None."""
    shared = lane_shared_bytes(spec)
    if problem.batch % lane_partial_planes(spec) or shared > shared_limit:
        return None
    return shared


class SplitPlan(NamedTuple):
    """A pass split at level ``split``: coarse pre-pass, then the tiles.

    Attributes
    ----------
    split : int
        ``c``: the levels the tiles run.
    coarse_in : CoarseSpec
        The ``wtconv_coarse_in`` variant that pools the input(s) and copies
        the coarse levels' parameters.
    grid : int
        Blocks of the ``wtconv_coarse_in`` launch.
    layout : CoarseLayout
        Offsets in the work buffer (:func:`wtconv_cuda.kernels.coarse.coarse_layout`).
    coarse : Problem
        The coarse pass: ``(B, C, ceil(H / 2**c), ceil(W / 2**c))``, ``L - c``
        levels, stride 1, float32, no bias.
    tiles : TileLaunch
        The fine levels' tile launch (``spec.coarse`` set).
    coarse_out : CoarseOutSpec or None
        Backward: the ``wtconv_coarse_out`` variant that stores the coarse
        levels' gradients; None forward.
    coarse_in_scalars : tuple of numpy.int64
        The int64 arguments of the ``wtconv_coarse_in`` launch, after its
        pointers.
    in_place : bool
        Forward with the coarse problem on the register kernel, which reads
        all of a block's planes before it writes any: ``x`` is pooled into
        the area of the coarse output and the coarse pass runs over it, so
        the pass needs one work buffer (``layout.floats`` elements), not two.
        At 64 x 384 x 14 x 14 that is 0.26 instead of 0.51 times the bytes of
        a float32 ``x``.
    """

    split: int
    coarse_in: CoarseSpec
    grid: int
    layout: CoarseLayout
    coarse: Problem
    tiles: TileLaunch
    coarse_out: CoarseOutSpec | None = None
    coarse_in_scalars: tuple = ()
    in_place: bool = False


@lru_cache(maxsize=1024)
def plan_split(problem: Problem, shared_limit: int, tuning: Tuning = Tuning(),
               backward: bool = False):
    """Split a pass too deep for the tiles at level ``c``: a coarse pre-pass, then tiles.

    The tiles' halo doubles with every level (:mod:`wtconv_cuda.kernels.tiles`).
    The levels above ``c`` run first on the raw LL band of level ``c``, a
    ``4**c`` times smaller problem (:mod:`.coarse`), and the tiles run ``c``
    levels with the result. By default a stride-1 pass splits

    - where :func:`plan_tiles` does not take it whole but takes it at ``c <=``
      `SPLIT_FINE_LEVELS` levels (the largest such ``c``);
    - at ``c =`` `SPLIT_FINE_LEVELS` where the tiles would take it whole at more
      levels while loading at least `SPLIT_SHALLOW_MIN_READ` pixels per output
      pixel, on planes of at least `SPLIT_SHALLOW_MIN_EDGE` pixels a side, if the
      split's work buffers fit `SPLIT_SHALLOW_BUFFER_FRACTION` of ``x``'s bytes;

    and on planes no
    larger than a tile (`TILE_EDGE`) the forward as `SPLIT_SMALL_TILES` says
    for the plane's tile, when that tile wastes at most `SPLIT_MAX_WASTE` of
    its pixels and keeps its halo within `TILE_MAX_READ`, in problems large
    enough (`SPLIT_MIN_PIXELS` unless the rule says more). ``tuning.split``
    forces a split.

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit : int
        Bytes of dynamic shared memory a block may use.
    tuning : Tuning, optional
        ``split`` and everything :func:`plan_tiles` reads.
    backward : bool, default False
        Plan the backward: the pre-pass pools ``x`` and ``dy``, the coarse
        problem's backward gives the gradient the tiles add and the coarse
        levels' parameter gradients, which ``wtconv_coarse_out`` stores.

    Returns
    -------
    SplitPlan or None
        None where the pass does not split. Shared through the plan cache.
    """
    p = problem
    if p.stride != 1 or p.levels < 2 or tuning.tiles is False:
        return None
    shallow = False  # a default split where whole tiles would run the pass
    if tuning.split is not None:
        if not 1 <= tuning.split < p.levels:
            return None
        choices = [tuning.split]
        tuning = tuning._replace(tiles=True)
    else:
        whole = plan_tiles(p, shared_limit, tuning, backward)
        shallow = whole is not None
        if shallow and (p.levels <= SPLIT_FINE_LEVELS
                        or min(p.height, p.width) < SPLIT_SHALLOW_MIN_EDGE
                        or spec_geometry(whole.spec).read_amplification
                        < SPLIT_SHALLOW_MIN_READ):
            return None
        choices = range(min(p.levels - 1, SPLIT_FINE_LEVELS), 0, -1)
        if shallow:
            choices = [SPLIT_FINE_LEVELS]
    for c in choices:
        fine = whole_tiles(p._replace(levels=c), shared_limit, tuning, backward)
        if fine is not None:
            break
    else:
        small = None if tuning.split is not None or shallow else _small_plane_tiles(
            p, shared_limit, tuning, backward)
        if small is None:
            return None
        c, fine = small
    split = _split_plan(p, c, fine._replace(spec=fine.spec._replace(coarse=True)),
                        shared_limit, backward)
    if shallow:  # whole tiles would do: split only within the buffer budget
        if 4 * _least_split_floats(p, split, shared_limit) > (SPLIT_SHALLOW_BUFFER_FRACTION
                                                              * _x_bytes(p)):
            return None
    return split


def _least_split_floats(p: Problem, split: SplitPlan, shared_limit: int) -> int:
    """float32 work-buffer elements ``split`` of ``p`` holds at once at the least, the
    coarse problem's own aside: forward, the coarse buffer beside the pooled array;
    backward, in batch chunks of one entry (:func:`split_batch_chunks`), one entry's
    coarse buffer beside its pooled pair or its partials, and every entry's sums."""
    if split.coarse_out is None:
        return split.layout.floats + (0 if split.in_place else split.layout.pooled_floats)
    one, sums = split, 0
    if p.batch > 1:
        one = _chunk_plan(p, split, 1, shared_limit)
        sums = p.batch * _chunk_sum_floats(split)
    return one.layout.floats + max(one.layout.pooled_floats, one.tiles.partial_floats) + sums


def _chunk_plan(p: Problem, split: SplitPlan, count: int, shared_limit: int) -> SplitPlan:
    """The backward ``split`` of ``p`` on a batch chunk of ``count`` entries: the same
    split and tiles, the chunk's blocks, no finalize of its own."""
    fine = split.tiles._replace(grid=count * p.channels * split.tiles.ntiles,
                                finalize_dims=None)
    return _split_plan(p._replace(batch=count), split.split, fine, shared_limit, True)


def _split_plan(p: Problem, c: int, fine: TileLaunch, shared_limit: int,
                backward: bool) -> SplitPlan:
    """The plan of ``p`` split at ``c`` with the fine levels on ``fine`` (its spec
    ``coarse``): the coarse problem, the pre-pass's layout, variant and scalars."""
    coarse = Problem(p.batch, p.channels, -(-p.height >> c), -(-p.width >> c), p.kernel_size,
                     p.levels - c, 1, "float32", False)
    layout = coarse_layout(p.batch, p.channels, coarse.height, coarse.width, p.kernel_size,
                           coarse.levels, backward)
    spec = CoarseSpec(p.storage, c, 2 if backward else 1, height=coarse.height,
                      width=coarse.width)
    items = layout.plane + (layout.wavelet_scale + coarse.levels * p.channels * 4
                            - layout.base_weight)
    grid = -(-items // COARSE_THREADS)
    out = CoarseOutSpec(p.storage) if backward else None
    C, K2 = p.channels, p.kernel_size ** 2
    scalars = _int64s(p.height, p.width, layout.plane,
                      layout.wavelet_weight - layout.base_weight, coarse.levels * C * 4 * K2,
                      coarse.levels * C * 4, c * C * 4 * K2, c * C * 4)
    in_place = not backward and plan_registers(coarse, shared_limit) is not None
    return SplitPlan(c, spec, grid, layout, coarse, fine, out, scalars, in_place)


def split_live_floats(split: SplitPlan, chunks: tuple, shared_limit: int,
                      max_slots: int) -> int:
    """float32 elements of work buffers a split backward holds at once, at most.

    Parameters
    ----------
    split : SplitPlan
        The backward's plan (:func:`plan_split`).
    chunks : tuple of SplitPlan
        Its batch chunks (:func:`split_batch_chunks`), or empty.
    shared_limit, max_slots : int
        The backend's limits, which plan the coarse problem.

    Returns
    -------
    int
        The coarse buffer and the coarse problem's buffers beside the pooled
        pair or, after its release, beside the tiles' partials. In batch
        chunks, the chunks' partial sums and coarse gradients beside the
        most a chunk holds so; the coarse problem does not release its own
        buffers, and a recorded program
        (:class:`~wtconv_cuda.kernels.program.Program`) keeps them to the end
        of the call, so every earlier chunk's count too.
    """
    def coarse(plan):
        return sum(work_buffers(plan.coarse, True, shared_limit, max_slots))

    def one(plan):
        return (plan.layout.floats + coarse(plan)
                + max(plan.layout.pooled_floats, plan.tiles.partial_floats))

    if not chunks:
        return one(split)
    held = peak = 0
    for plan in chunks:
        peak = max(peak, held + one(plan))
        held += coarse(plan)
    return len(chunks) * _chunk_sum_floats(split) + peak


def _chunk_sum_floats(split: SplitPlan) -> int:
    """float32 elements one batch chunk of a split backward keeps to the end: its
    partials' sums per channel and tap, and its coarse problem's gradients (laid out as
    from ``layout.grads`` in the coarse buffer)."""
    return (split.coarse.channels * split.tiles.ntaps
            + split.layout.floats - split.layout.grads)


@lru_cache(maxsize=1024)
def split_batch_chunks(problem: Problem, shared_limit: int, max_slots: int,
                       tuning: Tuning = Tuning()) -> tuple:
    """The batch chunks a split backward runs in, or none.

    A split backward's pooled pair, coarse buffer and per-tile partials grow
    with the batch: on the paper grid's L 5 they hold 0.19-0.21 of an fp32
    ``x``'s bytes at once, 0.39-0.41 of a 16-bit one's (the partials alone
    0.055 of ``x``'s elements at K 5: 226 sums per 64 x 64 tile). Where that
    passes `SPLIT_BACKWARD_BUFFER_FRACTION`, the pre-pass, the coarse problem's
    backward and the tiles run chunk by chunk, each chunk's pooled pair,
    coarse buffer and partials released before the next one's are requested
    (:func:`split_live_floats` counts what stays); ``wtconv_partial_sum`` adds each
    chunk's partials per channel into one of the chunks' sums (in the order
    ``wtconv_finalize`` adds them whole), and after the last chunk one
    ``wtconv_finalize`` adds those and ``wtconv_coarse_out`` the chunks'
    coarse gradients. The fewest chunks that fit are taken, ``ceil(B / n)``
    entries each but the last (else chunks of one entry).

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit, max_slots : int
        The backend's limits.
    tuning : Tuning, optional
        ``split_batch`` forces the chunk size; the rest plans the split.

    Returns
    -------
    tuple of SplitPlan
        Each chunk's plan in batch order (``coarse.batch`` entries; its
        ``tiles.grid`` the chunk's blocks, its ``tiles.finalize_dims`` None).
        Empty where the backward does not split or runs the batch whole.
    """
    split = plan_split(problem, shared_limit, tuning, True)
    if split is None:
        return ()
    B = problem.batch

    def chunks(size):
        counts = [size] * (B // size) + ([B % size] if B % size else [])
        if len(counts) == 1:
            return ()
        plans = {n: _chunk_plan(problem, split, n, shared_limit) for n in dict.fromkeys(counts)}
        return tuple(plans[n] for n in counts)

    if tuning.split_batch is not None:
        return chunks(min(max(tuning.split_batch, 1), B))
    budget = SPLIT_BACKWARD_BUFFER_FRACTION * _x_bytes(problem)
    for size in sorted({-(-B // n) for n in range(1, B + 1)}, reverse=True):
        plan = chunks(size)
        if 4 * split_live_floats(split, plan, shared_limit, max_slots) <= budget:
            return plan
    return chunks(1)


def _small_plane_tiles(p: Problem, shared_limit: int, tuning: Tuning, backward: bool,
                       inner: bool = False):
    """``(c, tiles)`` of a default split forward on a plane no larger than a tile, or None;
    with ``inner``, only where the rule runs the coarse levels in the tile's block."""
    if backward or tuning.tiles is not None or tuning.tile:
        return None
    edge = 1 << (max(p.height, p.width) - 1).bit_length()
    rule = SPLIT_SMALL_TILES.get(edge)
    if rule is None or p.levels < rule.min_levels or (inner and not rule.inner):
        return None
    if rule.max_kernel_size and p.kernel_size > rule.max_kernel_size:
        return None
    pixels = p.batch * p.channels * p.height * p.width
    if pixels < (SPLIT_MIN_PIXELS if inner else (rule.min_pixels or SPLIT_MIN_PIXELS)):
        return None
    if inner and tuning.inner is not True and 0 < rule.inner_max_pixels <= pixels:
        return None
    c = min(p.levels - 1, rule.level)
    threads = tuning.threads or rule.threads or None
    strip = tuning.strip or rule.strip or None
    max_registers = tuning.max_registers or rule.register_cap(p.kernel_size) or None
    planes = tuning.tile_planes or rule.planes or None
    fitted = -(-max(p.height, p.width) // rule.fit) * rule.fit if rule.fit else edge
    # a fitted tile whose halo reads too much falls back to the power of two; the tile
    # covers its plane, so its halos are a whole plane's (zeros, never loaded)
    for tile in dict.fromkeys([fitted, edge]):
        if tile * tile > SPLIT_MAX_WASTE * p.height * p.width:
            continue
        geometry = tile_geometry(p.kernel_size, c, tile, whole_plane=True)
        if geometry.read_amplification > TILE_MAX_READ:
            continue
        fine = whole_tiles(p._replace(levels=c), shared_limit,
                          tuning._replace(tiles=True, tile=tile, threads=threads, strip=strip,
                                          max_registers=max_registers, tile_planes=planes),
                          backward)
        if fine is not None:
            return c, fine
    return None


class _ArrayViews:
    """Work-buffer views of the array backends (CuPy and NumPy slice alike)."""

    def entries(self, array, start: int, count: int, storage: str):
        """Elements ``start .. start + count`` of a C-contiguous layer array, flat
        (a view; ``storage`` is the array's own type)."""
        return array.reshape(-1)[start:start + count]

    def view(self, buffer, start: int, count: int):
        """Elements ``start .. start + count`` of a float32 work buffer (a view)."""
        return buffer[start:start + count]

    def typed_view(self, buffer, start: int, count: int, storage: str):
        """``count`` elements of ``storage`` type from element ``start`` of a float32
        work buffer (a view; bfloat16 as ``uint16``)."""
        words = storage_words(count, storage)
        return buffer[start:start + words].view(_VIEW_DTYPES[storage])[:count]

    def release(self, buffer) -> None:
        """Nothing: a work buffer returns to the pool when its last reference goes."""


class CupyBackend(_ArrayViews):
    """Launches on the current CuPy device and stream.

    Parameters
    ----------
    device_id : int, optional
        Device the kernels are loaded for and whose limits are planned with
        (default: CuPy's current device). Callers make it current around the
        calls.
    """

    simulate = False

    def __init__(self, device_id: int | None = None):
        import cupy
        self._cupy = cupy
        self.device_id = cupy.cuda.runtime.getDevice() if device_id is None else device_id
        attrs = cupy.cuda.Device(self.device_id).attributes
        self.shared_limit = attrs["MaxSharedMemoryPerBlockOptin"] - 1024
        self.max_slots = 2 * attrs["MultiProcessorCount"]
        self._tables: dict = {}
        self._handles: dict = {}

    def kernel(self, spec):
        """The loaded kernel of ``spec`` on this backend's device.

        Parameters
        ----------
        spec : PlaneSpec, TileSpec or FinalizeSpec
            The kernel variant.

        Returns
        -------
        cupy.RawKernel
            See :func:`wtconv_cuda.kernels.compiler.gpu_kernel` (which raises
            `CompileError` when the variant cannot be compiled or loaded).
        """
        return compiler.gpu_kernel(spec, self.device_id)

    def driver_handle(self, kernel):
        """The ``CUfunction`` handle of ``kernel`` on this backend's device, as an int.

        Used by the bindings' raw-pointer launcher to call ``cuLaunchKernel``
        directly. Returns None (launch through CuPy instead) when this CuPy
        does not expose the handle.
        """
        try:
            with self._cupy.cuda.Device(self.device_id):
                return int(kernel.kernel.ptr)
        except Exception:  # an older or newer CuPy without RawKernel.kernel.ptr
            return None

    def call(self, kernel, grid, block, args, shared_bytes):
        """Launch ``kernel`` on a 1-D grid on the current stream (asynchronous).

        With a driver handle (:meth:`driver_handle`, asked once per kernel)
        the launch goes straight to ``cuLaunchKernel``
        (:func:`wtconv_cuda.kernels.driver.driver_launch`), CuPy arrays as
        their device addresses; otherwise through the ``RawKernel``. The
        caller makes the device current with its context bound
        (:class:`wtconv_cuda.kernels.driver.DeviceScope`).

        Parameters
        ----------
        kernel : cupy.RawKernel
            From :meth:`kernel`.
        grid, block : int
            Blocks in the grid and threads per block.
        args : tuple
            The kernel's arguments: CuPy arrays (passed as pointers) and
            non-negative integers.
        shared_bytes : int
            Dynamic shared memory per block.

        Returns
        -------
        None
            The launch is queued; nothing waits for it.
        """
        handle = self._handles.get(kernel, self)
        if handle is self:
            handle = self._handles[kernel] = self.driver_handle(kernel)
        if handle is None:
            kernel((grid,), (block,), args, shared_mem=shared_bytes)
            return
        cupy = self._cupy
        ndarray = cupy.ndarray
        values = [a.data.ptr if isinstance(a, ndarray) else a for a in args]
        driver_launch(handle, grid, block, shared_bytes, cupy.cuda.get_current_stream().ptr,
                      values)

    def table(self, values: np.ndarray):
        """Device copy of a small constant table, cached by content.

        Parameters
        ----------
        values : numpy.ndarray, 1-D, int64
            Table contents (a ``geo`` table or the finalize ``dims``).

        Returns
        -------
        cupy.ndarray
            A copy with ``values``' shape and dtype, kept for the backend's
            lifetime and shared by every call with the same contents; the
            upload has finished when it is returned. Do not write to it.
        """
        key = values.tobytes()
        table = self._tables.get(key)
        if table is None:
            table = self._cupy.asarray(values)
            # Cached tables are read later from whatever stream is current:
            # finish the upload once, here, instead of ordering every use.
            self._cupy.cuda.get_current_stream().synchronize()
            self._tables[key] = table
        return table

    def float32(self, n: int):
        """An uninitialised float32 work buffer from CuPy's memory pool.

        Parameters
        ----------
        n : int
            Elements needed.

        Returns
        -------
        cupy.ndarray, shape (max(n, 1),), float32
            On the current device; at least one element, so that it always
            has a valid pointer.
        """
        return self._cupy.empty(max(n, 1), dtype=self._cupy.float32)


class SimulatorBackend(_ArrayViews):
    """Runs the generated kernels in numba's CUDA simulator on NumPy arrays.

    Parameters
    ----------
    shared_limit : int, optional
        Dynamic shared memory per block to plan with, in bytes (default: an
        H100/H200's 227 KiB).
    max_slots : int, optional
        Global-scratch slots of a scratch launch (small, so tests exercise
        persistent blocks).
    """

    simulate = True

    def __init__(self, shared_limit: int = 227 * 1024, max_slots: int = 2):
        self.shared_limit = shared_limit
        self.max_slots = max_slots

    def kernel(self, spec):
        """The simulator kernel of ``spec``.

        Parameters
        ----------
        spec : PlaneSpec, TileSpec or FinalizeSpec
            The kernel variant.

        Returns
        -------
        numba.cuda dispatcher
            See :func:`wtconv_cuda.kernels.compiler.sim_kernel` (which raises
            `RuntimeError` unless ``NUMBA_ENABLE_CUDASIM=1``).
        """
        return compiler.sim_kernel(spec)

    def call(self, kernel, grid, block, args, shared_bytes):
        """Run ``kernel`` in the simulator on a 1-D grid (synchronous).

        Parameters
        ----------
        kernel : numba.cuda dispatcher
            From :meth:`kernel`.
        grid, block : int
            Blocks in the grid and threads per block.
        args : tuple
            The kernel's arguments; NumPy arrays are passed flattened to 1-D
            (the kernels index them as raw pointers).
        shared_bytes : int
            Dynamic shared memory per block.

        Returns
        -------
        None
            The kernel has run when the call returns.
        """
        flat = [a.reshape(-1) if isinstance(a, np.ndarray) else a for a in args]
        kernel[grid, block, 0, shared_bytes](*flat)

    def table(self, values: np.ndarray):
        """An int64 copy of a small constant table.

        Parameters
        ----------
        values : numpy.ndarray, 1-D
            Table contents.

        Returns
        -------
        numpy.ndarray, values' shape, int64
            A fresh copy for each call.
        """
        return np.array(values, dtype=np.int64)

    def float32(self, n: int):
        """A float32 work buffer filled with NaN (reads of unwritten elements show up).

        Parameters
        ----------
        n : int
            Elements needed.

        Returns
        -------
        numpy.ndarray, shape (max(n, 1),), float32
            At least one element, like the GPU backend's buffers.
        """
        return np.full(max(n, 1), np.nan, dtype=np.float32)


def work_buffers(problem: Problem, backward: bool, shared_limit: int, max_slots: int,
                 tuning: Tuning = Tuning()) -> tuple[int, ...]:
    """float32 sizes that :func:`run_forward` / :func:`run_backward` request.

    In request order from ``backend.float32``: the weight-gradient partials
    of the work units (backward only), then the global scratch (planes too large for
    shared memory only). Bindings that allocate through their framework use
    this to size buffers ahead of the call.

    Parameters
    ----------
    problem : Problem
        The layer call.
    backward : bool
        Size the backward pass's buffers instead of the forward one's.
    shared_limit, max_slots : int
        The backend's limits, as passed to :func:`plan_plane`.
    tuning : Tuning, optional
        The overrides the call will use.

    Returns
    -------
    tuple of int
        Element counts: ``(units * ntaps, [scratch])`` backward (see
        :attr:`Launch.partial_floats`; no partials when the plan fuses the
        finalize), ``(tiles * ntaps,)`` for a tiled backward
        (:attr:`TileLaunch.partial_floats`),
        ``([scratch])`` forward (an empty tuple when no scratch is needed or
        the forward runs on tiles); a ``weights_only`` plane backward first
        asks for the flipped filters (:func:`flipped_filter_floats`) and the
        buffers of the forward that computes ``dx``, once per batch chunk
        (:func:`dx_forward_plan`; a recorded program that forks, `TWO_STREAMS`,
        asks for the partials first); a split pass
        (:func:`plan_split`) asks for its two coarse work buffers first (pooled arrays, then the rest),
        then for the coarse problem's buffers (and, backward, then for the
        tiles' partials); a split backward in batch chunks
        (:func:`split_batch_chunks`) first for the chunks' partial sums and
        coarse gradients, then for each chunk's buffers as above.
    """
    if plan_registers(problem, shared_limit, tuning, backward) is not None:
        return ()
    if not backward and plan_lanes_forward(problem, shared_limit, tuning) is not None:
        return ()
    split = plan_split(problem, shared_limit, tuning, backward)
    if split is not None:
        chunks = (split_batch_chunks(problem, shared_limit, max_slots, tuning) if backward
                  else ())
        sizes = (len(chunks) * _chunk_sum_floats(split),) if chunks else ()
        for plan in chunks or (split,):
            pooled = () if plan.in_place else (plan.layout.pooled_floats,)
            sizes += pooled + (plan.layout.floats,) + work_buffers(
                plan.coarse, backward, shared_limit, max_slots)
            if backward:
                sizes += (plan.tiles.partial_floats,)
        return sizes
    tiled = plan_tiles(problem, shared_limit, tuning, backward)
    if tiled is not None:
        return (tiled.partial_floats,) if backward else ()
    launch = plan_plane(problem, backward, shared_limit, max_slots, tuning)
    sizes = []
    if launch.spec.weights_only:  # dx first: the flipped filters, each chunk's buffers
        sizes += [flipped_filter_floats(problem)]
        dx = backward_dx_plan(problem, shared_limit, max_slots, tuning)
        for count in dx.batches:
            sizes += work_buffers(_dx_problem(problem)._replace(batch=count), False,
                                  shared_limit, max_slots, dx.tuning)
        lanes = plan_lanes(problem, shared_limit, max_slots, tuning)
        if lanes is not None:
            return tuple(sizes) + (lanes.partial_floats,)
    if backward and not launch.spec.fused_finalize:
        sizes.append(launch.partial_floats)
    if launch.scratch_floats:
        sizes.append(launch.scratch_floats)
    return tuple(sizes)


def clear_plan_caches() -> None:
    """Forget every cached plan of this module.

    Plans are cached by problem and tuning, not by the module-level rules
    they read (`SPLIT_SMALL_TILES` and the other constants): call this after
    changing one (an A/B of a rule, a test). Recorded launch programs hold
    plans too: clear those as well (``wtconv_cuda.gpu._program``).
    """
    for value in list(globals().values()):
        if hasattr(value, "cache_clear"):
            value.cache_clear()


def planned_specs(problem: Problem, backward: bool, shared_limit: int, max_slots: int,
                  tuning: Tuning = Tuning()) -> list:
    """The kernel specs :func:`run_forward` / :func:`run_backward` launch, in launch order.

    Parameters
    ----------
    problem : Problem
        The layer call.
    backward : bool
        The backward pass instead of the forward one.
    shared_limit, max_slots : int
        The backend's limits, as passed to :func:`plan_plane`.
    tuning : Tuning, optional
        The overrides the call will use.

    Returns
    -------
    list of kernel specs
        `CoarseSpec`, `TileSpec`, `PlaneSpec`, `FinalizeSpec`, `CoarseOutSpec`,
        `PartialSumSpec` and `FlipSpec` values. A ``weights_only`` plane
        backward lists ``wtconv_flip`` and the
        forward's specs first (they compute ``dx``; those of each batch size
        its chunks take, see :func:`dx_forward_plan`). A split pass lists
        ``wtconv_coarse_in``, the coarse problem's specs (planned with the
        default tuning; in batch chunks, for each chunk size), then the tiles
        (backward: then ``wtconv_partial_sum`` in batch chunks, the finalize
        and ``wtconv_coarse_out``).
    """
    registers = plan_registers(problem, shared_limit, tuning, backward)
    if registers is not None:
        return [registers.spec]
    lanes = None if backward else plan_lanes_forward(problem, shared_limit, tuning)
    if lanes is not None:
        return [lanes.spec]
    finalize = FinalizeSpec(problem.kernel_size, problem.storage, FINALIZE_THREADS)
    split = plan_split(problem, shared_limit, tuning, backward)
    if split is not None:
        chunks = (split_batch_chunks(problem, shared_limit, max_slots, tuning) if backward
                  else ())
        coarse = [s for q in dict.fromkeys(plan.coarse for plan in chunks or (split,))
                  for s in planned_specs(q, backward, shared_limit, max_slots)]
        specs = [split.coarse_in] + coarse + [split.tiles.spec]
        if chunks:
            specs.append(PartialSumSpec(FINALIZE_THREADS))
        return specs + [finalize, split.coarse_out] if backward else specs
    tiled = plan_tiles(problem, shared_limit, tuning, backward)
    if tiled is not None:
        return [tiled.spec, finalize] if backward else [tiled.spec]
    spec = plan_plane(problem, backward, shared_limit, max_slots, tuning).spec
    specs = [spec, finalize] if backward and not spec.fused_finalize else [spec]
    if spec.weights_only:  # the forward's specs of each batch size its chunks take
        dx = backward_dx_plan(problem, shared_limit, max_slots, tuning)
        forward = [s for count in dict.fromkeys(dx.batches)
                   for s in planned_specs(_dx_problem(problem)._replace(batch=count), False,
                                          shared_limit, max_slots, dx.tuning)]
        lanes = plan_lanes(problem, shared_limit, max_slots, tuning)
        if lanes is not None:
            specs = [lanes.spec, finalize]
        specs = [FlipSpec(problem.storage, problem.kernel_size)] + forward + specs
    return specs


def _int64s(*values):
    """Kernel scalar arguments as ``numpy.int64`` (8-byte parameters on every launch path)."""
    return tuple(np.int64(v) for v in values)


def run_forward(backend, problem: Problem, x, y, weights: Weights,
                tuning: Tuning = Tuning()) -> None:
    """Launch the fused forward: ``y = WTConv(x)``.

    One launch: the register kernel where :func:`plan_registers` takes the
    problem (tiny planes), the tiled kernel where :func:`plan_tiles` does,
    else the plane kernel. Where :func:`plan_split` splits it, three or more:
    ``wtconv_coarse_in``, the coarse levels' forward (itself planned by these
    rules), then the tiles.

    Parameters
    ----------
    backend : CupyBackend or SimulatorBackend
        Where to compile and launch.
    problem : Problem
        Sizes and options of the call (``B >= 1``).
    x : array, (B, C, H, W), storage dtype
        Layer input.
    y : array, (B, C, ceil(H/stride), ceil(W/stride)), storage dtype, written
        Layer output.
    weights : Weights
        Backend arrays of the published parameters, storage dtype.
    tuning : Tuning, optional
        Launch-shape overrides.

    Raises
    ------
    wtconv_cuda.kernels.compiler.CompileError
        The kernel variant could not be compiled or loaded (`CupyBackend`).
    RuntimeError
        `SimulatorBackend` without ``NUMBA_ENABLE_CUDASIM=1``.
    """
    registers = plan_registers(problem, backend.shared_limit, tuning)
    if registers is not None:
        _launch_registers(backend, registers, (x, y, *weights))
        return
    lanes = plan_lanes_forward(problem, backend.shared_limit, tuning)
    if lanes is not None:
        backend.call(backend.kernel(lanes.spec), lanes.grid, LANE_THREADS,
                     (x, y, *weights, *lanes.scalars), lanes.shared_bytes)
        return
    split = plan_split(problem, backend.shared_limit, tuning)
    if split is not None:
        _run_forward_split(backend, problem, x, y, weights, split)
        return
    tiled = plan_tiles(problem, backend.shared_limit, tuning)
    if tiled is not None:
        args = (x, y, *weights, *_int64s(problem.height, problem.width, problem.channels,
                                         int(problem.has_bias), tiled.tiles_x, tiled.ntiles))
        backend.call(backend.kernel(tiled.spec), tiled.grid, tiled.block, args,
                     tiled.shared_bytes)
        return
    launch = plan_plane(problem, False, backend.shared_limit, backend.max_slots, tuning)
    geo = backend.table(launch.geo)
    scratch = backend.float32(launch.scratch_floats) if launch.scratch_floats else geo
    args = (x, y, x, *weights, geo, scratch, geo, *launch.header)
    backend.call(backend.kernel(launch.spec), launch.grid, launch.block, args, launch.shared_bytes)
    if launch.scratch_floats:  # released once queued, as the split forward's buffers
        backend.release(scratch)


def _launch_registers(backend, launch: RegisterLaunch, arrays: tuple) -> None:
    """Launch the register kernel on ``arrays`` (its pointers), then the plan's scalars."""
    backend.call(backend.kernel(launch.spec), launch.grid, launch.block,
                 (*arrays, *launch.scalars), launch.shared_bytes)


def _coarse_weights(backend, buf, lay: CoarseLayout, problem: Problem,
                    levels: int) -> Weights:
    """Views of the coarse problem's float32 parameters in the split's work buffer
    ``buf`` (no bias: the zero scale stands in)."""
    C, K2 = problem.channels, problem.kernel_size ** 2
    scale = backend.view(buf, lay.base_scale, C)
    ww = lay.wavelet_weight
    return Weights(backend.view(buf, lay.base_weight, C * K2), scale, scale,
                   backend.view(buf, ww, levels * C * 4 * K2),
                   backend.view(buf, ww + levels * C * 4 * K2, levels * C * 4))


def _coarse_gradients(backend, buf, lay: CoarseLayout, problem: Problem, levels: int,
                      start: int) -> Weights:
    """Views of the coarse problem's float32 gradients, laid out as from ``lay.grads``
    (weight, bias (never written), scale, levels), from ``start`` in ``buf``."""
    C, K2 = problem.channels, problem.kernel_size ** 2
    ww = start + lay.grad_levels - lay.grads
    return Weights(backend.view(buf, start, C * K2), backend.view(buf, start + C * K2, C),
                   backend.view(buf, start + C * K2 + C, C),
                   backend.view(buf, ww, levels * C * 4 * K2),
                   backend.view(buf, ww + levels * C * 4 * K2, levels * C * 4))


def _launch_coarse_in(backend, split: SplitPlan, pooled: tuple, weights: Weights, pool,
                      keep) -> None:
    """Queue ``wtconv_coarse_in``: the pooled arrays into ``pool`` (a work buffer, or a
    view of one), the coarse parameters into ``keep`` from ``layout.base_weight``."""
    lay = split.layout
    params = backend.view(keep, lay.base_weight, lay.floats - lay.base_weight)
    backend.call(backend.kernel(split.coarse_in), split.grid, COARSE_THREADS,
                 (*pooled, weights.wavelet_weight, weights.wavelet_scale, pool, params,
                  *split.coarse_in_scalars), 0)


def _run_coarse_in(backend, problem: Problem, split: SplitPlan, pooled: tuple,
                   weights: Weights) -> tuple:
    """The split's two work buffers ``(pooled, keep)``, filled by ``wtconv_coarse_in``."""
    pool = backend.float32(split.layout.pooled_floats)
    keep = backend.float32(split.layout.floats)
    _launch_coarse_in(backend, split, pooled, weights, pool, keep)
    return pool, keep


def _run_forward_split(backend, problem: Problem, x, y, weights: Weights,
                       split: SplitPlan) -> None:
    """The forward of a split pass: pool, coarse levels, then the fine levels on tiles."""
    lay, q, tiled = split.layout, split.coarse, split.tiles
    # Exact views: the simulator copies each array argument in and back out, in order.
    # In place, ``out`` is the register kernel's input and then its output, so the
    # output's copy is the one that stays.
    if split.in_place:
        pool = keep = backend.float32(lay.floats)
        band = out = backend.view(keep, lay.out, lay.plane)
        _launch_coarse_in(backend, split, (x,), weights, band, keep)
    else:
        pool, keep = _run_coarse_in(backend, problem, split, (x,), weights)
        band = backend.view(pool, lay.pooled[0], lay.plane)
        out = backend.view(keep, lay.out, lay.plane)
    run_forward(backend, q, band, out,
                _coarse_weights(backend, keep, lay, problem, q.levels))
    if not split.in_place:
        backend.release(pool)
    args = (x, y, *weights, *_int64s(problem.height, problem.width, problem.channels,
                                     int(problem.has_bias), tiled.tiles_x, tiled.ntiles),
            out, *_int64s(q.height, q.width))
    backend.call(backend.kernel(tiled.spec), tiled.grid, tiled.block, args, tiled.shared_bytes)
    backend.release(keep)  # before a caller's next request (a batch-chunked dx forward)


def _run_backward_split(backend, problem: Problem, x, dy, dx, weights: Weights,
                        grads: Weights, split: SplitPlan, chunks: tuple) -> None:
    """The backward of a split pass: pool ``x`` and ``dy``, the coarse levels' backward,
    the fine levels on tiles, their finalize, then the coarse levels' gradients. The
    pooled arrays are released before the tiles' partials are allocated. In batch
    chunks (``chunks``, :func:`split_batch_chunks`) each chunk runs the first three
    steps on its entries, its partials summed per channel into a buffer kept to the
    end beside its coarse gradients, and its pooled pair, coarse buffer and partials
    released before the next chunk's are requested."""
    C = problem.channels
    if not chunks:
        keep, partial = _run_split_chunk(backend, problem, x, dy, dx, weights, split, None)
        _run_finalize(backend, problem, partial, weights, grads, split.tiles.finalize_dims,
                      split.tiles.ntaps)
        levels = backend.view(keep, split.layout.grad_levels, _coarse_level_floats(split))
        _run_coarse_out(backend, problem, split, levels, grads, 1, 0)
        return
    ntaps, per_chunk = split.tiles.ntaps, _chunk_sum_floats(split)
    slots = len(chunks)
    sums = backend.float32(slots * per_chunk)  # [partial sums: C x slots x ntaps | gradients]
    gradients = slots * C * ntaps  # chunk k's coarse gradients from gradients + k * gsize
    gsize = per_chunk - C * ntaps
    entry = C * problem.height * problem.width  # elements per batch entry
    start = 0
    for slot, plan in enumerate(chunks):
        count = plan.coarse.batch
        views = [backend.entries(a, start * entry, count * entry, problem.storage)
                 for a in (x, dy, dx)]
        keep, partial = _run_split_chunk(backend, problem._replace(batch=count), *views,
                                         weights, plan, (sums, gradients + slot * gsize))
        backend.call(backend.kernel(PartialSumSpec(FINALIZE_THREADS)), C, FINALIZE_THREADS,
                     (partial, backend.view(sums, 0, gradients),
                      *_int64s(ntaps, count * plan.tiles.ntiles, slot, slots)), 0)
        backend.release(partial)
        backend.release(keep)
        start += count
    dims = np.array([problem.batch, C, split.split, int(problem.has_bias), slots], dtype=np.int64)
    _run_finalize(backend, problem, backend.view(sums, 0, gradients), weights, grads, dims,
                  ntaps)
    level_start = split.layout.grad_levels - split.layout.grads
    _run_coarse_out(backend, problem, split,
                    backend.view(sums, gradients + level_start,
                                 (slots - 1) * gsize + _coarse_level_floats(split)),
                    grads, slots, gsize)
    backend.release(sums)


def _run_split_chunk(backend, problem: Problem, x, dy, dx, weights: Weights,
                     split: SplitPlan, gradients) -> tuple:
    """A split backward's first steps on ``problem``'s batch (a chunk's views of the
    layer arrays): ``wtconv_coarse_in``, the coarse problem's backward (its gradients
    into the coarse buffer, or at ``gradients = (buffer, offset)``), then the tiles,
    whose partials it returns beside the coarse buffer: ``(keep, partial)``."""
    lay, q, tiled = split.layout, split.coarse, split.tiles
    pool, keep = _run_coarse_in(backend, problem, split, (x, dy), weights)
    out = backend.view(keep, lay.out, lay.plane)
    buf, start = (keep, lay.grads) if gradients is None else gradients
    run_backward(backend, q, backend.view(pool, lay.pooled[0], lay.plane),
                 backend.view(pool, lay.pooled[1], lay.plane), out,
                 _coarse_weights(backend, keep, lay, problem, q.levels),
                 _coarse_gradients(backend, buf, lay, problem, q.levels, start))
    backend.release(pool)
    del pool
    partial = backend.float32(tiled.partial_floats)
    args = (dy, dx, x, *weights, partial,
            *_int64s(problem.height, problem.width, problem.channels, int(problem.has_bias),
                     tiled.tiles_x, tiled.ntiles, problem.batch),
            out, *_int64s(q.height, q.width))
    backend.call(backend.kernel(tiled.spec), tiled.grid, tiled.block, args, tiled.shared_bytes)
    return keep, partial


def _coarse_level_floats(split: SplitPlan) -> int:
    """The coarse levels' weight and scale gradients: elements from ``layout.grad_levels``."""
    C, K2, levels = split.coarse.channels, split.coarse.kernel_size ** 2, split.coarse.levels
    return levels * C * 4 * K2 + levels * C * 4


def _run_coarse_out(backend, problem: Problem, split: SplitPlan, levels, grads: Weights,
                    copies: int, stride: int) -> None:
    """``wtconv_coarse_out``: the coarse levels' gradients (``copies`` sets in
    ``levels``, ``stride`` apart, added) into the levels above the split of ``grads``."""
    C, K2, c = problem.channels, problem.kernel_size ** 2, split.split
    nweight, nscale = split.coarse.levels * C * 4 * K2, split.coarse.levels * C * 4
    backend.call(backend.kernel(split.coarse_out), -(-(nweight + nscale) // COARSE_THREADS),
                 COARSE_THREADS,
                 (levels, grads.wavelet_weight, grads.wavelet_scale,
                  *_int64s(nweight, nscale, c * C * 4 * K2, c * C * 4, copies, stride)), 0)


def run_backward(backend, problem: Problem, x, dy, dx, weights: Weights, grads: Weights,
                 tuning: Tuning = Tuning()) -> None:
    """Launch the fused backward: ``dx`` and every parameter gradient.

    One launch of the register kernel where :func:`plan_registers` takes the
    problem (tiny planes, ``B`` a multiple of 32). Otherwise two launches
    (plane kernel, then ``wtconv_finalize`` over the partials), or one when a
    block holds all of its channels' work units (``PlaneSpec.fused_finalize``,
    see :func:`plan_plane`); where the plane kernel runs as ``weights_only``
    (:func:`dx_from_forward`), ``wtconv_flip`` and the forward's launches on
    ``dy`` (writing ``dx``) come first, and a backend that records programs
    marks them to run on a side stream beside the weight gradients
    (:func:`runs_side_by_side`, :func:`backward_dx_plan`). Where
    :func:`plan_tiles` takes the backward, the tiled kernel and then
    ``wtconv_finalize`` over its per-tile partials. Where :func:`plan_split` splits it: ``wtconv_coarse_in``, the
    coarse problem's backward, the tiles, ``wtconv_finalize`` and
    ``wtconv_coarse_out``.

    Parameters
    ----------
    backend : CupyBackend or SimulatorBackend
        Where to compile and launch.
    problem : Problem
        Sizes and options of the call (``B >= 1``).
    x : array, (B, C, H, W), storage dtype
        Forward input.
    dy : array, (B, C, ceil(H/stride), ceil(W/stride)), storage dtype
        Gradient of the forward output.
    dx : array, (B, C, H, W), storage dtype, written
        Gradient of ``x``.
    weights : Weights
        Backend arrays of the published parameters, storage dtype.
    grads : Weights
        Arrays shaped like ``weights``, written (``base_bias`` only when the
        problem has a bias).
    tuning : Tuning, optional
        Launch-shape overrides.

    Raises
    ------
    wtconv_cuda.kernels.compiler.CompileError
        The plane or finalize variant could not be compiled or loaded
        (`CupyBackend`); when the finalize variant fails, the plane pass has
        already been queued.
    RuntimeError
        `SimulatorBackend` without ``NUMBA_ENABLE_CUDASIM=1``.
    """
    registers = plan_registers(problem, backend.shared_limit, tuning, True)
    if registers is not None:
        _launch_registers(backend, registers, (dy, dx, x, *weights, *grads))
        return
    split = plan_split(problem, backend.shared_limit, tuning, True)
    if split is not None:
        _run_backward_split(backend, problem, x, dy, dx, weights, grads, split,
                            split_batch_chunks(problem, backend.shared_limit,
                                               backend.max_slots, tuning))
        return
    tiled = plan_tiles(problem, backend.shared_limit, tuning, True)
    if tiled is not None:
        partial = backend.float32(tiled.partial_floats)
        args = (dy, dx, x, *weights, partial,
                *_int64s(problem.height, problem.width, problem.channels,
                         int(problem.has_bias), tiled.tiles_x, tiled.ntiles, problem.batch))
        backend.call(backend.kernel(tiled.spec), tiled.grid, tiled.block, args,
                     tiled.shared_bytes)
        _run_finalize(backend, problem, partial, weights, grads, tiled.finalize_dims,
                      tiled.ntaps)
        return
    launch = plan_plane(problem, True, backend.shared_limit, backend.max_slots, tuning)
    if not launch.spec.weights_only:
        _run_plane_backward(backend, problem, x, dy, dx, weights, grads, launch)
        return
    # dx from the forward kernels; the weight gradients on the weights-only plane
    # kernel, or on the lane kernel where its rule takes them
    dx_plan = dx_forward_plan(problem, backend.shared_limit, backend.max_slots, tuning)
    lanes = plan_lanes(problem, backend.shared_limit, backend.max_slots, tuning)
    side_by_side = False
    if TWO_STREAMS and hasattr(backend, "fork"):  # else one stream: the planner's dx plan
        dx_plan, side_by_side = _dx_beside_weights(problem, backend.shared_limit,
                                                   backend.max_slots, tuning, dx_plan,
                                                   launch, lanes)

    def weight_gradients():
        if lanes is None:
            _run_plane_backward(backend, problem, x, dy, dx, weights, grads, launch)
            return
        partial = backend.float32(lanes.partial_floats)
        backend.call(backend.kernel(lanes.spec), lanes.grid, LANE_THREADS,
                     (dy, x, partial, *lanes.scalars), lanes.shared_bytes)
        _run_finalize(backend, problem, partial, weights, grads, lanes.finalize_dims,
                      lanes.ntaps)

    _run_side_by_side(backend, side_by_side,
                      lambda: _run_dx_forward(backend, problem, dy, dx, weights, dx_plan),
                      weight_gradients)


def runs_side_by_side(problem: Problem, shared_limit: int, max_slots: int,
                      tuning: Tuning = Tuning()) -> bool:
    """Whether a backward's ``dx`` part runs beside its weight gradients.

    True where `TWO_STREAMS` is on, ``dx`` comes from the forward kernels and
    both parts' work buffers, live at once (the flipped filters and the
    largest ``dx`` chunk's forward buffers, :func:`dx_forward_floats`, beside
    the weight-gradient partials), take at most `SIDE_BY_SIDE_BUFFER_FRACTION`
    of the bytes of ``x``, with the ``dx`` plan of :func:`backward_dx_plan`.
    With the planner's own ``dx`` plan that fails at 28 x 28 (the split
    forward's float32 buffers do not shrink with the storage: forked anyway,
    an H100's 16-bit training step peaked at 1.12 times depthwise 7x7's), so
    there fp32 runs ``dx`` in two batch chunks; in 16 bits even two do not fit
    and the parts run one after the other.

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit, max_slots : int
        The backend's limits, as passed to :func:`plan_plane`.
    tuning : Tuning, optional
        Launch-shape overrides.

    Returns
    -------
    bool
    """
    return _backward_dx(problem, shared_limit, max_slots, tuning)[1]


def backward_dx_plan(problem: Problem, shared_limit: int, max_slots: int,
                     tuning: Tuning = Tuning()) -> DxForward | None:
    """The forward runs that compute a plane backward's ``dx`` in a recorded program.

    :func:`dx_forward_plan`'s (which the planner's direct path, on one
    stream, runs), except where that plan's buffers and the
    weight partials do not fit together (:func:`runs_side_by_side`) and
    the plan that leaves room for the partials (within
    `SIDE_BY_SIDE_BUFFER_FRACTION`) runs the same forward in at most
    `SIDE_BY_SIDE_MAX_CHUNK_FACTOR` times the chunks: then that one, beside the
    weight gradients. At 64 x 192 x 28 x 28 fp32 on an H100 two chunks side by
    side took 0.307 ms against 0.319 for one chunk on one stream and 0.310 for
    one chunk side by side, with 1.3 MB less memory (``benchmarks/streams_bench.py``).

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit, max_slots : int
        The backend's limits, as passed to :func:`plan_plane`.
    tuning : Tuning, optional
        Launch-shape overrides (``dx_batch`` set: no other chunks are tried).

    Returns
    -------
    DxForward or None
        None when the backward computes ``dx`` in the plane kernel.
    """
    return _backward_dx(problem, shared_limit, max_slots, tuning)[0]


def _backward_dx(problem: Problem, shared_limit: int, max_slots: int,
                 tuning: Tuning) -> tuple[DxForward | None, bool]:
    """``(backward_dx_plan, runs_side_by_side)`` of a call (not cached: it reads
    `TWO_STREAMS`, and the plans it asks for are)."""
    plan = dx_forward_plan(problem, shared_limit, max_slots, tuning)
    if (plan is None or not TWO_STREAMS
            or plan_registers(problem, shared_limit, tuning, True) is not None
            or plan_split(problem, shared_limit, tuning, True) is not None
            or plan_tiles(problem, shared_limit, tuning, True) is not None):
        return plan, False
    launch = plan_plane(problem, True, shared_limit, max_slots, tuning)
    if not launch.spec.weights_only:
        return plan, False
    return _dx_beside_weights(problem, shared_limit, max_slots, tuning, plan, launch,
                              plan_lanes(problem, shared_limit, max_slots, tuning))


def _dx_beside_weights(problem: Problem, shared_limit: int, max_slots: int, tuning: Tuning,
                       plan: DxForward, launch: Launch,
                       lanes: LaneLaunch | None) -> tuple[DxForward, bool]:
    """``(dx plan, side by side)`` of a ``weights_only`` backward whose planner's ``dx``
    plan is ``plan`` and whose weight gradients run ``launch``, or ``lanes`` if given."""
    if lanes is not None:
        weight_floats = lanes.partial_floats
    else:
        weight_floats = launch.scratch_floats + (
            0 if launch.spec.fused_finalize else launch.partial_floats)
    budget = SIDE_BY_SIDE_BUFFER_FRACTION * _x_bytes(problem)

    def fits(dx_plan):
        return 4 * (dx_forward_floats(problem, dx_plan.batches, shared_limit, max_slots,
                                      dx_plan.tuning) + weight_floats) <= budget

    if fits(plan):
        return plan, True
    if not tuning.dx_batch:
        roomy = dx_forward_plan(problem, shared_limit, max_slots, tuning, weight_floats,
                                SIDE_BY_SIDE_BUFFER_FRACTION)
        if (roomy is not None and roomy.tuning == plan.tuning and fits(roomy)
                and len(roomy.batches) <= SIDE_BY_SIDE_MAX_CHUNK_FACTOR * len(plan.batches)):
            return roomy, True
    return plan, False


def _run_side_by_side(backend, side_by_side: bool, side_part: Callable,
                      main_part: Callable) -> None:
    """Issue two independent parts of a call, ``side_part`` first.

    Where ``side_by_side`` (:func:`runs_side_by_side`) the backend, one with
    ``fork`` (:class:`~wtconv_cuda.kernels.program._Recorder`), is told where
    they start and end, so that a recorded program runs ``side_part`` on a
    side stream beside ``main_part``; otherwise they go one after the other on
    the backend's stream."""
    if not side_by_side:
        side_part()
        main_part()
        return
    backend.fork()
    side_part()
    backend.resume()
    main_part()
    backend.join()


def _run_plane_backward(backend, problem: Problem, x, dy, dx, weights: Weights,
                        grads: Weights, launch: Launch) -> None:
    """The plane kernel's backward launch (``dx`` too unless ``weights_only``), then
    ``wtconv_finalize`` unless the kernel writes the gradients itself."""
    geo = backend.table(launch.geo)
    fused = launch.spec.fused_finalize  # the plane kernel writes the gradients itself
    partial = geo if fused else backend.float32(launch.partial_floats)
    scratch = backend.float32(launch.scratch_floats) if launch.scratch_floats else geo
    args = (dy, dx, x, *weights, partial, scratch, geo, *(grads if fused else ()),
            *launch.header)
    backend.call(backend.kernel(launch.spec), launch.grid, launch.block, args, launch.shared_bytes)
    if not fused:
        _run_finalize(backend, problem, partial, weights, grads, launch.finalize_dims,
                      launch.ntaps)


def dx_from_forward(problem: Problem, shared_limit: int, max_slots: int,
                    tuning: Tuning = Tuning()) -> bool:
    """Whether a plane backward computes ``dx`` with the forward kernels.

    For stride 1, ``dx`` is the forward on ``dy`` with the filters flipped
    and no bias (:mod:`wtconv_cuda.kernels.flip`); the plane kernel then
    computes the weight gradients alone (``PlaneSpec.weights_only``). On an
    H200 at K 5, fp32, that took the ConvNeXt-T stages' backward from 1.028 /
    0.594 / 0.424 ms to 0.955 / 0.563 / 0.405 ms (56 / 28 / 14 pixels). It
    costs a second read of ``dy``, the flip launch, and the forward's work
    buffers while ``dx`` is computed, which the forward bounds by running in
    batch chunks (:func:`dx_forward_plan`).

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit, max_slots : int
        The backend's limits, as passed to :func:`plan_plane`.
    tuning : Tuning, optional
        ``tuning.dx_forward`` True or False decides (True only at stride 1);
        None takes the forward kernels at stride 1 when ``x`` has at least
        `DX_FORWARD_MIN_ELEMENTS` elements and the forward's work buffers,
        in at most `DX_FORWARD_MAX_CHUNKS` batch chunks, take at most
        `DX_FORWARD_BUFFER_FRACTION` of its bytes.

    Returns
    -------
    bool
    """
    return dx_forward_plan(problem, shared_limit, max_slots, tuning) is not None


#: The forward of a ``dx`` chunk without a split: no work buffers (the plane
#: kernel, or whole tiles where their rule takes the chunk).
DX_NO_SPLIT = Tuning(split=0)
#: The forward of ``dx`` with the coarse levels in the tile's block wherever the
#: small-plane rule has them, however large the problem: no work buffers.
DX_INNER = Tuning(inner=True)


class DxForward(NamedTuple):
    """How the forward kernels compute a plane backward's ``dx`` (:func:`dx_forward_plan`).

    Attributes
    ----------
    batches : tuple of int
        Batch entries of each forward run, in order, summing to ``B``.
    tuning : Tuning
        The runs' launch-shape overrides: ``Tuning()`` (the planner's forward
        for the run's batch size), `DX_INNER` or `DX_NO_SPLIT`.
    """

    batches: tuple[int, ...]
    tuning: Tuning


@lru_cache(maxsize=1024)
def dx_forward_plan(problem: Problem, shared_limit: int, max_slots: int,
                    tuning: Tuning = Tuning(), reserve_floats: int = 0,
                    fraction: float | None = None) -> DxForward | None:
    """The forward runs that compute a plane backward's ``dx``, or None.

    The runs go one after another on ``dy``'s batch entries in order, each
    releasing its work buffers before the next asks for them, so the memory
    they hold at once is one run's buffers and the flipped filters. That may
    be at most `DX_FORWARD_BUFFER_FRACTION` of the bytes of ``x``. The batch
    splits into 1, 2, 4, ..., `DX_FORWARD_MAX_CHUNKS` near-equal chunks
    (larger ones first), and the plan is the first that fits of:

    1. the whole batch on the planner's forward;
    2. the fewest chunks on the planner's forward for their batch size, where
       that forward splits (:func:`plan_split`: faster than the plane kernel
       wherever the planner takes it, but it holds float32 work buffers);
    3. the whole batch with the coarse levels in the tiles' blocks (`DX_INNER`),
       where the small-plane rule has them;
    4. the fewest chunks on the forward without a split (`DX_NO_SPLIT`).

    So a split too large for the budget as a whole runs as smaller splits;
    where no chunk large enough to split fits, the inner levels run the whole
    batch (64 x 384 x 14 x 14, fp32 on an H200: 100 us, against about 145 for
    the plane kernel), else the plane kernel runs on as few chunks as fit (a
    small chunk costs it more per pixel).

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit, max_slots : int
        The backend's limits, as passed to :func:`plan_plane`.
    tuning : Tuning, optional
        ``tuning.dx_forward`` True or False decides (True only at stride 1);
        None takes the forward kernels at stride 1 when ``x`` has at least
        `DX_FORWARD_MIN_ELEMENTS` elements and some plan fits. True where
        none fits runs the whole batch on the planner's forward.
        ``dx_batch`` fixes the entries per chunk (the last takes the rest).
    reserve_floats : int, optional
        float32 elements of other work buffers live beside the runs' (the
        weight partials, where the two run side by side): the budget shrinks
        by their bytes.
    fraction : float, optional
        The budget as a fraction of the bytes of ``x`` instead of
        `DX_FORWARD_BUFFER_FRACTION` (`SIDE_BY_SIDE_BUFFER_FRACTION` for a
        plan that runs beside the weight gradients).

    Returns
    -------
    DxForward or None
        None when the backward computes ``dx`` in the plane kernel.
    """
    B = problem.batch
    if problem.stride != 1 or tuning.dx_forward is False or B < 1:
        return None
    elements = B * problem.channels * problem.height * problem.width
    if not tuning.dx_forward and elements < DX_FORWARD_MIN_ELEMENTS:
        return None
    if tuning.dx_batch:
        step = min(tuning.dx_batch, B)
        candidates = [tuple(min(step, B - start) for start in range(0, B, step))]
    else:
        candidates = []
        chunks = 1
        while chunks <= min(B, DX_FORWARD_MAX_CHUNKS):
            q, r = divmod(B, chunks)
            candidates.append((q + 1,) * r + (q,) * (chunks - r))
            chunks *= 2
    if fraction is None:
        fraction = DX_FORWARD_BUFFER_FRACTION
    budget = fraction * elements * ITEMSIZE[problem.storage] - 4 * reserve_floats

    def fits(batches, forward):
        return 4 * dx_forward_floats(problem, batches, shared_limit, max_slots,
                                     forward) <= budget

    def splits(batches):
        return plan_split(_dx_problem(problem)._replace(batch=batches[0]),
                          shared_limit) is not None

    plans = [(candidates[0], Tuning())]
    plans += [(batches, Tuning()) for batches in candidates[1:] if splits(batches)]
    # (without inner levels DX_INNER plans as candidate 1 did, which did not fit)
    plans.append((candidates[0], DX_INNER))
    plans += [(batches, DX_NO_SPLIT) for batches in candidates]
    for batches, forward in plans:
        if fits(batches, forward):
            return DxForward(batches, forward)
    return DxForward(candidates[0], Tuning()) if tuning.dx_forward else None


def dx_forward_batches(problem: Problem, shared_limit: int, max_slots: int,
                       tuning: Tuning = Tuning()) -> tuple[int, ...]:
    """Batch sizes of the forward runs that compute a plane backward's ``dx``.

    Parameters
    ----------
    problem : Problem
        The layer call.
    shared_limit, max_slots : int
        The backend's limits, as passed to :func:`plan_plane`.
    tuning : Tuning, optional
        As for :func:`dx_forward_plan`.

    Returns
    -------
    tuple of int
        :attr:`DxForward.batches` of :func:`backward_dx_plan`; empty when the
        backward computes ``dx`` in the plane kernel.
    """
    plan = backward_dx_plan(problem, shared_limit, max_slots, tuning)
    return () if plan is None else plan.batches


def dx_forward_floats(problem: Problem, batches: tuple, shared_limit: int,
                      max_slots: int, forward: Tuning = Tuning()) -> int:
    """float32 work elements held at once while ``dx`` runs in forward chunks.

    Parameters
    ----------
    problem : Problem
        The layer call (its backward).
    batches : tuple of int
        Batch entries of each forward run (see :func:`dx_forward_plan`).
    shared_limit, max_slots : int
        The backend's limits, as passed to :func:`plan_plane`.
    forward : Tuning, optional
        The forward runs' overrides (:attr:`DxForward.tuning`).

    Returns
    -------
    int
        The flipped filters (:func:`flipped_filter_floats`) plus the largest
        chunk's forward buffers (:func:`work_buffers`).
    """
    per_chunk = max(sum(work_buffers(_dx_problem(problem)._replace(batch=b), False,
                                     shared_limit, max_slots, forward)) for b in set(batches))
    return flipped_filter_floats(problem) + per_chunk


def _dx_problem(problem: Problem) -> Problem:
    """The forward call that computes a stride-1 backward's ``dx``: no bias."""
    return problem._replace(has_bias=False)


def flipped_filter_floats(problem: Problem) -> int:
    """float32 elements of the work buffer holding the flipped filters of ``problem``.

    Parameters
    ----------
    problem : Problem
        The layer call.

    Returns
    -------
    int
        The base filters ``(C, K, K)`` and then the level filters ``(L, C, 4,
        K, K)``, in the storage type, each rounded up to whole float32 words.
    """
    base, levels = _filter_counts(problem)
    return storage_words(base, problem.storage) + storage_words(levels, problem.storage)


def _filter_counts(problem: Problem) -> tuple[int, int]:
    C, K2 = problem.channels, problem.kernel_size ** 2
    return C * K2, problem.levels * C * 4 * K2


def _run_dx_forward(backend, problem: Problem, dy, dx, weights: Weights,
                    plan: DxForward) -> None:
    """``dx`` of a stride-1 backward: the forward on ``dy`` with the filters turned by
    180 degrees (``wtconv_flip``), the same scales and no bias (see
    :mod:`wtconv_cuda.kernels.flip`), in the batch chunks and with the launch shapes of
    ``plan`` (:func:`dx_forward_plan`). Its work buffers are released on return."""
    n0, nw = _filter_counts(problem)
    buf = backend.float32(flipped_filter_floats(problem))
    base_words = storage_words(n0, problem.storage)
    f0 = backend.typed_view(buf, 0, n0, problem.storage)
    fw = backend.typed_view(buf, base_words, nw, problem.storage)
    backend.call(backend.kernel(FlipSpec(problem.storage, problem.kernel_size)),
                 min(-(-(n0 + nw) // FLIP_THREADS), 1024), FLIP_THREADS,
                 (weights.base_weight, weights.wavelet_weight, f0, fw, *_int64s(n0, nw)), 0)
    flipped = Weights(f0, weights.base_scale, weights.base_scale, fw, weights.wavelet_scale)
    entry = problem.channels * problem.height * problem.width  # elements per batch entry
    start = 0
    for count in plan.batches:
        run_forward(backend, _dx_problem(problem)._replace(batch=count),
                    backend.entries(dy, start * entry, count * entry, problem.storage),
                    backend.entries(dx, start * entry, count * entry, problem.storage),
                    flipped, plan.tuning)
        start += count
    backend.release(buf)


def _run_finalize(backend, problem: Problem, partial, weights: Weights, grads: Weights,
                  dims: np.ndarray, ntaps: int) -> None:
    """Launch ``wtconv_finalize``: one block per channel adds its partials into ``grads``."""
    finalize = backend.kernel(FinalizeSpec(problem.kernel_size, problem.storage, FINALIZE_THREADS))
    backend.call(finalize, problem.channels, FINALIZE_THREADS,
                 (partial, *weights, *grads, backend.table(dims)), 4 * ntaps)
