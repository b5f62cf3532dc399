"""examples/train.py at parity with ``trl grpo`` (the README table "`trl grpo` vs `examples/train.py`", one test per
row, local stand-ins only) and its start-up checks (grpo_family.preflight): each bad input fails before anything
trains, with a message naming the problem and the fix."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset, IterableDataset

from grpo_family import preflight
from grpo_family.errors import PreflightError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import train  # noqa: E402

ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
       "PYTHONPATH": str(ROOT)}  # fmt: skip
ROWS = [{"question": f"What is {i} plus {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"} for i in range(24)]
TINY_RUN = ["--max_steps", "1", "--per_device_train_batch_size", "8", "--num_generations", "4",
            "--max_completion_length", "8", "--report_to", "none", "--save_strategy", "no",
            "--num_eval_examples", "4", "--logging_steps", "1"]  # fmt: skip


def _write(path: Path, rows: list[dict]) -> Path:
    """``rows`` in the format ``path``'s extension names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix in (".csv", ".tsv"):
        Dataset.from_list(rows).to_csv(str(path), index=False, sep="\t" if path.suffix == ".tsv" else ",")
    elif path.suffix == ".parquet":
        Dataset.from_list(rows).to_parquet(str(path))
    return path


def _gsm_dir(path: Path) -> Path:
    _write(path / "train.jsonl", ROWS[:16])
    _write(path / "test.jsonl", ROWS[16:])
    return path


# ---------------------------------------------------------------------------------------------------- data
@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".tsv", ".parquet"])
def test_local_data_file_in_every_format(tmp_path, suffix):
    """Was: "Couldn't find any data file" for a single file; only a directory of split files worked."""
    data = preflight.load_data(str(_write(tmp_path / f"data{suffix}", ROWS)))
    assert list(data) == ["train"] and data["train"][3] == ROWS[3]


