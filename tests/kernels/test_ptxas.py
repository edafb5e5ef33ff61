"""ptxas's register and local-memory report through nvJitLink (no GPU needed)."""

import pytest

from wtconv_cuda.kernels.ptxas import PtxasUsage, parse_report, ptxas_usage

#: A kernel that indexes a 64-byte local array with a runtime index: ptxas must keep it
#: in a stack frame.
LOCAL_ARRAY_PTX = """
.version 8.0
.target sm_90
.address_size 64

.visible .entry pick(.param .u64 p, .param .u32 i)
{
    .local .align 4 .b8 buf[64];
    .reg .b32 %r<3>;
    .reg .b64 %rd<6>;
    .reg .f32 %f<3>;
    ld.param.u64 %rd1, [p];
    ld.param.u32 %r1, [i];
    cvta.to.global.u64 %rd2, %rd1;
    ld.global.f32 %f1, [%rd2];
    mov.u64 %rd3, buf;
    and.b32 %r2, %r1, 15;
    mul.wide.u32 %rd4, %r2, 4;
    add.s64 %rd5, %rd3, %rd4;
    st.local.f32 [%rd5], %f1;
    ld.local.f32 %f2, [buf+4];
    st.global.f32 [%rd2+4], %f2;
    ret;
}
"""

#: The same kernel without the array.
REGISTER_ONLY_PTX = """
.version 8.0
.target sm_90
.address_size 64

.visible .entry twice(.param .u64 p)
{
    .reg .b64 %rd<3>;
    .reg .f32 %f<3>;
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd2, %rd1;
    ld.global.f32 %f1, [%rd2];
    add.f32 %f2, %f1, %f1;
    st.global.f32 [%rd2], %f2;
    ret;
}
"""


def test_parse_report_reads_frame_and_registers():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
           "ptxas         .     24 bytes stack frame, 16 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 128 registers, used 1 barriers\n")
    usage = parse_report(log)
    assert usage == PtxasUsage(128, 24, 16, 12)
    assert usage.local_bytes == 24


def test_parse_report_needs_exactly_one_entry():
    with pytest.raises(ValueError, match="one kernel entry"):
        parse_report("ptxas info    : 0 bytes gmem\n")


def test_ptxas_sees_a_local_array_and_its_absence():
    pytest.importorskip("cuda.bindings.nvjitlink")
    with_array = ptxas_usage(LOCAL_ARRAY_PTX)
    assert with_array.stack_bytes == 64 and with_array.local_bytes == 64
    assert with_array.registers > 0
    plain = ptxas_usage(REGISTER_ONLY_PTX)
    assert plain.local_bytes == 0 and plain.registers > 0


def test_ptxas_rejects_broken_ptx():
    pytest.importorskip("cuda.bindings.nvjitlink")
    with pytest.raises(RuntimeError, match="nvJitLink"):
        ptxas_usage(".version 8.0\n.target sm_90\n.address_size 64\nthis is not ptx\n")
