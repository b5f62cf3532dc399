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
