"""Draw the figures of the documentation (needs matplotlib).

The docs build calls :func:`main` when it starts (``docs/_ext/wtconv_docs.py``);
to look at the figures alone::

    python docs/figures/make_figures.py /tmp/figures

The subband pyramid is computed with :func:`wtconv_cuda.reference.analysis_chain`
on a synthetic image; the traffic model comes from ``docs/examples/io_model.py``
and the measured bytes from Nsight Compute on an H200 (``scripts/device_check.sh``).
"""

from __future__ import annotations

import io
import runpy
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np

DOCS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(DOCS.parent))

#: DRAM bytes measured with ``ncu`` at (64, 96, 56, 56), L = 5, K = 5, float32,
#: in multiples of the bytes of x: (kernel, read, write). The finalize kernel's
#: write counter was not part of the measurement.
MEASURED = {
    "forward": [("wtconv_plane", 1.004, 0.763)],
    "backward": [("wtconv_plane", 2.007, 0.974), ("wtconv_finalize", 0.171, 0.0)],
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "wtconv_cuda",
                         "font.size": 10, "axes.spines.top": False,
                         "axes.spines.right": False})
    return plt


def test_image(size: int = 128) -> np.ndarray:
    """A synthetic grey image with edges in every direction."""
    y, x = np.mgrid[0:size, 0:size] / size
    img = 0.2 + 0.6 * ((x - 0.32) ** 2 + (y - 0.34) ** 2 < 0.05)  # a disc
    # A square whose edges fall inside 2x2 blocks (Haar misses edges between blocks).
    img = np.where((x > 0.58) & (x < 0.91) & (y > 0.1) & (y < 0.44), 0.95, img)
    stripes = (np.sin(2 * np.pi * 9 * (x + y)) > 0) & (y > 0.62)  # diagonal stripes
    return np.where(stripes, 0.05, img) + 0.25 * (y > 0.62) * (x < 0.3)


def pyramid_layout(image: np.ndarray, levels: int):
    """Mallat layout of the subbands: (canvas, [(label, row, col, h, w)])."""
    from wtconv_cuda import reference

    subbands = reference.analysis_chain(image, levels)
    canvas = np.zeros(image.shape)
    boxes = []

    def normalise(band, detail):
        band = np.abs(band) if detail else band
        top = band.max() - (0 if detail else band.min())
        return (band - (0 if detail else band.min())) / (top if top > 0 else 1)

    for j, u in enumerate(subbands, start=1):
        h, w = u.shape[-2:]
        for k, (name, r, c) in enumerate([("LH", 0, w), ("HL", h, 0), ("HH", h, w)], start=1):
            canvas[r:r + h, c:c + w] = normalise(u[k], True) ** 0.5
            boxes.append((f"{name}$_{j}$", r, c, h, w))
    h, w = subbands[-1].shape[-2:]
    canvas[:h, :w] = normalise(subbands[-1][0], False)
    boxes.append((f"LL$_{levels}$", 0, 0, h, w))
    return canvas, boxes


def pyramid_figure(path: Path, levels: int = 3) -> None:
    """The input and its Haar subband pyramid (the wavelet path's inputs)."""
    plt = _pyplot()
    image = test_image()
    canvas, boxes = pyramid_layout(image, levels)
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.4, 4.3))
    left.imshow(image, cmap="gray", vmin=0, vmax=1.3, interpolation="nearest")
    left.set_title(f"x: one {image.shape[0]} x {image.shape[1]} plane")
    right.imshow(canvas, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    sizes = ", ".join(f"{-(-image.shape[0] // 2**j)}" for j in range(1, levels + 1))
    right.set_title(f"subbands, levels 1..{levels} ({sizes} px)")
    for label, r, c, h, w in boxes:
        right.add_patch(plt.Rectangle((c - 0.5, r - 0.5), w, h, fill=False, ec="#f0a020", lw=1))
        right.text(c + 1.5, r + 1.5, label, color="#f0a020", va="top", fontsize=8,
                   bbox=dict(fc="black", alpha=0.7, pad=0.5, lw=0))
    for ax in (left, right):
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def io_figure(path: Path) -> None:
    """Modelled and measured DRAM traffic per call, in multiples of x's bytes."""
    plt = _pyplot()
    with redirect_stdout(io.StringIO()):
        model = runpy.run_path(str(DOCS / "examples" / "io_model.py"))
    published, forward, backward = model["published"], model["forward"], model["backward"]
    measured = {key: (sum(r for _, r, _ in rows), sum(w for _, _, w in rows))
                for key, rows in MEASURED.items()}
    bars = [  # label, read, write (None: only the total is known)
        ("published layer, forward (model)", *published),
        ("I/O-aware fused design, forward (reported, L+2 kernels)", 8.0, None),
        ("wtconv_cuda forward (model: the floor)", *forward),
        ("wtconv_cuda forward (ncu, H200)", *measured["forward"]),
        ("wtconv_cuda backward (model: 3x + partials)", *backward),
        ("wtconv_cuda backward (ncu, H200)", *measured["backward"]),
    ]
    fig, ax = plt.subplots(figsize=(8.4, 3.6))
    for i, (label, read, write) in enumerate(bars):
        y = len(bars) - 1 - i
        if write is None:
            ax.barh(y, read, color="#b0b0b0", hatch="//", edgecolor="white")
            total = read
        else:
            ax.barh(y, read, color="#3b75af", label="read" if i == 0 else None)
            ax.barh(y, write, left=read, color="#ef8636", label="write" if i == 0 else None)
            total = read + write
        ax.text(total + 0.2, y, f"{total:.2f}x" if total < 5 else f"~{total:.0f}x", va="center")
    ax.set_yticks(range(len(bars)), [b[0] for b in reversed(bars)])
    ax.set_xlabel("DRAM bytes moved per call / bytes of x")
    ax.set_title("56 x 56 planes, L = 5, K = 5, float32", fontsize=10)
    ax.set_xlim(0, 25)
    ax.legend(loc="lower right", frameon=False)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def main(outdir) -> list[Path]:
    """Write every figure into ``outdir``; returns their paths.

    A file whose content would not change is left untouched, so that an
    incremental docs build does not re-read the pages that show it.
    """
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in (("pyramid.svg", pyramid_figure), ("io_traffic.svg", io_figure)):
        target = outdir / name
        scratch = outdir / f".{name}.new"
        draw(scratch)
        if target.exists() and target.read_bytes() == scratch.read_bytes():
            scratch.unlink()
        else:
            scratch.replace(target)
        written.append(target)
    return written


if __name__ == "__main__":
    for p in main(sys.argv[1] if len(sys.argv) > 1 else DOCS / "_generated"):
        print(p)
