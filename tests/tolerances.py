"""Float tolerances for the tests, derived from rounding rather than from one machine's observation.

Every fixed tolerance in ``tests/`` states its derivation in a comment tagged ``tol:`` on its line or in the
comment block right above it (``tests/test_tolerances.py`` greps for tolerances without one). The usual form is
``atol + k ULP x |value|``: a float32 number ``x`` is stored to within half a unit in its last place, and a unit in
the last place of ``x`` is at most ``EPS32 * |x|`` (``EPS32 = 2^-23``, the spacing of float32 numbers in [1, 2));
each rounding step an operation takes can move a result by at most one such unit relative to a computation that
rounds in another order. ``k`` counts those steps; ``atol`` covers results near zero, whose error is set by the
size of the operands rather than of the result.
"""

from __future__ import annotations

import torch

EPS32 = 2.0**-23  # float32: ULP(x) <= EPS32 * |x|
EPS64 = 2.0**-52  # float64: ULP(x) <= EPS64 * |x|


def ulp_bound(value: torch.Tensor | float, ulps: float, atol: float = 0.0, eps: float = EPS32):
    """``atol + ulps * eps * |value|`` (elementwise for a tensor): the largest difference ``ulps`` roundings of a
    number of size ``|value|`` can make, plus ``atol`` for results whose error is set by larger operands."""
    if isinstance(value, torch.Tensor):
        return atol + ulps * eps * value.abs()
    return atol + ulps * eps * abs(value)
