"""The stages of a grpo_family trainer: the one list of them (:data:`STAGES`), the objects they receive, and the
helpers the base class uses to keep only the rows a method trains on.

A method is a subclass of :class:`~grpo_family.trainers.base.GRPOFamilyTrainer` that overrides some of the stage
methods below, never TRL's private helpers. Each stage receives a context object instead of TRL's dictionaries:

* :class:`GenerationBatch` -- one generation batch: the rewards gathered from every process, the advantages, the
  rows kept, this process's rollouts, and what the later stages read from TRL's generation output;
* :class:`MicroBatch` -- one of the micro-batches TRL splits a generation batch into (this process's rows, shuffled);
* :class:`LossCall` -- one call of the loss on a micro-batch: its inputs, and the log-probs and entropies of the
  loss's own policy forward.

A method's own per-row values travel with the rows through TRL's shuffle and split as the context's data (``set`` /
``get``, stored under ``"<method>/<name>"`` in TRL's batch); its metrics go through ``log`` (``<method>/<name>``).
Stage results that decide anything are global (computed from tensors gathered from every process), so every
process takes the same decisions and stays in step with the others' collectives.

``docs/architecture.md`` is written from :data:`STAGES` (``python -m grpo_family.trainers.stages``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import gather, pad_across_processes


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: the :class:`~grpo_family.trainers.base.GRPOFamilyTrainer` method a method overrides, when the base
    class calls it, what it receives and returns, and what a method changes there."""

    hook: str
    runs: str
    signature: str
    purpose: str


# The one list of the stages, in the order the base class calls them for a generation batch and its loss calls.
STAGES: tuple[Stage, ...] = (
    Stage(
        "transform_rewards",
        "once per generation round, on the rewards gathered from every process",
        "(batch: GenerationBatch) -> None",
        "change the rewards the advantages are computed from: set batch.rewards (P, G) and, when the reward "
        "functions' columns change too, batch.rewards_per_func (P*G, F); NaN = unscorable (SGPO's judge)",
    ),
    Stage(
        "compute_advantages",
        "after transform_rewards",
        "(batch: GenerationBatch) -> Tensor",
        "advantages from batch.rewards: (P, G), or (P, G, T) per token; the default is TRL's group "
        "normalisation, estimate_advantages(name, batch, options) any registered estimator's",
    ),
    Stage(
        "select_rows",
        "after compute_advantages, for a method with selects_rows = True; such a method is scored right after "
        "generation, before TRL's old and reference log-prob forwards, which then cover the kept rows only",
        "(batch: GenerationBatch) -> LongTensor | None",
        "the sorted global flat indices (b*G + i) of the rows to train on, from batch.advantages (D3S)",
    ),
    Stage(
        "weight_advantages",
        "once per generation round, on this process's slice of TRL's generation output",
        "(batch: GenerationBatch) -> Tensor",
        "the flat advantages trained on, (P*G,) or per token (P*G, T), e.g. token weights from the rollout "
        "log-probs (CW-GRPO)",
    ),
    Stage(
        "next_generation_round",
        "after each generation round",
        "(rounds: list[GenerationBatch]) -> list[dict] | None",
        "this process's dataset rows for one more generation round of the same batch, or None when the batch is "
        "complete; decided on global values, alike on every process (GPG's resampling)",
    ),
    Stage(
        "assemble_generation_rounds",
        "when next_generation_round asked for more rounds",
        "(rounds: list[GenerationBatch]) -> RoundAssembly",
        "which group of which round fills each slot of the batch trained on, and its rewards; the base class "
        "merges the rows, logs the rewards once and recomputes the advantages (GPG)",
    ),
    Stage(
        "finish_generation_batch",
        "once per generation batch, after the rows were kept, before TRL shuffles and splits the batch",
        "(batch: GenerationBatch) -> None",
        "per-row values the loss needs, with batch.set(name, tensor): D3S's rollout index, GPG's row weights and "
        "alpha",
    ),
    Stage(
        "prepare_micro_batches",
        "once per generation batch, after TRL split it into micro-batches (one in evaluation), before the first "
        "loss call",
        "(micro_batches: list[MicroBatch]) -> None",
        "per-micro-batch values over the whole generation batch: D3S's loss denominators and batch-wide token masks",
    ),
    Stage(
        "transform_loss_forward",
        "inside each loss call, right after the policy forward of TRL's loss, before the loss reads anything else",
        "(call: LossCall) -> None",
        "change call.logps, call.entropies (their values or their gradient) and call.advantages, and "
        "call.num_items_in_batch (the token-sum losses' denominator): D3S's token filter, CW-GRPO's weights",
    ),
    Stage(
        "loss_term",
        "inside each loss call, after transform_loss_forward, when the class names a registered loss term",
        "class attribute loss_term = '<name>', options from loss_term_options()",
        "a registered term of algorithms.losses over the loss call's rows on every process: advantages the "
        "surrogate uses instead, and/or a per-token loss added to it (KL-Cov, Clip-Cov)",
    ),
    Stage(
        "surrogate",
        "inside each loss call, after the loss term, when the class names a registered surrogate",
        "class attribute surrogate = '<name>', options from surrogate_options()",
        "a registered surrogate of algorithms.surrogates (ratio, clip, per-token objective) in place of TRL's "
        "clipped-ratio objective; TRL keeps its KL, aggregation and metrics (GMPO)",
    ),
)


