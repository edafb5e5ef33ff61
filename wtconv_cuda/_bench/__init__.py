"""Internals of ``python -m wtconv_cuda.bench`` (see :mod:`wtconv_cuda.bench`).

- :mod:`.core`: configurations, byte counts, roofline, timers and the median
  timing loop, the time budget, the progress bar (no PyTorch needed);
- :mod:`.measure`: the measurements with PyTorch (and CuPy) on a device;
- :mod:`.report`: terminal tables, the JSON file and the PNG plot;
- :mod:`.cpu_demo`: the tiny CPU comparison run on machines without CUDA.
"""
