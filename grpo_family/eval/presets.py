"""Decoding settings and evaluation presets: each paper's evaluation as it states it, plus ``greedy``.

A :class:`Preset` holds a paper's decoding (temperature, top-p, samples per problem, generation length) and the
metrics it reports. SGPO's evaluation depends on the benchmark's size (sampled avg@16 below 100 problems, greedy
pass@1 otherwise), so a preset may carry a second decoding for small benchmarks. ``docs/evaluation.md`` has the table
of every preset with the paper section each value comes from (and where a paper is silent, where the value comes
from instead); ``tests/test_eval_presets.py`` checks that table against :data:`PRESETS`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import EvalSetupError

__all__ = ["Decoding", "EvalSetupError", "PRESETS", "Preset", "get_preset"]


@dataclass(frozen=True)
class Decoding:
    """How completions are sampled.

    Attributes:
        temperature: 0 for greedy decoding (one sample), else the sampling temperature.
        top_p: nucleus sampling mass (1.0: off).
        top_k: top-k sampling (0: off).
        num_samples: completions per problem (``n``).
        max_new_tokens: generation length; None for as long as the model's context allows.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    num_samples: int = 1
    max_new_tokens: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def check(self) -> None:
        """EvalSetupError on values no backend can run."""
        if self.temperature < 0:
            raise EvalSetupError(f"--temperature must be >= 0 (0 is greedy), got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise EvalSetupError(f"--top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise EvalSetupError(f"--top_k must be >= 0 (0 is off), got {self.top_k}.")
        if self.num_samples < 1:
            raise EvalSetupError(f"--num_samples must be >= 1, got {self.num_samples}.")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise EvalSetupError(f"--max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if self.greedy and self.num_samples > 1:
            raise EvalSetupError(
                f"Greedy decoding (temperature 0) gives {self.num_samples} identical samples. Sample with "
                "--temperature > 0, or evaluate one greedy sample (--num_samples 1)."
            )


@dataclass(frozen=True)
class Preset:
    """One paper's evaluation.

    Attributes:
        name: the ``--preset`` name.
        paper: the paper (or ``"-"``).
        decoding: the decoding the paper states.
        metrics: the metrics the paper reports from it (``pass@k``, ``avg@n``, ``greedy_accuracy``).
        small_decoding, small_metrics: a second decoding used for benchmarks with fewer than ``small_below``
            problems (SGPO's rule), or None.
    """

    name: str
    paper: str
    decoding: Decoding
    metrics: tuple[str, ...]
    small_decoding: Decoding | None = None
    small_metrics: tuple[str, ...] = ()
    small_below: int = 100

    def resolve(self, num_problems: int, **overrides) -> tuple[Decoding, tuple[str, ...]]:
        """The decoding and headline metrics for a benchmark of ``num_problems`` problems; ``overrides`` (explicit
        ``--temperature`` etc., None values ignored) win over the preset."""
        small = self.small_decoding is not None and num_problems < self.small_below
        decoding = self.small_decoding if small else self.decoding
        metrics = self.small_metrics if small else self.metrics
        given = {key: value for key, value in overrides.items() if value is not None}
        unknown = set(given) - {f.name for f in dataclasses.fields(Decoding)}
        if unknown:
            raise TypeError(f"unknown decoding settings: {sorted(unknown)}")
        decoding = dataclasses.replace(decoding, **given)
        decoding.check()
        return decoding, metrics


GREEDY_MAX_NEW_TOKENS = 1024  # the greedy preset's generation length (--max_new_tokens or a --recipe changes it)

_LIGHTEVAL = Decoding(temperature=0.6, top_p=0.95, num_samples=1, max_new_tokens=32768)

PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        # No paper: a length cap of its own, so a model that never stops is not generated to its whole context.
        Preset("greedy", "-", Decoding(max_new_tokens=GREEDY_MAX_NEW_TOKENS), ("greedy_accuracy",)),
        # GPG and CW-GRPO report zero-shot pass@1 with the Open-RS / open-r1 lighteval setup they build on.
        Preset("gpg", "GPG", _LIGHTEVAL, ("pass@1",)),
        Preset("cw_grpo", "CW-GRPO", _LIGHTEVAL, ("pass@1",)),
        Preset("ms_grpo", "MS-GRPO", Decoding(max_new_tokens=2048), ("greedy_accuracy",)),
        Preset(
            "d3s",
            "D3S",
            Decoding(temperature=1.0, top_p=0.9, num_samples=32, max_new_tokens=4096),
            ("pass@1", "pass@8", "pass@16"),
        ),
        Preset(
            "sgpo",
            "SGPO",
            Decoding(max_new_tokens=32768),
            ("greedy_accuracy",),
            small_decoding=Decoding(temperature=0.6, top_p=0.95, num_samples=16, max_new_tokens=32768),
            small_metrics=("avg@16",),
        ),
    )
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise EvalSetupError(
            f"Unknown preset {name!r}. Presets: {', '.join(PRESETS)} (docs/evaluation.md has their settings); or "
            "give the decoding yourself with --temperature / --top_p / --num_samples / --max_new_tokens."
        ) from None
