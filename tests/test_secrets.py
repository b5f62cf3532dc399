"""Secrets (issue 10, part 5): Hub tokens and judge API keys come from the environment (or the Hub login) and never
reach logs, metrics, saved configs, checkpoints or model cards; ``trust_remote_code`` stays off unless asked for.

The leak test plants sentinel values in ``HF_TOKEN`` and the judge's key variable, trains SGPO for two steps against
a loopback judge server that echoes the ``Authorization`` header back (in error bodies and in answers), saves
checkpoints, the model and the card, and then searches every file written and everything logged for the sentinels.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import digit_share_reward, tiny_config_kwargs
from test_judges import FakeOpenAI, completion

from grpo_family import METHODS
from grpo_family.judges import JudgeRequest, OpenAICompatibleJudge
from grpo_family.tasks import arithmetic_reward
from grpo_family.trainers.sgpo import SGPOConfig, SGPOTrainer

ROOT = Path(__file__).resolve().parents[1]
HF_SENTINEL = "hf_SENTINELhubTOKENmustNEVERleak0123"
JUDGE_SENTINEL = "sk-SENTINEL-judge-KEY-must-never-leak-4567"
SECRETS = (HF_SENTINEL, JUDGE_SENTINEL)


def files_containing(root: Path, secret: str) -> list[str]:
    """Every file under ``root`` whose bytes contain ``secret`` (binary files, pickles and checkpoints included)."""
    needle = secret.encode()
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file() and needle in p.read_bytes()]


def echoing_judge_server() -> FakeOpenAI:
    """A judge that echoes the Authorization header: in a 401 error body, in a garbage answer, and otherwise answers
    with a valid verdict."""
    server = FakeOpenAI()

    def behave(body, headers, n):
        auth = headers.get("Authorization", "")
        if n % 3 == 0:
            return 401, {"error": {"message": f"Incorrect API key provided: {auth}"}}, 0.0
        if n % 3 == 1:
            return 200, completion(f"I was called with {auth}; no verdict"), 0.0
        return 200, completion("FIRST_ERROR_STEP: 1"), 0.0

    server.behave = behave
    return server


def test_tokens_and_judge_key_never_reach_logs_files_or_the_card(
    tmp_path, monkeypatch, caplog, capfd, recwarn, tiny_model_dir, tiny_tokenizer, arithmetic_train
):
    monkeypatch.setenv("HF_TOKEN", HF_SENTINEL)
    monkeypatch.setenv("JUDGE_API_KEY", JUDGE_SENTINEL)  # SGPOConfig.judge_api_key_env's default
    out = tmp_path / "out"
    server = echoing_judge_server()
    try:
        config = SGPOConfig(
            **tiny_config_kwargs(
                out,
                judge_type="openai",
                judge_base_url=server.url,
                judge_model="judge",
                judge_timeout=10.0,
                judge_max_retries=1,
                judge_batch_timeout=60.0,
                save_strategy="steps",
                save_steps=1,
                hub_model_id="someone/tiny-sgpo",
            )
        )
        trainer = SGPOTrainer(
            model=tiny_model_dir,
            reward_funcs=[arithmetic_reward],
            args=config,
            train_dataset=arithmetic_train,
            processing_class=tiny_tokenizer,
        )
        with caplog.at_level(logging.DEBUG):
            trainer.train()
            trainer.save_model()
            trainer.create_model_card()
    finally:
        server.close()

    # The key really was sent, and the server really echoed it (otherwise this test could not fail).
    sent = [r["headers"].get("Authorization") for r in server.requests]
    assert sent and all(auth == f"Bearer {JUDGE_SENTINEL}" for auth in sent)
    assert "SGPO judge failed" in caplog.text and "HTTP 401" in caplog.text
    assert (out / "checkpoint-2" / "trainer_state.json").exists() and (out / "README.md").exists()

    captured = capfd.readouterr()
    shown = {
        "log records": caplog.text,
        "stdout": captured.out,
        "stderr": captured.err,
        "warnings": "\n".join(str(w.message) for w in recwarn),
        "log history": json.dumps(trainer.state.log_history),
        "metrics": repr(dict(trainer._metrics)),
        "config json": config.to_json_string(),
        "config dict": repr(config.to_dict()),
        "config repr": repr(config) + str(config),
        "judge": repr(trainer.judge) + str(trainer.judge) + repr(vars(trainer.judge)),
    }
    for secret in SECRETS:
        assert files_containing(out, secret) == []
        for where, text in shown.items():
            assert secret not in text, f"{secret} leaked into {where}"


def test_hub_token_given_in_the_config_is_used_but_never_written(
    tmp_path, tiny_model_dir, tiny_tokenizer, arithmetic_train
):
    """``--hub_token`` works for pushing, but transformers would pickle it into every ``training_args.bin``
    (checkpoints, the final model, what push_to_hub uploads): the trainer keeps it out of those files."""
    out = tmp_path / "out"
    config_cls, trainer_cls = METHODS["grpo"]
    config = config_cls(
        **tiny_config_kwargs(out, save_strategy="steps", save_steps=1, hub_model_id="someone/x", hub_token=HF_SENTINEL)
    )
    trainer = trainer_cls(
        model=tiny_model_dir,
        reward_funcs=[digit_share_reward],
        args=config,
        train_dataset=arithmetic_train,
        processing_class=tiny_tokenizer,
    )
    trainer.train()
    api = mock.MagicMock()
    api.create_repo.return_value.repo_id = "someone/x"
    with mock.patch("transformers.trainer.hf_api", return_value=api):
        trainer.push_to_hub()
    assert api.upload_folder.call_args.kwargs["token"] == HF_SENTINEL  # still the token where it is needed
    assert trainer.args.hub_token == HF_SENTINEL and f"{trainer.args.hub_token}" == HF_SENTINEL
    saved = torch.load(out / "training_args.bin", weights_only=False)
    assert saved.hub_token == "" and saved.learning_rate == config.learning_rate  # the rest is intact
    assert (out / "checkpoint-1" / "training_args.bin").exists()
    assert files_containing(out, HF_SENTINEL) == []
    assert HF_SENTINEL not in repr(trainer.args) + str(trainer.args) + trainer.args.to_json_string()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_saved_config_forms_redact_the_hub_token(method, tmp_path):
    """What transformers writes or logs from a config (JSON, dict, str) shows ``<HUB_TOKEN>``. (The dataclass
    ``repr`` of a bare config does show it; a trainer masks it, see the test above.)"""
    config_cls, _ = METHODS[method]
    config = config_cls(**tiny_config_kwargs(tmp_path, hub_token=HF_SENTINEL))
    for text in (config.to_json_string(), json.dumps(config.to_dict()), str(config)):
        assert HF_SENTINEL not in text and "<HUB_TOKEN>" in text


def test_judge_key_is_read_at_request_time_and_failures_do_not_echo_it(monkeypatch, caplog):
    server = echoing_judge_server()
    try:
        judge = OpenAICompatibleJudge(server.url, "judge", api_key_env="MY_JUDGE_KEY", max_retries=0, timeout=10)
        monkeypatch.setenv("MY_JUDGE_KEY", JUDGE_SENTINEL)  # set after construction: read per request
        request = JudgeRequest("Compute 1+2.", None, "3", ("1+2=4", "Answer: 4"))
        with caplog.at_level(logging.DEBUG):
            verdicts = judge.judge([request] * 3)
    finally:
        server.close()
    assert {r["headers"]["Authorization"] for r in server.requests} == {f"Bearer {JUDGE_SENTINEL}"}
    assert sorted(v.failed for v in verdicts) == [False, True, True]
    shown = caplog.text + repr(verdicts) + repr(judge) + str(vars(judge))
    assert JUDGE_SENTINEL not in shown and "HTTP 401" in shown


def test_a_key_given_instead_of_a_variable_name_is_refused_without_echoing_it(tmp_path):
    with pytest.raises(ValueError, match="NAME of the environment variable") as error:
        SGPOConfig(**tiny_config_kwargs(tmp_path, judge_api_key_env=JUDGE_SENTINEL))
    assert JUDGE_SENTINEL not in str(error.value)


def test_model_card_masks_credentials_in_urls(tmp_path, tiny_model_dir, tiny_tokenizer, arithmetic_train):
    config = SGPOConfig(
        **tiny_config_kwargs(
            tmp_path / "out", max_steps=1, judge_type="heuristic", judge_base_url=f"http://u:{JUDGE_SENTINEL}@h/v1"
        )
    )
    trainer = SGPOTrainer(
        model=tiny_model_dir,
        reward_funcs=[arithmetic_reward],
        args=config,
        train_dataset=arithmetic_train,
        processing_class=tiny_tokenizer,
    )
    trainer.create_model_card()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "| judge_base_url | http://***@h/v1 |" in card and JUDGE_SENTINEL not in card


# ------------------------------------------------------------------------------------------------ trust_remote_code
ASK_FOR_REMOTE_CODE = ["--model_init_kwargs", '{"trust_remote_code": true}']


def test_trust_remote_code_is_off_by_default_in_the_training_script():
    """Off unless asked for (--trust_remote_code, or trust_remote_code in --model_init_kwargs)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import train

    _, training_args, model_args, _ = train.parse_args([])
    assert not getattr(model_args, "trust_remote_code", False)
    assert not (training_args.model_init_kwargs or {}).get("trust_remote_code")
    # (the embedded default loads no model by name: the flag applies with --model_name_or_path / --dataset_name)
    _, asked, _, _ = train.parse_args(["--model_name_or_path", "m", "--dataset_name", "d", *ASK_FOR_REMOTE_CODE])
    assert asked.model_init_kwargs["trust_remote_code"] is True