def stage_generator(*key: Any) -> torch.Generator:
    """The one seeding helper for sampled draws of a stage: a CPU generator seeded from a hash of ``key`` (e.g.
    ``("ms_grpo", seed, global_step, slot)``), so every process draws alike, any key gives an independent stream,
    no state has to survive a checkpoint, and no mix of large integers can collide or overflow the 64-bit seed."""
    digest = hashlib.blake2b(":".join(str(part) for part in key).encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)  # < 2**63


# ---------------------------------------------------------------------------------------------------- contexts
class _RowData:
    """A view of one of TRL's batch dicts (this process's rows) with typed access to TRL's fields and the method's
    own values, stored under ``"<method>/<name>"``."""

    def __init__(self, data: dict[str, Any], method: str, log: Callable[[str, float], None]):
        self._data, self._method, self._log = data, method, log

    # TRL's fields (this process's rows; T = this batch's completion width)
    @property
    def advantages(self) -> torch.Tensor:
        """``(n,)`` or per token ``(n, T)``: what TRL's loss trains on."""
        return self._data["advantages"]

    @advantages.setter
    def advantages(self, value: torch.Tensor) -> None:
        self._data["advantages"] = value

    @property
    def completion_ids(self) -> torch.Tensor:
        """``(n, T)`` completion token ids (right-padded)."""
        return self._data["completion_ids"]

    @property
    def completion_mask(self) -> torch.Tensor:
        """``(n, T)`` 1 on completion tokens, 0 on padding (and on rows the loss must not see)."""
        return self._data["completion_mask"]

    @property
    def loss_mask(self) -> torch.Tensor:
        """``(n, T)`` the mask TRL's loss uses: ``completion_mask`` x ``tool_mask``."""
        mask, tools = self._data["completion_mask"], self._data.get("tool_mask")
        return mask if tools is None else mask * tools

    @property
    def old_logps(self) -> torch.Tensor | None:
        """``(n, T)`` the training model's log-probs at generation time, when TRL computed them (else None)."""
        return self._data.get("old_per_token_logps")

    @property
    def sampling_logps(self) -> torch.Tensor | None:
        """``(n, T)`` the sampler's (vLLM's) log-probs, when there are any."""
        return self._data.get("sampling_per_token_logps")

    @property
    def importance_sampling_ratio(self) -> torch.Tensor | None:
        """``(n, T)`` or ``(n, 1)``: TRL's vLLM importance-sampling correction, when it is on."""
        return self._data.get("importance_sampling_ratio")

    @property
    def num_rows(self) -> int:
        return self._data["completion_ids"].size(0)

    # the method's own values
    def _key(self, name: str) -> str:
        return f"{self._method}/{name}"

    def set(self, name: str, value: Any) -> None:
        """Store a value: a tensor whose first dimension is the rows travels with them through TRL's shuffle and
        split; a 0-dim tensor is copied to every micro-batch."""
        self._data[self._key(name)] = value

    def get(self, name: str, default: Any = None) -> Any:
        return self._data.get(self._key(name), default)

    def pop(self, name: str, default: Any = None) -> Any:
        return self._data.pop(self._key(name), default)

    def __contains__(self, name: str) -> bool:
        return self._key(name) in self._data

    def log(self, name: str, value: float) -> None:
        """A method metric, reported as ``<method>/<name>``."""
        self._log(name, value)


