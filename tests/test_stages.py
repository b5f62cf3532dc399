"""The base class's stage helpers (trainers/stages.py): which local rows a row selection keeps, and how every
process is padded to the same row count."""

from __future__ import annotations

import pytest
import torch

from grpo_family.trainers.stages import estimator_options, local_rows, padded_local_rows


def test_local_rows_are_this_process_share_of_the_global_selection():
    keep = torch.tensor([0, 3, 4, 5, 11])  # 2 processes x 6 rows
    assert local_rows(keep, 6, 0).tolist() == [0, 3, 4, 5]
    assert local_rows(keep, 6, 1).tolist() == [5]
    assert local_rows(torch.tensor([], dtype=torch.long), 6, 1).tolist() == []


@pytest.mark.parametrize("multiple", [1, 2, 3])
def test_padded_local_rows_give_every_process_the_same_count(multiple):
    keep = torch.tensor([0, 3, 4, 5, 11])
    counts = []
    for process, own in ((0, [0, 3, 4, 5]), (1, [5])):
        index, real = padded_local_rows(keep, 6, 2, process, multiple)
        counts.append(index.numel())
        assert index[real].tolist() == own  # the real rows first, in order
        assert set(index[~real].tolist()) <= {own[0]}  # padding copies a kept row
        assert index.numel() % multiple == 0 and index.numel() >= 4
    assert counts[0] == counts[1] == -(-4 // multiple) * multiple


def test_a_process_that_keeps_nothing_gets_one_inert_row():
    index, real = padded_local_rows(torch.tensor([1]), 4, 2, 1, 1)
    assert index.tolist() == [0] and real.tolist() == [False]


def test_estimator_options_accept_a_mapping_json_or_nothing():
    assert estimator_options(None, "x") == {} == estimator_options(" ", "x")
    assert estimator_options({"tol": 0.1}, "x") == {"tol": 0.1}
    assert estimator_options('{"num_scales": 4}', "x") == {"num_scales": 4}
    with pytest.raises(ValueError, match="x must be a JSON object"):
        estimator_options("num_scales=4", "x")
    with pytest.raises(ValueError, match="x must be a mapping"):
        estimator_options("[1, 2]", "x")


def test_no_method_overrides_a_private_trl_helper():
    """Methods are stages on the base class: none of them overrides or wraps a private method of TRL's GRPOTrainer
    (only the base class reaches into TRL, in one place per helper)."""
    from trl import GRPOTrainer

    from grpo_family import METHODS
    from grpo_family.trainers.base import GRPOFamilyTrainer

    private = {name for name in dir(GRPOTrainer) if name.startswith("_") and not name.startswith("__")}
    for method, (_, trainer_cls) in METHODS.items():
        for cls in trainer_cls.__mro__[: trainer_cls.__mro__.index(GRPOFamilyTrainer)]:
            overridden = sorted(name for name in vars(cls) if name in private and callable(vars(cls)[name]))
            assert not overridden, f"{method}: {cls.__name__} overrides TRL's {overridden}; use a stage instead"


# ---------------------------------------------------------------------------------------------------- TRL facts
# What the stages rely on in TRL 1.16's GRPOTrainer; each message says what changed and what to revisit.
def _source(name: str) -> str:
    import inspect

    from trl import GRPOTrainer

    return inspect.getsource(getattr(GRPOTrainer, name))


def test_trl_generates_then_forwards_then_scores():
    """Row selection before TRL's no-grad forwards (D3S) relies on this order inside _generate_and_score_completions:
    _generate -> old / reference log-prob forwards -> _calculate_rewards, with the extra fields merged in between."""
    source = _source("_generate_and_score_completions")
    positions = [
        source.find(marker)
        for marker in ("= self._generate(prompts)", "old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies",
                       "ref_per_token_logps, _, _ = self._get_per_token_logps_and_entropies",
                       "if extra_fields:", "self._calculate_rewards(inputs, prompts, completions, completion_ids_list)")
    ]  # fmt: skip
    assert -1 not in positions and positions == sorted(positions), (
        "TRL's _generate_and_score_completions changed the order generate -> old/ref forwards -> extra fields -> "
        f"rewards (positions {positions}); revisit GRPOFamilyTrainer._generate / _get_per_token_logps_and_entropies"
    )
    assert "torch.nan_to_num(per_token_logps_diff, nan=0.0)" in source, (
        "TRL no longer maps a NaN log-prob difference to importance ratio 1; the dropped rows' NaN old log-probs of "
        "GRPOFamilyTrainer._get_per_token_logps_and_entropies would reach its ratio metrics"
    )


def test_trl_generate_returns_the_fields_the_early_scoring_unpacks():
    source = _source("_generate")
    assert "def _generate(self, prompts" in source, "TRL's _generate signature changed (GRPOFamilyTrainer._generate)"
    returned = source[source.rindex("return ") :].split("\n")[0]
    names = "prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images"
    assert returned.strip() == f"return {names}", (
        f"TRL's _generate returns {returned.strip()[:200]!r}; GRPOFamilyTrainer._generate unpacks "
        "(_, completion_ids_list, _, completions, _, extra_fields, _, _)"
    )


def test_trl_loss_makes_its_forward_before_reading_the_advantages():
    """The loss-forward stage runs inside the one policy forward of TRL's loss (compute_entropy=True), which must come
    before the loss reads ``inputs["advantages"]``."""
    source = _source("_compute_loss")
    forward = source.find("self._get_per_token_logps_and_entropies(")
    assert forward != -1 and source.count("self._get_per_token_logps_and_entropies(") == 1, (
        "TRL's _compute_loss no longer makes exactly one policy forward; revisit the loss-forward stage"
    )
    assert "compute_entropy=True" in source[forward : forward + 400], "TRL's loss forward no longer asks for entropies"
    assert forward < source.find('inputs["advantages"]'), (
        "TRL's loss reads the advantages before its forward; the loss-forward stage (D3S, CW-GRPO) would come too late"
    )


# ---------------------------------------------------------------------------------------------------- the one list
def test_every_stage_is_a_method_of_the_base_class_and_every_override_is_a_stage():
    """STAGES names the base class's stage methods; a method class overrides stages (or TRL's public compute_loss),
    never a stage-like public method the list does not know."""
    from grpo_family import METHODS
    from grpo_family.trainers.base import GRPOFamilyTrainer
    from grpo_family.trainers.stages import STAGES

    hooks = [stage.hook for stage in STAGES if stage.hook not in ("loss_term", "surrogate")]
    assert all(callable(getattr(GRPOFamilyTrainer, hook)) for hook in hooks)
    allowed = {*hooks, "loss_term_options", "surrogate_options", "compute_loss", "loss_forward_fix"}
    for method, (_, trainer_cls) in METHODS.items():
        for cls in trainer_cls.__mro__[: trainer_cls.__mro__.index(GRPOFamilyTrainer)]:
            public = {n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)}
            inherited = {n for n in public if hasattr(GRPOFamilyTrainer, n)}
            assert inherited <= allowed, f"{method}: {cls.__name__} overrides {sorted(inherited - allowed)}"


