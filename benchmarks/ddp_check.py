"""DistributedDataParallel check: WTConvNeXt-T gradients on N processes equal one process.

One process per GPU (``torch.multiprocessing.spawn``; NCCL on CUDA, gloo on
the CPU with ``--cpu``). Every rank builds the same network from the same
seed (WTConvNeXt-T on :class:`wtconv_cuda.bindings.torch.WTConv2d`, or
``--tiny`` for the small stand-in, or ``--impl materialising``), wraps it in
``DistributedDataParallel``, takes its slice of one fixed global batch, and
runs forward, mean cross-entropy over its local batch, backward (DDP
all-reduces and averages the gradients) and one SGD step (lr 0.05, momentum
0.9). Rank 0 also runs the same on an identical copy of the network in one
process on the concatenated batch, and compares:

- every parameter gradient: ``max|g_ddp - g_ref|`` and the normwise relative
  difference ``max|g_ddp - g_ref| / max|g_ref|`` per parameter;
- the parameters after the SGD step, the same way;
- the mean of the ranks' local losses against the global loss;
- the gradients of all ranks against rank 0's (must be identical).

Because DDP averages, the mean over each equal-sized local batch averaged
over the ranks equals the mean over the global batch: the two gradients
differ only in the order of floating-point sums (per-rank partial sums over
half the batch, the all-reduce, the division by the world size). Pass when
the largest normwise relative gradient difference is below ``--tolerance``
(default 1e-4 in float32, 1e-10 in float64). Justification: each float32
reduction of length n has a relative error of about ``n * 2^-24`` in the
worst case and ``sqrt(n) * 2^-24`` typically; the weight-gradient sums here
run over up to ``B * H * W ~ 5e4`` terms (about 1e-5 for the typical case),
and differences of this kind grow by at most a small factor through the
network's backward, whereas an actual error (a missing rank, a wrong averaging
factor, unsynchronised weights) shows as a relative difference of order 1.
TF32 is turned off and cuDNN made deterministic, as TF32 alone would give
differences of about 1e-3.

``NCCL_NVLS_ENABLE=0`` (NVLink multicast off) is set before NCCL starts.

Exit status 0 on pass, 1 on fail, 2 when the requested devices are absent.

Examples
--------
On a 2-GPU H200 machine, from the repository root (about 1 minute: kernel
precompilation, NCCL start-up, a forward and backward at global batch 32,
224x224, 16 per GPU, and the single-process reference at 32 on GPU 0)::

    python benchmarks/ddp_check.py --json "$OUT/ddp_check.json"

On a CPU (two gloo processes, the tiny network, a few seconds)::

    python benchmarks/ddp_check.py --cpu --tiny --world-size 2 --json /tmp/ddp.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (str(ROOT), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import wtconvnext  # noqa: E402

__all__ = ["global_batch", "local_slice", "build_model", "compare_tensors", "main"]

#: SGD settings of the one step.
LR, MOMENTUM = 0.05, 0.9
DTYPES = {"float32": torch.float32, "float64": torch.float64}
DEFAULT_TOLERANCE = {"float32": 1e-4, "float64": 1e-10}


def free_port() -> int:
    """A TCP port on the loopback interface that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def global_batch(args):
    """The fixed global batch (identical on every rank).

    Parameters
    ----------
    args : argparse.Namespace
        ``global_batch``, ``image_size``, ``num_classes``, ``seed``, ``dtype``.

    Returns
    -------
    x : torch.Tensor, shape (global_batch, 3, image_size, image_size)
    y : torch.Tensor, shape (global_batch,)
    """
    return wtconvnext.synthetic_dataset(args.global_batch, args.image_size, args.num_classes,
                                        args.seed + 1, DTYPES[args.dtype])


def local_slice(tensor: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous share of the first dimension (which ``world`` divides)."""
    share = tensor.shape[0] // world
    return tensor[rank * share:(rank + 1) * share]


def build_model(args):
    """The network every rank (and the reference) starts from, seeded.

    Parameters
    ----------
    args : argparse.Namespace
        ``impl`` (``'wtconv'`` or ``'materialising'``), ``tiny``, ``arch``,
        ``num_classes``, ``seed``, ``dtype``.

    Returns
    -------
    torch.nn.Module
        On the CPU, in ``args.dtype``.
    """
    net = "wtconvnext" if args.impl == "wtconv" else "materialising"
    model, _ = wtconvnext.build_network(net, args.arch, args.tiny, args.num_classes,
                                        seed=args.seed)
    return model.to(DTYPES[args.dtype])


def forward_backward(model, x, y, scale: float = 1.0) -> torch.Tensor:
    """Mean cross-entropy over the batch (times ``scale``), then backward; returns the loss."""
    loss = F.cross_entropy(model(x), y) * scale
    loss.backward()
    return loss.detach()


def sgd_step(model) -> None:
    """One SGD step with the module's settings (fresh momentum: ``p -= lr * g``)."""
    torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM).step()


