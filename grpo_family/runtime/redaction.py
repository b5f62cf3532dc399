"""Secrets kept out of what a run writes: checkpoints' pickled config and the public model card."""

from __future__ import annotations

import re
from typing import Any


class UnpickledSecret(str):
    """A token string that works as one in memory but is pickled as ``""`` and shown as ``'<redacted>'``.

    Copies (``copy``/``deepcopy``) are the object itself, so only serialisation drops the value."""

    def __reduce__(self):
        return (str, ("",))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __repr__(self) -> str:
        return "'<redacted>'"


def _card_value(value: Any) -> Any:
    """A config value as a public model card may show it: credentials in a URL (``https://user:key@host``, e.g. a
    judge's ``judge_base_url``) are masked."""
    return re.sub(r"(?<=://)[^/@\s]+@", "***@", value) if isinstance(value, str) else value
