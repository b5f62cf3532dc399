"""SGPO: Stepwise Guided Policy Optimization (Chen et al., TMLR; arXiv 2505.11595) on TRL's ``GRPOTrainer``.

GRPO gives every completion of an all-negative group (no correct answer) the same reward, hence no gradient. SGPO
asks a step-wise judge for the first wrong step ``k`` of each of those completions, turns it into the reasoning
trajectory score ``RTS = (k - 1) / K`` and the partial credit ``sigmoid(beta * (RTS - gamma))``, strictly between
0 and 1, and feeds that to the unchanged GRPO advantage and loss. Groups with a correct answer stay binary GRPO
and are never judged; judging is switched on only during the first ``sgpo_num_epochs`` epochs. Maths in
:mod:`grpo_family.algorithms.sgpo`, judges in :mod:`grpo_family.judges`, ``docs/methods/sgpo.md``.

Data flow per generation batch, in the reward-transform stage (``transform_rewards``; the rewards are already gathered
from every process, docs/methods/sgpo.md §3.6 adapted so that the judge is asked once per completion, not once per
process):

1. correctness ``c`` = the correctness reward function's value ``>= correctness_threshold`` (NaN = incorrect);
   which groups are judged (``judge_scope``) is decided on the gathered values, identically everywhere;
2. every process sends the whole text of its own to-be-judged completions (reasoning included, also where TRL
   parsed it into ``reasoning_content``; docs/methods/sgpo.md §2.2), with problem, gold answer and reference solution from
   its dataset rows, to the main process (``gather_object``);
3. the main process splits each into steps (:func:`~grpo_family.judges.steps.split_steps`), calls the judge
   once for the whole batch (concurrently inside the judge), under a deadline, and broadcasts the verdicts
   (``broadcast_object_list``);
4. every process builds the same rewards: the correctness column is replaced by the SGPO reward in judged
   places, failures are NaN (advantage 0), and GRPO's group advantage runs on the result (``batch.rewards``,
   which is also the logged reward, so it describes what was trained on).

A judge that is down, slow or talking nonsense costs at most ``judge_batch_timeout`` seconds per generation batch
and turns into NaN rewards (zero advantage) with a warning and the ``sgpo/judge_failures`` metric; training goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import textwrap
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from accelerate.utils import broadcast_object_list, gather_object

from ..algorithms.grpo import is_constant, weighted_reward_sum
from ..algorithms.sgpo import (
    groups_to_judge,
    sgpo_rewards,
    trajectory_score,
    verdict_grid,
)
from ..bounds import Bound, Float, Int, OneOf, Text, Unused
from ..judges import JudgeConfig, TransformersJudge, make_judge
from ..judges.batch import check_judge_columns, judge_item, judge_items
from ..judges.config import GRACE_S, JUDGE_BOUNDS, judge_flag_fields
from .base import GRPOFamilyConfig, GRPOFamilyTrainer
from .stages import GenerationBatch

logger = logging.getLogger(__name__)


# The judge's flat flags (judge_type, judge_base_url, ..., step_splitter, require_reference), declared once with their
# defaults and help in grpo_family.judges.JudgeConfig; SGPOConfig inherits them from this generated base.
_SGPOJudgeFlags = dataclasses.make_dataclass(
    "_SGPOJudgeFlags", judge_flag_fields(), bases=(GRPOFamilyConfig,), namespace={"__module__": __name__}
)


@dataclass
class SGPOConfig(_SGPOJudgeFlags):
    r"""Configuration for :class:`SGPOTrainer` (fields below; every ``GRPOConfig`` field works too).

    Partial credit: ``sigmoid(sgpo_beta * (RTS - sgpo_gamma))``. The paper says its two parameters are "taken as 10
    and 0.5"; read as slope 10 and midpoint 0.5 (the only reading where a "threshold" makes sense for RTS in
    [0, 1]; docs/methods/sgpo.md §12 A1). The literal reading (slope 0.5, midpoint 10) squeezes all partial credit into
    [0.0067, 0.0110] and behaves almost like ``partial_credit_mode="linear"``.

    The paper's loss is verl's GRPO: ``beta=0.001`` (k3 KL), ``epsilon=0.2``, token-mean (``loss_type="dapo"``,
    TRL's default); TRL's default ``beta`` is 0.0, so set it in a recipe. Keep ``mask_truncated_completions=False``
    (TRL's default): truncated but sound negatives are where SGPO's signal comes from.

    The judge's settings are flat ``judge_*`` fields because TRL's parser makes flags and recipe keys from flat fields
    only; they are declared once, in :class:`~grpo_family.judges.JudgeConfig` (default, help, flag, bound), and
    inherited from a base made from it. :attr:`judge` reads them as one ``JudgeConfig``, which is what the judging
    code takes (docs/methods/sgpo.md §14).
    """

    field_bounds: ClassVar[dict[str, Bound]] = {  # read by grpo_family.bounds.check_bounds
        **JUDGE_BOUNDS,  # the judge_* fields, declared once beside JudgeConfig
        "sgpo_beta": Float(0, min_open=True),
        "sgpo_gamma": Float(),
        "partial_credit_mode": OneOf(("sigmoid", "linear")),
        "judge_scope": OneOf(("all_negative", "all_incorrect")),
        "sgpo_no_error_policy": OneOf(("full_credit", "last_step")),
        "sgpo_num_epochs": Float(0, optional=True),
        "sgpo_max_steps": Int(0, optional=True),
        "correctness_reward": Text(nonempty=True, optional=True),
        "correctness_threshold": Float(),
    }

    # Refused under the default judge, which a run gets when it never chose one: server or model options there mean
    # a judge type was forgotten. A judge chosen explicitly keeps them harmless (the judge-server recipes' CPU smoke
    # command swaps in --judge_type heuristic and leaves the recipe's server settings in place).
    _CHOSEN = ("judge_type", ("openai", "transformers", "heuristic"))
    unused_options: ClassVar[dict[str, Unused]] = {  # read by grpo_family.bounds.check_unused
        "judge_base_url": Unused(
            "the default judge (programmatic) sends no requests; add --judge_type openai.",
            "http://judge:8000/v1",
            _CHOSEN,
        ),
        "judge_model": Unused(
            "the default judge (programmatic) uses no model; add --judge_type openai (a served model) or "
            "--judge_type transformers (a local one).",
            "some-judge-model",
            _CHOSEN,
        ),
        "judge_prompt_template_path": Unused(
            "the default judge (programmatic) reads no prompt; add --judge_type openai or transformers.",
            __file__,
            _CHOSEN,
        ),
    }

    sgpo_beta: float = field(
        default=10.0,
        metadata={
            "help": "Slope of the partial-credit sigmoid (beta_s). Default 10 (paper: '10 and 0.5', Sec. 12 A1)."
        },
    )
    sgpo_gamma: float = field(
        default=0.5,
        metadata={"help": "Midpoint of the partial-credit sigmoid (gamma_s). Default 0.5 (paper, Sec. 12 A1)."},
    )
    partial_credit_mode: str = field(
        default="sigmoid",
        metadata={
            "help": "'sigmoid' (paper Eq. 2, default) or 'linear' (reward = RTS: the 'w/o {beta, gamma}' ablation)."
        },
    )
    judge_scope: str = field(
        default="all_negative",
        metadata={
            "help": "Which groups are judged: 'all_negative' (no correct completion; the paper's experiments, "
            "default) or 'all_incorrect' (every incorrect completion of every group; Eq. 2 read literally)."
        },
    )
    sgpo_no_error_policy: str = field(
        default="full_credit",
        metadata={
            "help": "What a 'no wrong step' verdict (NONE) gives an incorrect response: 'full_credit' (RTS = 1; the "
            "paper; default) or 'last_step' (k = K, RTS = (K-1)/K, for a response that states a final answer, which "
            "is wrong by definition; one without an answer, e.g. truncated, keeps RTS = 1). 'States a final answer' "
            "is read from the judged text outside its <think> block: a complete \\boxed{}, an <answer></answer> "
            "block, an 'Answer:' line, 'the final answer is ...' or '#### ...' (grpo_family.judges."
            "has_final_answer). docs/methods/sgpo.md §7, §12 A12."
        },
    )
    sgpo_num_epochs: float | None = field(
        default=3.0,
        metadata={
            "help": "Judged rewards only while the (fractional) epoch counter is below this; plain GRPO afterwards. "
            "Default 3.0 (paper: first 3 of 12 epochs). None = always on."
        },
    )
    sgpo_max_steps: int | None = field(
        default=None,
        metadata={"help": "Alternative gate: judged rewards only before this optimizer step. Default None (no gate)."},
    )
    correctness_reward: str | None = field(
        default=None,
        metadata={
            "help": "Name of the reward function that decides correctness (its __name__ / TRL reward name); None = "
            "the first reward function. Its value is replaced by the SGPO reward where the judge scores; the other "
            "reward functions are added with their weights as usual."
        },
    )
    correctness_threshold: float = field(
        default=1.0,
        metadata={
            "help": "A completion is correct iff the correctness reward is >= this (NaN = incorrect). Default 1.0."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        # Single values are checked by grpo_family.bounds (GRPOFamilyConfig.__post_init__); here, across fields.
        JudgeConfig.from_flags(self)  # e.g. judge_structured_output needs judge_type='openai'
        if self.judge_batch_timeout + GRACE_S >= self.ddp_timeout:
            raise ValueError(
                f"judge_batch_timeout ({self.judge_batch_timeout:g}s) must stay below ddp_timeout ({self.ddp_timeout}s): "
                "the other processes wait for the main process's judge inside a collective that times out after "
                "ddp_timeout. Lower judge_batch_timeout or raise ddp_timeout."
            )

    @property
    def judge(self) -> JudgeConfig:
        """The judge's settings as one object, read from the flat ``judge_*`` fields (so it follows them when they
        change after construction)."""
        return JudgeConfig.from_flags(self)


class SGPOTrainer(GRPOFamilyTrainer):
    """SGPO (Chen et al., "Stepwise Guided Policy Optimization: Coloring Your Incorrect Reasoning in GRPO", TMLR,
    arXiv 2505.11595): judge-based partial credit in all-negative groups, GRPO everywhere else.

    Args (beyond :class:`~trl.GRPOTrainer`'s):
        judge: a step judge object (``judge(requests) -> verdicts``, see :mod:`grpo_family.judges`); by
            default one is built from the config's ``judge_*`` fields. Only the main process calls it.

    Evaluation batches are scored as plain GRPO (correctness only): the judge is a training signal.

    Metrics (``sgpo/...``, train mode): ``active``, ``frac_all_negative``, ``judged_groups``, ``judge_requests``
    (completions sent), ``judge_calls`` (model calls: votes and retries), ``judge_failures``,
    ``judge_failure_rate``, ``judge_latency_s``, ``rts_mean``/``rts_min``/``rts_max``, ``frac_degenerate_judged``.
    """

    method_name = "sgpo"
    summary = "a step-wise judge gives partial credit inside groups where every answer is wrong"
    reported_result = "R1-Distill-Qwen-7B, 9 math benchmarks: overall 66.2 (best judge) vs GRPO 63.7"
    _tag_names = ["trl", "grpo", "grpo_family", "sgpo"]
    _name = "SGPO"
    _paper = {
        "title": "Stepwise Guided Policy Optimization: Coloring Your Incorrect Reasoning in GRPO",
        "id": "2505.11595",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{chen2025sgpo,
                title        = {{Stepwise Guided Policy Optimization: Coloring Your Incorrect Reasoning in GRPO}},
                author       = {Peter Chen and Xiaopeng Li and Ziniu Li and Xi Chen and Tianyi Lin},
                journal      = {Transactions on Machine Learning Research},
                year         = 2025,
                eprint       = {arXiv:2505.11595},
            }"""),
    }

    def __init__(self, model, reward_funcs=None, args: SGPOConfig | None = None, *pos, judge=None, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = SGPOConfig(f"{str(name).split('/')[-1]}-SGPO")
        elif not isinstance(args, SGPOConfig):
            raise TypeError(f"SGPOTrainer needs an SGPOConfig, got {type(args).__name__}.")
        super().__init__(model, reward_funcs, args, *pos, **kwargs)
        names = list(self.reward_func_names)
        wanted = args.correctness_reward
        if wanted is not None and wanted not in names:
            raise ValueError(f"correctness_reward {wanted!r} is not one of the reward functions {names}.")
        self._correct_index = 0 if wanted is None else names.index(wanted)
        check_judge_columns(args.judge, self.train_dataset, judge)
        # Only the main process calls the judge; a local model judge is loaded there only.
        if judge is None and self.accelerator.is_main_process:
            judge = make_judge(args.judge)
            if isinstance(judge, TransformersJudge):
                judge.model.to(self.accelerator.device)
        elif judge is None and args.judge.type == "openai":
            make_judge(args.judge)  # same validation on every process
        self.judge = judge

    # ------------------------------------------------------------------ window
    def sgpo_active(self) -> bool:
        """Whether judged rewards apply now (docs/methods/sgpo.md §2.7): epoch < sgpo_num_epochs and step < sgpo_max_steps."""
        args = self.args
        epoch = self.state.epoch or 0.0
        if args.sgpo_num_epochs is not None and not epoch < args.sgpo_num_epochs:
            return False
        return args.sgpo_max_steps is None or self.state.global_step < args.sgpo_max_steps

    # ------------------------------------------------------------------ reward-transform stage
    def transform_rewards(self, batch: GenerationBatch) -> None:
        """Partial credit from the judge in the judged groups (docs/methods/sgpo.md §2): the correctness column of
        ``batch.rewards_per_func`` and ``batch.rewards`` replaced where the judge scored; GRPO's advantage runs on the
        result. Evaluation batches and batches outside the judging window keep their rewards."""
        if batch.mode != "train":  # evaluation reports plain correctness; the judge is a training signal
            return
        if not self.sgpo_active():
            batch.log("active", 0.0)
            return
        args = self.args
        per_func = batch.rewards_per_func
        num_generations = batch.num_generations
        column = per_func[:, self._correct_index].view(-1, num_generations)
        correct = column >= args.correctness_threshold  # NaN -> False: unscorable counts as incorrect
        judged_groups = groups_to_judge(correct, scope=args.judge_scope)
        candidates = (judged_groups[:, None] & ~correct & ~torch.isnan(column)).reshape(-1)
        verdicts, stats = self._judge_candidates(candidates, batch)
        first_error, num_steps, answered, scored = verdict_grid(verdicts, column.size(0), num_generations)
        scored = scored.to(column.device)
        credit = sgpo_rewards(
            correct,
            first_error,
            num_steps,
            beta=args.sgpo_beta,
            gamma=args.sgpo_gamma,
            mode=args.partial_credit_mode,
            scope=args.judge_scope,
            no_error_policy=args.sgpo_no_error_policy,
            has_final_answer=answered,
        ).to(column.device, column.dtype)

        # Same operations as the base class, so unjudged completions keep bit-identical rewards.
        new_per_func = per_func.clone()
        new_per_func[:, self._correct_index] = torch.where(scored, credit, column).reshape(-1)
        new_rewards = weighted_reward_sum(new_per_func, self.reward_weights.to(per_func.device))
        failed = (scored & torch.isnan(credit)).reshape(-1)
        new_rewards[failed] = torch.nan  # a failed verdict leaves the completion unscorable (advantage 0)
        new_rewards = new_rewards.view_as(batch.rewards)
        batch.rewards_per_func = new_per_func
        batch.rewards = new_rewards

        self._log_sgpo(batch, correct, scored, failed.view_as(scored), new_rewards, verdicts, stats)
        if bool(scored.any()) and int(failed.sum()) == int(scored.sum()):
            # Every judged completion failed (the judge refuses or garbles every request): decided on gathered
            # verdicts, so alike on every process; the base class counts it like a reward function failing on every
            # completion (the policy for runs that cannot learn).
            batch.failed_scorers.append("SGPO judge")

    def _judge_candidates(self, candidates: torch.Tensor, batch: GenerationBatch) -> tuple[dict, dict]:
        """Verdicts per global flat index of the gathered ``candidates`` (P * G bools) and the judge's stats: each
        process sends its own candidates to the main process, which judges them in one call and broadcasts."""
        if not bool(candidates.any()):  # a global decision: every process takes part in the collectives below, or none
            return {}, {"requests": 0, "calls": 0, "latency": None, "skipped": 0}
        rows = batch.inputs
        start = self.accelerator.process_index * len(rows)
        mine = candidates[start : start + len(rows)].tolist()  # one device-to-host copy
        config = self.args.judge
        local = [judge_item(start + i, row, batch.completions[i], config) for i, row in enumerate(rows) if mine[i]]
        items = gather_object(local)
        last_step = self.args.sgpo_no_error_policy == "last_step"  # only that policy reads the final answer
        payload = [
            judge_items(self.judge, items, config, read_final_answer=last_step)
            if self.accelerator.is_main_process
            else None
        ]
        payload = broadcast_object_list(payload)[0]
        return payload["results"], payload["stats"]

    # ------------------------------------------------------------------ metrics
    def _log_sgpo(self, batch, correct, scored, failed, rewards, verdicts: dict, stats: dict) -> None:
        log = batch.log
        log("active", 1.0)
        log("frac_all_negative", float((~correct.any(dim=1)).float().mean()))
        judged = scored.any(dim=1)
        log("judged_groups", float(judged.sum()))
        log("judge_requests", float(stats["requests"]))
        log("judge_calls", float(stats["calls"]))
        num_failed = int(failed.sum())
        log("judge_failures", float(num_failed))
        if stats["requests"]:
            log("judge_failure_rate", num_failed / stats["requests"])
        if stats["latency"] is not None:
            log("judge_latency_s", stats["latency"])
        rts = [
            trajectory_score(value, steps, no_error_policy=self.args.sgpo_no_error_policy, has_final_answer=has_answer)
            for value, steps, _, has_answer in verdicts.values()
            if not (isinstance(value, float) and math.isnan(value))
        ]
        if rts:
            log("rts_mean", sum(rts) / len(rts))
            log("rts_min", min(rts))
            log("rts_max", max(rts))
        if bool(judged.any()):  # judged groups whose rewards are all equal (fewer than two scored: equal too)
            log("frac_degenerate_judged", float(is_constant(rewards[judged], dim=1).float().mean()))
        if num_failed and self.accelerator.is_main_process:
            reasons = sorted({why for _, _, why, _ in verdicts.values() if why})
            logger.warning(
                "SGPO judge failed on %d of %d judged completions (%s); their rewards are NaN (advantage 0) and "
                "training goes on.",
                num_failed,
                stats["requests"],
                "; ".join(reasons[:3]) or "unknown reason",
            )