def compare_tensors(test: dict, reference: dict) -> dict:
    """Per-tensor differences of two name -> tensor dicts with the same keys.

    Parameters
    ----------
    test, reference : dict of str to torch.Tensor

    Returns
    -------
    dict
        ``per_tensor`` (name -> ``max_abs``, ``ref_max_abs``, ``rel``, where
        ``rel = max_abs / ref_max_abs``, or ``max_abs`` when the reference is
        all zeros), ``max_abs_diff``, ``max_rel_diff`` and ``worst`` (the name
        of the largest ``rel``).

    Raises
    ------
    ValueError
        The keys or shapes differ.
    """
    if set(test) != set(reference):
        raise ValueError(f"different tensors: {sorted(set(test) ^ set(reference))[:5]}")
    per, worst, worst_rel, worst_abs = {}, None, -1.0, 0.0
    for name, ref in reference.items():
        got = test[name]
        if got.shape != ref.shape:
            raise ValueError(f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}")
        diff = float((got.double() - ref.double()).abs().max()) if ref.numel() else 0.0
        scale = float(ref.double().abs().max()) if ref.numel() else 0.0
        rel = diff / scale if scale > 0 else diff
        per[name] = {"max_abs": diff, "ref_max_abs": scale, "rel": rel}
        worst_abs = max(worst_abs, diff)
        if rel > worst_rel:
            worst, worst_rel = name, rel
    return {"per_tensor": per, "max_abs_diff": worst_abs, "max_rel_diff": max(worst_rel, 0.0),
            "worst": worst}


def _grads(model) -> dict:
    """Name -> detached copy of each parameter's gradient (zeros where None)."""
    return {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
            for n, p in model.named_parameters()}


def _params(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _flat(tensors: dict) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors.values()])


