"""Grid dependency control (Hopper's programmatic dependent launch) for generated kernels.

A kernel launched with programmatic stream serialization allowed (``cuLaunchKernelEx``
with ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``) may be scheduled while
the kernel ahead of it on the stream still runs:

- ``griddepcontrol.wait`` blocks the thread until every prerequisite grid has
  finished and its memory operations are visible (:func:`wait_for_prerequisite_grids`);
- ``griddepcontrol.launch_dependents`` lets the grid's dependents be scheduled once
  every block of the grid has issued it or exited (:func:`launch_dependent_grids`).

Without that launch attribute both do nothing. Work before the wait may read only
what no kernel still in flight writes: a kernel that issues the trigger after its
own wait keeps every grid two or more launches back finished before its dependents
start (see ``TileSpec.late_coarse``). Both need ``sm_90`` or later.

Generated sources call the two names; :func:`namespace` gives ``codegen.build``
numba intrinsics that emit the instructions as inline PTX (with a memory clobber,
so the compiler moves no memory access across them), or no-ops under the CUDA
simulator.
"""

from __future__ import annotations

#: The names generated sources call.
WAIT = "wait_for_prerequisite_grids"
TRIGGER = "launch_dependent_grids"


def _inline_ptx(instruction: str):
    """A numba intrinsic taking no arguments that emits ``instruction`` as inline PTX."""
    from llvmlite import ir
    from numba import types
    from numba.core.extending import intrinsic

    @intrinsic
    def emit(typingctx):
        def lower(context, builder, signature, args):
            builder.asm(ir.FunctionType(ir.VoidType(), []), instruction, "~{memory}", [],
                        side_effect=True)
            return context.get_dummy_value()
        return types.none(), lower

    return emit


def _nothing():
    """The simulator's stand-in: a kernel launched by the simulator has no prerequisite
    grid in flight."""


_intrinsics: dict = {}


def namespace(source: str, simulator: bool) -> dict:
    """The names of this module that ``source`` calls, for ``codegen.build``'s namespace.

    Parameters
    ----------
    source : str
        Generated kernel source.
    simulator : bool
        Build for the CUDA simulator (no-ops) instead of numba intrinsics.

    Returns
    -------
    dict
        ``{name: callable}`` for :data:`WAIT` and :data:`TRIGGER` where ``source``
        mentions them (empty otherwise).
    """
    out = {}
    for name, instruction in ((WAIT, "griddepcontrol.wait;"),
                              (TRIGGER, "griddepcontrol.launch_dependents;")):
        if name in source:
            if simulator:
                out[name] = _nothing
            else:
                if name not in _intrinsics:
                    _intrinsics[name] = _inline_ptx(instruction)
                out[name] = _intrinsics[name]
    return out