def test_training_script_passes_trust_remote_code_only_when_asked(tiny_model_dir, tmp_path):
    sys.path.insert(0, str(ROOT / "examples"))
    import train

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"}) + "\n")
    # GRPOConfig's --trust_remote_code flag (what `trl grpo` reads) was accepted and ignored; it is honoured now.
    for flags, expected in (([], False), (ASK_FOR_REMOTE_CODE, True), (["--trust_remote_code"], True)):
        argv = ["--model_name_or_path", tiny_model_dir, "--dataset_name", str(data), "--output_dir", str(tmp_path)]
        script_args, training_args, model_args, _ = train.parse_args(argv + flags)
        checked = train.preflight(script_args, training_args, model_args)
        with mock.patch.object(train, "AutoTokenizer") as tokenizer_cls:
            train.load_real(script_args, training_args, model_args, checked)
        assert training_args.model_init_kwargs["trust_remote_code"] is expected
        assert tokenizer_cls.from_pretrained.call_args.kwargs["trust_remote_code"] is expected


def test_nothing_in_the_library_or_examples_turns_trust_remote_code_on():
    """No source file passes ``trust_remote_code=True`` (or a literal True in a dict / YAML / notebook)."""
    pattern = re.compile(r"trust_remote_code\W{0,6}(?:=|:)\s*['\"]?true\b", re.IGNORECASE)
    offenders = []
    for folder in ("grpo_family", "examples", "benchmarks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".yaml", ".yml", ".ipynb", ".json") and pattern.search(path.read_text()):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
    assert pattern.search("AutoModel.from_pretrained(p, trust_remote_code=True)")  # the pattern does catch it
    assert pattern.search('"trust_remote_code": true')