def test_local_directory_and_dataset_config(tmp_path, caplog):
    """A recipe's dataset_config (e.g. GSM8K's `main`) pointed at local data: a subdirectory of that name is used,
    otherwise it is ignored with a warning (was: "BuilderConfig 'main' not found")."""
    _gsm_dir(tmp_path / "gsm" / "main")
    data = preflight.load_data(str(tmp_path / "gsm"), "main")
    assert len(data["train"]) == 16 and len(data["test"]) == 8
    data = preflight.load_data(str(tmp_path / "gsm" / "main"), "main")
    assert len(data["train"]) == 16 and "is ignored" in caplog.text


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_non_utf8_data_names_file_and_row(tmp_path, suffix):
    """Was: a UnicodeDecodeError naming neither file nor row."""
    path = _write(tmp_path / f"data{suffix}", ROWS[:3])
    path.write_bytes(path.read_bytes() + "Caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(PreflightError, match=rf"data{suffix}, line \d+ is not UTF-8.*0xe9.*iconv"):
        preflight.load_data(str(path))
    with pytest.raises(PreflightError, match="not UTF-8"):  # inside a directory too
        preflight.load_data(str(tmp_path))


def test_empty_data_fails_at_start(tmp_path):
    """Was: StopIteration from inside datasets."""
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(PreflightError, match="empty.jsonl is empty"):
        preflight.load_data(str(tmp_path / "empty.jsonl"))
    (tmp_path / "nothing").mkdir()
    with pytest.raises(PreflightError, match="no data files"):
        preflight.load_data(str(tmp_path / "nothing"))
    with pytest.raises(PreflightError, match="no_such.jsonl: no such file or directory"):
        preflight.load_data(str(tmp_path / "no_such.jsonl"))
    with pytest.raises(PreflightError, match="has no 'test' split"):
        preflight.check_split(preflight.load_data(str(_write(tmp_path / "d.jsonl", ROWS))), "test", "d.jsonl")


def test_gsm8k_rows_without_marker_fail():
    """Was: rows without `####` silently read as plain answers and scored 0."""
    rows = Dataset.from_list([*ROWS[:5], {"question": "What is 1 plus 1?", "answer": "1+1=2, so 2"}])
    with pytest.raises(PreflightError, match=r"1 of 6 GSM8K-style rows .*row 5.*--dataset_preset qa"):
        preflight.check_gsm8k_markers(rows, "auto")
    plain = Dataset.from_list([{"question": "Capital of France?", "answer": "Paris"}])
    preflight.check_gsm8k_markers(plain, "auto")  # plain Q&A: fine
    with pytest.raises(PreflightError, match="1 of 1 GSM8K-style"):
        preflight.check_gsm8k_markers(plain, "gsm8k")


# ---------------------------------------------------------------------------------------------------- rewards
def test_reward_functions_by_trl_name_and_dotted_path(tmp_path, monkeypatch):
    from trl.rewards import think_format_reward

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text(
        "def length_reward(completions, **kw):\n    return [1.0] * len(completions)\n"
    )
    funcs = preflight.resolve_reward_funcs(
        ["math_accuracy", "think_format_reward", "trl.rewards.think_format_reward", "my_rewards.length_reward"]
    )
    assert funcs[1] is funcs[2] is think_format_reward and funcs[3].__name__ == "length_reward"
    with pytest.raises(PreflightError, match="cannot import 'nope' from 'my_rewards'"):
        preflight.resolve_reward_funcs(["my_rewards.nope"])
    with pytest.raises(ValueError, match="Unknown reward function 'nope'.*dotted import path"):
        train.parse_args(["--model_name_or_path", "m", "--dataset_name", "d", "--reward_funcs", "nope"])


# ---------------------------------------------------------------------------------------------------- fail at start
def _main_fails(tiny_model_dir, tmp_path, extra, data=None):
    data = data or str(_gsm_dir(tmp_path / "gsm"))
    argv = ["--model_name_or_path", tiny_model_dir, "--dataset_name", data, "--output_dir", str(tmp_path / "o"),
            *TINY_RUN, *extra]  # fmt: skip
    with pytest.raises((PreflightError, ValueError)) as info:
        train.main(argv)
    assert not (tmp_path / "o" / "trainer_state.json").exists()
    return str(info.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model_name_or_path", "./no/such/model"], r"\./no/such/model: no such directory"),
        (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size must be an integer >= 1; got 0"),
        (["--push_to_hub"], "push_to_hub needs the Hugging Face Hub, but HF_HUB_OFFLINE is set"),
        (["--load_in_4bit"], r"--load_in_4bit (needs the bitsandbytes|quantizes with bitsandbytes)"),
        (["--reward_model_name_or_path", "/no/such/rm"], "--reward_model_name_or_path /no/such/rm: no such"),
        (["--eval_strategy", "steps", "--dataset_test_split", "validation"], "no 'validation' split"),
        (["--use_vllm", "--vllm_mode", "server"], r"--vllm_mode server cannot train on this machine.*colocate"),
        (
            [
                "--method",
                "sgpo",
                "--judge_type",
                "openai",
                "--judge_base_url",
                "http://127.0.0.1:9/v1",
                "--judge_model",
                "j",
            ],
            r"SGPO judge at http://127.0.0.1:9/v1, which cannot be reached.*Start the judge",
        ),
    ],  # fmt: skip
)
def test_fails_before_training_with_the_fix(tiny_model_dir, tmp_path, monkeypatch, extra, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert re.search(message, _main_fails(tiny_model_dir, tmp_path, extra))


def test_hub_probe_without_network(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(PreflightError, match=r"Hub \(http://127.0.0.1:9\), which cannot be reached"):
        preflight.check_hub_reachable(True)


def test_missing_gold_answers_fail_at_start(tiny_model_dir, tmp_path):
    """Was: a MATH-style set with no readable gold warned, then trained on nothing."""
    data = _write(tmp_path / "math.jsonl", [{"problem": f"What is {i}+1?", "solution": "Add."} for i in range(8)])
    message = _main_fails(tiny_model_dir, tmp_path, [], data=str(data))
    assert "cannot read 8 of 8 gold answers" in message


# ---------------------------------------------------------------------------------------------------- data that cannot train
@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_fewer_rows_than_one_generation_batch_fail_at_start(tiny_model_dir, tmp_path, suffix):
    """A 1-row dataset (or a .json file holding one object) trained 0 steps and exited 0. One generation batch of
    TINY_RUN holds 2 prompts (8 completions, 4 per prompt)."""
    path = tmp_path / f"one{suffix}"
    path.write_text(json.dumps(ROWS[0]) + ("\n" if suffix == ".jsonl" else ""))
    message = _main_fails(tiny_model_dir, tmp_path, [], data=str(path))
    assert "The training set has 1 row(s), fewer than the 2 prompts of one generation batch" in message
    assert "Add rows, or lower --per_device_train_batch_size" in message


def test_fewer_rows_than_one_generation_batch_fail_at_trainer_init(tiny_model_dir, tiny_tokenizer, tmp_path):
    """The same check in the trainer (the Python API): before any generation."""
    from grpo_family import GRPOFamilyConfig, GRPOFamilyTrainer

    with pytest.raises(PreflightError, match=r"has 3 row\(s\), fewer than the 4 prompts of one generation batch"):
        GRPOFamilyTrainer(
            model=tiny_model_dir, reward_funcs=[lambda completions, **kw: [1.0] * len(completions)],
            args=GRPOFamilyConfig(output_dir=str(tmp_path), per_device_train_batch_size=16, num_generations=4,
                                  use_cpu=True, bf16=False, report_to="none"),
            train_dataset=Dataset.from_list([{"prompt": f"Compute {i}+1."} for i in range(3)]),
            processing_class=tiny_tokenizer,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("golds", "reward", "messages"),
    [
        # A list-valued gold was read by math_accuracy as an interval: right answers scored 0 with no warning.
        ({5: ["10", "11"]}, "math_accuracy", ["1 of 8 gold answers in the column 'result' are not one answer "
                                              "(row 5: ['10', '11'])", "qa_exact_match / qa_f1, which accept a list"]),
        # Unreadable golds: the reward, the column and the rows named.
        (dict.fromkeys(range(8), "no idea"), "choice_accuracy",
         ["choice_accuracy cannot read 8 of 8 gold answers in the column 'result'", "row 0: 'no idea'"]),
    ],
    ids=["list_valued", "unreadable"],
)  # fmt: skip
def test_golds_the_reward_cannot_read_fail_naming_rows_and_column(tiny_model_dir, tmp_path, golds, reward, messages):
    rows = [{"question": f"What is {i} plus {i}?", "result": golds.get(i, str(2 * i))} for i in range(8)]
    data = _write(tmp_path / "d" / "train.jsonl", rows)
    extra = ["--dataset_preset", "qa", "--answer_column", "result", "--reward_funcs", reward]
    message = _main_fails(tiny_model_dir, tmp_path, extra, data=str(data))
    assert all(m in message for m in messages), message


def test_a_model_folder_without_tokenizer_or_with_only_an_adapter_fails(tiny_model_dir, tmp_path):
    """A folder without tokenizer files loaded a one-token tokenizer (the error spoke of the chat template); a LoRA
    adapter folder gave "Should have a model_type key". Both now say what to pass instead."""
    import shutil

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(Path(tiny_model_dir) / name, bare / name)
    message = _main_fails(tiny_model_dir, tmp_path, ["--model_name_or_path", str(bare)])
    assert f"{bare} holds a model but no tokenizer" in message and "save_pretrained" in message

    adapter = tmp_path / "adapter"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(adapter)
    assert not (adapter / "config.json").exists()
    message = _main_fails(tiny_model_dir, tmp_path, ["--model_name_or_path", str(adapter)])
    assert f"{adapter} holds a PEFT adapter (adapter_config.json), not a model" in message
    assert f"its base model is '{tiny_model_dir}'" in message and "merge_and_unload" in message
    message = _main_fails(tiny_model_dir, tmp_path, ["--reward_model_name_or_path", str(bare)])
    assert f"--reward_model_name_or_path {bare} holds a model but no tokenizer" in message


# ---------------------------------------------------------------------------------------------------- runs
def test_parity_run_eval_reward_model_trl_reward_trust_and_card(tiny_model_dir, tmp_path, monkeypatch):
    """One real run: a local directory, evaluation on its test split during training (--eval_strategy), a reward
    model by path, TRL's reward by dotted path, --trust_remote_code honoured, and push_to_hub's card naming the
    dataset (the upload itself replaced: no network here)."""
    from grpo_family import GRPOFamilyTrainer

    pushed = {}

    def fake_push(self, dataset_name=None, **kwargs):
        self.create_model_card(dataset_name=dataset_name)
        pushed["dataset_name"] = dataset_name

    monkeypatch.setattr(GRPOFamilyTrainer, "push_to_hub", fake_push)
    monkeypatch.setattr(GRPOFamilyTrainer, "init_hf_repo", lambda self, token=None: None)
    monkeypatch.setattr(preflight, "check_hub_reachable", lambda push: None)
    out, data = tmp_path / "out", str(_gsm_dir(tmp_path / "gsm"))
    seen = {}
    original = train.load_real

    def spy(script_args, training_args, model_args, checked):
        result = original(script_args, training_args, model_args, checked)
        seen["trust"] = training_args.model_init_kwargs["trust_remote_code"]
        return result

    monkeypatch.setattr(train, "load_real", spy)
    train.main([
        "--model_name_or_path", tiny_model_dir, "--dataset_name", data, "--output_dir", str(out), *TINY_RUN,
        "--reward_model_name_or_path", tiny_model_dir, "--reward_funcs", "math_accuracy",
        "trl.rewards.think_format_reward", "--eval_strategy", "steps", "--eval_steps", "1",
        "--per_device_eval_batch_size", "8", "--trust_remote_code", "--push_to_hub", "--hub_model_id", "me/tiny",
    ])  # fmt: skip
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    evaluation = next(h for h in history if "eval_loss" in h)  # TRL's evaluation ran on the test split
    names = {k.split("/")[1] for k in evaluation if k.startswith("eval_rewards/")}
    assert names == {"math_accuracy", "think_format_reward", Path(tiny_model_dir).name}  # functions + reward model
    assert any("rewards/think_format_reward/mean" in h for h in history)  # in training too
    assert seen["trust"] is True
    assert pushed["dataset_name"] == data and data in (out / "README.md").read_text()


def test_streaming_and_mixture(tiny_model_dir, tmp_path):
    """--dataset_streaming trains on an IterableDataset read from a local file; a TRL `datasets:` mixture in the
    YAML is read, checked and trained on like --dataset_name."""
    data = _write(tmp_path / "data.jsonl", ROWS)
    out = tmp_path / "out"
    train.main(["--model_name_or_path", tiny_model_dir, "--dataset_name", str(data), "--dataset_streaming",
                "--output_dir", str(out), *TINY_RUN])  # fmt: skip
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 1
    recipe = tmp_path / "mix.yaml"
    recipe.write_text(
        f"model_name_or_path: {tiny_model_dir}\ndatasets:\n  - path: {_gsm_dir(tmp_path / 'a')}\n"
        f"  - path: {_gsm_dir(tmp_path / 'b')}\n"
    )
    script_args, training_args, model_args, _ = train.parse_args(["--config", str(recipe), *TINY_RUN])
    checked = train.preflight(script_args, training_args, model_args)
    assert len(checked["train"]) == 32 and str(tmp_path / "a") in checked["dataset_name"]
    train.main(["--config", str(recipe), "--output_dir", str(tmp_path / "mixed"), *TINY_RUN])
    assert json.loads((tmp_path / "mixed" / "trainer_state.json").read_text())["global_step"] == 1
    streamed = preflight.load_data(str(data), streaming=True)
    assert isinstance(streamed["train"], IterableDataset)


@pytest.mark.slow  # 20-60 s on 2 cores: whole train.py processes
def test_errors_print_a_message_not_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train.py"), "--model_name_or_path", "./no/such/model",
         "--dataset_name", str(tmp_path / "d.jsonl"), "--output_dir", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert result.returncode == 1
    assert "error: --model_name_or_path ./no/such/model: no such directory" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # 20-60 s on 2 cores: whole train.py processes
def test_a_run_that_cannot_learn_exits_1_with_the_reason(tiny_model_dir, tmp_path):
    """A reward returning NaN everywhere (given by dotted path) used to train to the end and exit 0."""
    (tmp_path / "my_rewards.py").write_text(
        "def nan_reward(completions, **kw):\n    return [float('nan')] * len(completions)\n"
    )
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train.py"), "--model_name_or_path", tiny_model_dir,
         "--dataset_name", str(_gsm_dir(tmp_path / "gsm")), "--reward_funcs", "my_rewards.nan_reward",
         "--output_dir", str(tmp_path / "o"), *TINY_RUN, "--max_steps", "5", "--max_unscorable_batches", "2"],
        capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert "error: The run cannot learn: for 2 generation batches in a row reward function(s) 'nan_reward'" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