class MicroBatch(_RowData):
    """One micro-batch of a generation batch as TRL buffers it: this process's rows after TRL's shuffle, reused by
    every pass over the batch (``num_iterations``). ``mode`` is ``"train"`` or ``"eval"``."""

    def __init__(self, data: dict[str, Any], method: str, log: Callable[[str, float], None], mode: str):
        super().__init__(data, method, log)
        self.mode = mode


class LossCall(_RowData):
    """One call of the loss on a micro-batch. What is set here (``advantages``, ``num_items_in_batch``, values)
    holds for this call only; :attr:`buffered` is the micro-batch TRL keeps for its later passes.

    ``logps`` and ``entropies`` ``(n, T)`` are those of the loss's own policy forward (with gradient), set before
    :meth:`~grpo_family.trainers.base.GRPOFamilyTrainer.transform_loss_forward` runs; ``micro_step`` is TRL's
    micro-step counter (``_step``) at this call, ``num_processes`` the number of training processes.
    """

    def __init__(
        self, buffered: MicroBatch, *, micro_step: int, global_step: int, seed: int, num_generations: int,
        num_processes: int,
    ):  # fmt: skip
        super().__init__(dict(buffered._data), buffered._method, buffered._log)
        self.buffered = buffered
        self.mode = buffered.mode
        self.micro_step = micro_step
        self.global_step = global_step
        self.seed = seed
        self.num_generations = num_generations
        self.num_processes = num_processes
        self.logps: torch.Tensor | None = None
        self.entropies: torch.Tensor | None = None
        self.forwarded = False  # the loss made its policy forward (and the loss-forward stages ran)
        # a loss term's or a surrogate's (n, T) loss, added to TRL's per-token loss
        self.extra_loss: torch.Tensor | None = None
        self.surrogate_clips: tuple[torch.Tensor, torch.Tensor] | None = None  # a surrogate's clipped (low, high)
        self.surrogate_metrics: dict[str, torch.Tensor] = {}  # a surrogate's per-completion metrics

    def generator(self, name: str) -> torch.Generator:
        """The generator of a loss-call draw: ``(name, seed, global_step, slot)``, ``slot`` = ``1 + micro_step`` in
        training (every loss call its own stream), 0 in evaluation."""
        slot = 1 + self.micro_step if self.mode == "train" else 0
        return stage_generator(name, self.seed, self.global_step, slot)

    @property
    def num_items_in_batch(self) -> torch.Tensor:
        """The token-sum losses' (``dapo``, ``cispo``, ``vespo``) denominator: valid tokens of the generation batch
        on every process."""
        return self._data["num_items_in_batch"]

    @num_items_in_batch.setter
    def num_items_in_batch(self, value: torch.Tensor) -> None:
        self._data["num_items_in_batch"] = value

    @property
    def ref_logps(self) -> torch.Tensor | None:
        """``(n, T)`` the reference model's log-probs (``beta != 0``)."""
        return self._data.get("ref_per_token_logps")