def _setup(rank: int, world: int, args) -> torch.device:
    """Join the process group; returns this rank's device."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # before NCCL starts (also set by the parent)
    if args.cpu:
        device, backend = torch.device("cpu"), "gloo"
    else:
        torch.cuda.set_device(rank)
        device, backend = torch.device("cuda", rank), "nccl"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=180))
    return device


def _ddp_step(model, x, y, rank, world, device, fault: bool = False):
    """DDP forward/backward/step on this rank's slice; returns (loss, grads, params, ranks).

    ``fault`` scales the loss of the last rank by 1.5 (a deliberate error the
    check must catch; for tests).
    """
    ddp = DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None)
    scale = 1.5 if fault and rank == world - 1 else 1.0
    loss = forward_backward(ddp, local_slice(x, rank, world).to(device),
                            local_slice(y, rank, world).to(device), scale)
    grads = _grads(model)
    flat = _flat(grads)
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    cross_rank = max(float((g - gathered[0]).abs().max()) for g in gathered)
    mean_loss = loss.clone()
    dist.all_reduce(mean_loss)
    sgd_step(model)
    return float(mean_loss) / world, grads, _params(model), cross_rank


def _reference_step(model, x, y, device):
    """Single-process forward/backward/step on the whole batch; returns (loss, grads, params)."""
    loss = forward_backward(model, x.to(device), y.to(device))
    grads = _grads(model)
    sgd_step(model)
    return float(loss), grads, _params(model)


def worker(rank: int, world: int, args, result_path: str) -> None:
    """One rank: the DDP step; rank 0 also the reference and the report (JSON to result_path)."""
    device = _setup(rank, world, args)
    wtconvnext.exact_numerics()
    model = build_model(args).to(device)
    reference = copy.deepcopy(model) if rank == 0 else None
    x, y = global_batch(args)
    start = time.perf_counter()
    ddp_loss, grads, params, cross_rank = _ddp_step(model, x, y, rank, world, device,
                                                    args.inject_fault)
    ddp_s = time.perf_counter() - start
    if rank == 0:
        ref_loss, ref_grads, ref_params = _reference_step(reference, x, y, device)
        report = {"ddp_loss": ddp_loss, "reference_loss": ref_loss,
                  "loss_rel_diff": abs(ddp_loss - ref_loss) / max(abs(ref_loss), 1e-30),
                  "cross_rank_max_abs_diff": cross_rank, "ddp_step_s": ddp_s,
                  "gradients": compare_tensors(grads, ref_grads),
                  "params_after_step": compare_tensors(params, ref_params),
                  "numerics": wtconvnext.numerics_settings(), "device": str(device),
                  "device_name": (torch.cuda.get_device_name(device)
                                  if device.type == "cuda" else "cpu")}
        Path(result_path).write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def verdict(report: dict, tolerance: float) -> dict:
    """Pass/fail of a rank-0 report.

    Parameters
    ----------
    report : dict
        As written by :func:`worker`.
    tolerance : float
        Bound on the normwise relative gradient difference.

    Returns
    -------
    dict
        ``passed`` and the individual ``checks``: gradients within
        ``tolerance``, parameters after the step within ``tolerance``, the
        loss within ``tolerance`` and identical gradients on every rank.
    """
    checks = {
        "gradients": report["gradients"]["max_rel_diff"] < tolerance,
        "params_after_step": report["params_after_step"]["max_rel_diff"] < tolerance,
        "loss": report["loss_rel_diff"] < tolerance,
        "ranks_identical": report["cross_rank_max_abs_diff"] == 0.0,
    }
    return {"passed": all(checks.values()), "checks": checks}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="DDP gradients of WTConvNeXt-T against a single-process step on the "
                    "concatenated batch.")
    parser.add_argument("--cpu", action="store_true", help="gloo on the CPU instead of NCCL")
    parser.add_argument("--world-size", type=int, default=None,
                        help="processes (default: visible GPUs; 2 with --cpu)")
    parser.add_argument("--tiny", action="store_true", help="the tiny stand-in network")
    parser.add_argument("--arch", choices=("auto", "timm", "builtin"), default="auto")
    parser.add_argument("--impl", choices=("wtconv", "materialising"), default="wtconv",
                        help="WTConv layer: the fused kernels (default) or materialising")
    parser.add_argument("--global-batch", type=int, default=None,
                        help="default 32 (tiny: 4); divisible by the world size")
    parser.add_argument("--image-size", type=int, default=None,
                        help="default 224 (tiny: 32)")
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                        help="float64 only with --cpu")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="normwise relative bound (default 1e-4 float32, 1e-10 float64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--inject-fault", action="store_true",
                        help="testing: scale the last rank's loss by 1.5, so the check must "
                             "fail")
    parser.add_argument("--json", default=None,
                        help="output JSON (default benchmarks/results/ddp_check-<device>-"
                             "<date>.json on GPUs, none on the CPU)")
    return parser


def _resolve(args) -> str | None:
    """Fill defaults; returns an error message when the run is impossible."""
    if not args.cpu and not torch.cuda.is_available():
        return "no CUDA device is visible (use --cpu for the gloo check)"
    if args.dtype == "float64" and not args.cpu:
        return "float64 needs --cpu (the kernels run float32, float16 and bfloat16)"
    if args.world_size is None:
        args.world_size = 2 if args.cpu else torch.cuda.device_count()
    if not args.cpu and args.world_size > torch.cuda.device_count():
        return f"--world-size {args.world_size} but {torch.cuda.device_count()} GPUs visible"
    args.global_batch = args.global_batch or (4 if args.tiny else 32)
    args.image_size = args.image_size or (32 if args.tiny else 224)
    if args.tiny and args.num_classes == 1000:
        args.num_classes = 10
    if args.global_batch % args.world_size:
        return f"--global-batch {args.global_batch} is not divisible by {args.world_size}"
    if args.tolerance is None:
        args.tolerance = DEFAULT_TOLERANCE[args.dtype]
    return None


def _json_path(args) -> Path | None:
    if args.json:
        return Path(args.json)
    if args.cpu:
        return None
    name = wtconvnext.device_slug(torch.cuda.get_device_name(0))
    return HERE / "results" / f"ddp_check-{name}-{datetime.date.today().isoformat()}.json"


def main(argv=None) -> int:
    """Command-line entry point; returns the exit status (0 pass, 1 fail, 2 impossible)."""
    args = _parser().parse_args(argv)
    problem = _resolve(args)
    if problem:
        print(f"ddp_check: {problem}", file=sys.stderr, flush=True)
        return 2
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    args.port = free_port()
    if args.world_size < 2:
        print("ddp_check: one process only: the check is trivial", flush=True)
    if not args.cpu and args.impl == "wtconv":
        print("precompile:", wtconvnext.precompile_kernels(args.image_size), flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "rank0.json")
        mp.spawn(worker, args=(args.world_size, args, result_path), nprocs=args.world_size,
                 join=True)
        report = json.loads(Path(result_path).read_text())
    report.update(verdict(report, args.tolerance))
    report["settings"] = {k: v for k, v in vars(args).items() if k != "json"}
    report["wall_s"] = time.perf_counter() - start
    path = _json_path(args)
    if path is not None:
        wtconvnext.write_json(path, report)
    grads = report["gradients"]
    print(f"ddp_check {'PASS' if report['passed'] else 'FAIL'}: {args.world_size} processes "
          f"({'gloo, CPU' if args.cpu else 'NCCL'}), global batch {args.global_batch} at "
          f"{args.image_size}x{args.image_size}, {args.dtype}; gradients max abs diff "
          f"{grads['max_abs_diff']:.2e}, max normwise rel diff {grads['max_rel_diff']:.2e} "
          f"({grads['worst']}; tolerance {args.tolerance:.0e}); params after SGD step "
          f"{report['params_after_step']['max_rel_diff']:.2e}; loss rel diff "
          f"{report['loss_rel_diff']:.2e}; ranks identical: "
          f"{report['checks']['ranks_identical']}; {report['wall_s']:.1f} s"
          + (f"; wrote {path}" if path else ""), flush=True)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
