"""Pure tensor maths of every method: imports torch only, never trl or transformers.

Importing any part of the package registers the advantage estimators every method may name (``grpo``, ``ms_grpo``,
``gpg``; each registers itself in its own module, ``algorithms/estimators.py`` holds the registry).
"""

from . import gpg, grpo, ms_grpo  # noqa: F401 - each registers its advantage estimator