@dataclasses.dataclass(eq=False)
class GenerationBatch:
    """One generation batch (or one generation round of it) as the stages see it.

    Global tensors hold every process's rows, rank-major, with each prompt's ``G`` completions on consecutive rows
    (row ``b * G + i`` is completion ``i`` of prompt ``b``); they are equal on every process. ``P`` prompts, ``G =
    num_generations``, ``F`` reward functions, ``T`` completion tokens. Local values are this process's.

    * ``rewards_per_func`` ``(P*G, F)``, global: each reward function's value, NaN = could not score;
    * ``raw_rewards`` ``(P, G)``, global: their weighted sum (NaN where no function scored);
    * ``rewards`` ``(P, G)``, global: what the advantages are computed from (``raw_rewards`` unless
      :meth:`~grpo_family.trainers.base.GRPOFamilyTrainer.transform_rewards` changed them); the logged reward;
    * ``advantages``: the advantage stage's result, flat: ``(P*G,)`` or ``(P*G, T)``, NaN already 0;
    * ``keep``: sorted global flat indices of the rows trained on (None = all); ``masked_rows`` ``(P*G,)`` bool: True
      where TRL masks the whole completion out of the loss (``mask_truncated_completions``), for a method that
      selects rows (it is scored before TRL's forwards: ``early``);
    * ``inputs``, ``prompts``, ``completions``, ``completion_ids``: this process's dataset rows and rollouts;
    * ``failed_scorers``: names of scorers of the method's own (e.g. a judge) that failed on every completion they
      were asked to score: the policy for runs that cannot learn counts them like a failing reward function;
    * ``kept_rows`` (local, after selection): each trained row's global flat index, -1 for an inert padding row;
      ``generated_tokens`` (local valid completion tokens before selection) and ``padding_rows``.

    TRL's generation output for this process (after the advantage stages ran) is read through ``completion_mask``,
    ``loss_mask``, ``old_logps``, ... and per-row values the loss needs are added with :meth:`set`.
    """

    mode: str
    num_generations: int
    rewards_per_func: torch.Tensor
    raw_rewards: torch.Tensor
    rewards: torch.Tensor
    global_step: int = 0
    micro_step: int = 0
    seed: int = 0
    inputs: list = dataclasses.field(default_factory=list)
    prompts: list = dataclasses.field(default_factory=list)
    completions: list = dataclasses.field(default_factory=list)
    completion_ids: list = dataclasses.field(default_factory=list)
    masked_rows: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    early: bool = False
    failed_scorers: list[str] = dataclasses.field(default_factory=list)
    rounds: int = 1
    kept_rows: torch.Tensor | None = None
    generated_tokens: torch.Tensor | None = None
    padding_rows: int = 0
    method: str = "grpo"
    logger: Callable[[str, float], None] | None = None
    output: dict[str, Any] | None = dataclasses.field(default=None, repr=False)  # TRL's output (the base class's)
    signals: dict[str, Any] | None = dataclasses.field(default=None, repr=False)  # for the unlearnable-run policy

    def log(self, name: str, value: float) -> None:
        """A method metric, reported as ``<method>/<name>``."""
        if self.logger is not None:
            self.logger(name, value)

    def generator(self, name: str) -> torch.Generator:
        """The generator of a stage's sampled draws, keyed by ``(name, seed, global_step, slot)``: ``slot`` is 0 in
        evaluation and ``1 + micro_step`` in training (TRL's micro-step counter at generation time tells apart
        generation batches that share an optimizer step, and it is part of every checkpoint), so every process
        draws alike and a resumed run draws what the uninterrupted one drew, with no state of its own; an
        evaluation consumes nothing that training draws from."""
        slot = 1 + self.micro_step if self.mode == "train" else 0
        return stage_generator(name, self.seed, self.global_step, slot)

    def _rows(self) -> _RowData:
        if self.output is None:
            raise RuntimeError("This stage runs before TRL's generation output exists (a method that selects rows).")
        return _RowData(self.output, self.method, self.log)

    @property
    def completion_mask(self) -> torch.Tensor:
        return self._rows().completion_mask

    @property
    def loss_mask(self) -> torch.Tensor:
        return self._rows().loss_mask

    @property
    def old_logps(self) -> torch.Tensor | None:
        return self._rows().old_logps

    @property
    def sampling_logps(self) -> torch.Tensor | None:
        return self._rows().sampling_logps

    @property
    def completion_width(self) -> int:
        """``T`` of this process's completions in TRL's output."""
        return self._rows().completion_ids.size(1)

    @property
    def num_local_rows(self) -> int:
        return len(self.completion_ids)

    def set(self, name: str, value: Any) -> None:
        """Add a per-row value of this process's trained rows (or a 0-dim tensor for the whole batch) for the loss:
        it travels with the rows through TRL's shuffle and split (see :class:`MicroBatch`)."""
        self._rows().set(name, value)


