"""Model cards and push_to_hub, offline: the card says which method and paper, hyperparameters and metrics."""

from __future__ import annotations

from unittest import mock

import pytest
from conftest import digit_share_reward

from grpo_family import METHODS


@pytest.mark.parametrize("method", sorted(METHODS))
def test_card_and_push(method, tiny_model_dir, tiny_tokenizer, arithmetic_train, config_kwargs, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_that_must_not_leak")
    config_cls, trainer_cls = METHODS[method]
    config = config_cls(**config_kwargs(max_steps=1, hub_model_id="someone/tiny-" + method))
    trainer = trainer_cls(
        model=tiny_model_dir, reward_funcs=[digit_share_reward], args=config, train_dataset=arithmetic_train
    )
    trainer.train()
    api = mock.MagicMock()
    api.create_repo.return_value.repo_id = f"someone/tiny-{method}"
    with mock.patch("transformers.trainer.hf_api", return_value=api):
        trainer.push_to_hub()
    upload = api.upload_folder.call_args.kwargs
    assert upload["repo_id"] == f"someone/tiny-{method}"
    with open(f"{config.output_dir}/README.md") as f:
        card = f.read()
    assert trainer._name in card and trainer._paper["title"] in card
    assert method in card and "learning_rate" in card and "| reward |" in card
    assert "hf_secret_value_that_must_not_leak" not in card
    assert upload["folder_path"] == config.output_dir
