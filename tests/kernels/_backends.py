"""Test doubles of the kernel backends."""

from wtconv_cuda.kernels.launch import SimulatorBackend


class RecordingBackend(SimulatorBackend):
    """The simulator backend, recording the sizes of the work buffers it is asked for
    (``requests``) and the kernel specs it compiles, in order (``kernels``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.requests = []
        self.kernels = []

    def kernel(self, spec):
        self.kernels.append(spec)
        return super().kernel(spec)

    def float32(self, n):
        self.requests.append(n)
        return super().float32(n)