@dataclasses.dataclass
class RoundAssembly:
    """The batch trained on, assembled from several generation rounds: ``plan[s] = (round, global group)`` fills
    group slot ``s``; ``rewards`` ``(P, G)`` are the assembled rewards; ``degenerate_share`` the logged share of
    groups with no reward spread (None: the base class's test of equal rewards)."""

    plan: list[tuple[int, int]]
    rewards: torch.Tensor
    degenerate_share: float | None = None


# ---------------------------------------------------------------------------------------------------- helpers
def estimator_options(value: Any, field: str) -> dict[str, Any]:
    """A config's estimator options as a dict: None -> {}, a mapping as is, a JSON object string (the command
    line's form, e.g. ``'{"num_scales": 4, "subgroups_per_scale": 8}'``) parsed."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as error:
            raise ValueError(f"{field} must be a JSON object of estimator options, got {value!r} ({error}).") from None
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be a mapping of estimator options, got {type(value).__name__}.")
    return dict(value)


def gather_padded(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s rows from every process, rank-major; a 2-D tensor's columns are zero-padded on the right to the
    widest process's first (processes' completion widths differ)."""
    tensor = tensor.contiguous()
    return gather(pad_across_processes(tensor, dim=1, pad_index=0) if tensor.dim() == 2 else tensor)


def local_rows(keep: torch.Tensor, num_local: int, process_index: int) -> torch.Tensor:
    """This process's kept rows (local indices, ascending) from the global ``keep`` indices."""
    start = process_index * num_local
    mine = keep[(keep >= start) & (keep < start + num_local)]
    return (mine - start).sort().values


def padded_local_rows(
    keep: torch.Tensor, num_local: int, num_processes: int, process_index: int, multiple: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row index of this process's trained batch and which of its rows are real.

    Every process gets the same row count -- the largest kept count over processes, rounded up to ``multiple`` (TRL
    splits the batch into that many equal micro-steps) -- padded with copies of a kept row (row 0 when it keeps
    none), which the caller makes inert. Every process knows the whole selection, so no communication is needed.
    """
    flags = torch.zeros(num_local * num_processes, dtype=torch.bool, device=keep.device)
    flags[keep] = True
    rows = max(int(flags.view(num_processes, num_local).sum(1).max()), 1)
    rows = -(-rows // multiple) * multiple
    local = flags[process_index * num_local : (process_index + 1) * num_local].nonzero().squeeze(1)
    filler = local[:1] if local.numel() else torch.zeros(1, dtype=torch.long, device=keep.device)
    index = torch.cat([local, filler.repeat(rows - local.numel())])
    real = torch.arange(rows, device=keep.device) < local.numel()
    return index, real


def stage_table(overrides: dict[str, list[str]] | None = None) -> str:
    """:data:`STAGES` as a Markdown table (``docs/architecture.md``); ``overrides`` maps a stage to the methods that
    override it."""
    lines = [
        "| # | stage | when | receives -> returns | what a method does there | methods |",
        "|---|---|---|---|---|---|",
    ]
    for number, stage in enumerate(STAGES, 1):
        methods = ", ".join(f"`{m}`" for m in (overrides or {}).get(stage.hook, [])) or "-"
        cells = [str(number), f"`{stage.hook}`", stage.runs, f"`{stage.signature}`", stage.purpose, methods]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


__all__ = [
    "STAGES",
    "GenerationBatch",
    "LossCall",
    "MicroBatch",
    "RoundAssembly",
    "Stage",
    "estimator_options",
    "gather_padded",
    "local_rows",
    "padded_local_rows",
    "stage_generator",
    "stage_table",
]
