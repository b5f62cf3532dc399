"""``python -m grpo_family.eval``: see :mod:`grpo_family.eval.cli`."""

import sys

from .cli import main

sys.exit(main())