def test_methods_reach_trl_only_through_the_stage_contexts():
    """No method module reads or writes TRL's metrics (``self._metrics``), its micro-step counter (``self._step``),
    its buffers or its batch keys: those go through GenerationBatch / MicroBatch / LossCall and the base class."""
    import re
    from pathlib import Path

    from grpo_family import METHODS
    from grpo_family.trainers import base

    trl_keys = {
        "prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch",
        "old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio",
        "tool_mask",
    }  # fmt: skip
    private = re.compile(r"self\._(metrics|step|buffered_inputs|logs)\b")
    subscript = re.compile(r"\[\s*[\"'](\w+)[\"']\s*\]|\.get\(\s*[\"'](\w+)[\"']")
    modules = {Path(trainer.__module__.replace(".", "/") + ".py") for _, trainer in METHODS.values()}
    checked = 0
    for module in sorted(modules):
        path = Path(base.__file__).parents[2] / module
        if path.name == "base.py":
            continue
        text = path.read_text(encoding="utf-8")
        checked += 1
        assert not private.search(text), f"{path.name} reaches TRL's state: {private.search(text).group(0)}"
        keys = {a or b for a, b in subscript.findall(text)} & trl_keys
        assert not keys, f"{path.name} reads TRL's batch keys {sorted(keys)}; use the stage context"
    assert checked == len(METHODS) - 1


def test_every_method_has_a_test_case():
    """The shared tests read each method's case (tests/method_cases/<method>.py)."""
    from method_cases import MethodCase, case

    from grpo_family import METHODS

    for method in METHODS:
        assert isinstance(case(method), MethodCase), method
