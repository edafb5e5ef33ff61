"""The fixed 2x2 Haar (db1) filters of the wavelet transform.

``HAAR_FILTERS[k, i, j]`` is the tap of subband ``k`` (0..3 = LL, LH, HL, HH)
applied to the pixel at row ``i``, column ``j`` of a 2x2 block, so that with
``a, b, c, d = v[0, 0], v[0, 1], v[1, 0], v[1, 1]``::

    LL = (a + b + c + d) / 2      LH = (a + b - c - d) / 2
    HL = (a - b + c - d) / 2      HH = (a - b - c + d) / 2

Flattened to ``(4, 4)`` the table is symmetric and orthogonal, so the same
taps perform the synthesis. This is also the published layer's
``wt_filter``/``iwt_filter`` pattern (row ``4*c + k`` holds subband ``k``).
"""

import numpy as np

HAAR_FILTERS = 0.5 * np.array(
    [
        [[1.0, 1.0], [1.0, 1.0]],  # LL
        [[1.0, 1.0], [-1.0, -1.0]],  # LH: top row minus bottom row
        [[1.0, -1.0], [1.0, -1.0]],  # HL: left column minus right column
        [[1.0, -1.0], [-1.0, 1.0]],  # HH
    ]
)
HAAR_FILTERS.setflags(write=False)
