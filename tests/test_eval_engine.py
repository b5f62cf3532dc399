"""EvaluationCallback picks the training run's own vLLM engine when the trainer has one (TRL 1.16's
``trainer.vllm_generation``: a colocated ``LLM``, or the server's client on the main process), pushes the weights
first when the step changed, and never calls ``generate``; several benchmarks get their own keys, a preset its
decoding, every accuracy a standard error. vLLM does not run in this environment, so the engine here is a fake with
TRL's interface that answers each problem's gold (what a real engine does is the ``vllm`` lane's test,
``test_held_out_evaluation_uses_the_colocated_engine`` in tests/test_vllm.py's lane, not run here)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpo_family import get_method
from grpo_family.eval import EvalData, EvaluationCallback, GenerateBackend, generation
from grpo_family.tasks import arithmetic_reward, make_arithmetic_dataset


class FakeLLM:
    """vLLM's ``LLM.generate`` as TRL's colocate mode calls it: token-id prompts, sampling params, outputs with
    ``.outputs[j].token_ids``. It answers ``Answer: <gold>`` for the golds it was given (in problem order)."""

    def __init__(self, tokenizer, golds_by_prompt):
        self.tokenizer, self.golds, self.calls = tokenizer, golds_by_prompt, []
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=512))

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls.append((prompts, sampling_params))
        outputs = []
        for prompt, params in zip(prompts, sampling_params):
            text = self.tokenizer.decode(prompt["prompt_token_ids"])
            gold = next(g for problem, g in self.golds.items() if problem in text)
            ids = self.tokenizer(f"Answer: {gold}", add_special_tokens=False)["input_ids"]
            completion = SimpleNamespace(token_ids=[*ids, self.tokenizer.eos_token_id])
            outputs.append(SimpleNamespace(outputs=[completion] * params["n"]))
        return outputs


class FakeClient:
    """TRL's ``VLLMClient.generate``: ``n`` completions per prompt, flattened."""

    def __init__(self, llm):
        self.llm, self.calls = llm, []

    def generate(self, prompts, n, **params):
        self.calls.append((prompts, n, params))
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], [{"n": n}] * len(prompts), False)
        return {"completion_ids": [list(o.token_ids) for out in outputs for o in out.outputs]}


class FakeEngine:
    """TRL's ``VLLMGeneration`` as the callback uses it."""

    def __init__(self, mode, llm):
        self.mode, self.tensor_parallel_size, self.enable_sleep_mode = mode, 1, False
        self.llm, self.syncs = llm, 0
        self.vllm_client = FakeClient(llm) if mode == "server" else None

    def sync_weights(self):
        self.syncs += 1


@pytest.fixture
def trainer(tiny_model_dir, tiny_tokenizer, config_kwargs):
    config_cls, trainer_cls = get_method("grpo")
    return trainer_cls(
        model=tiny_model_dir,
        reward_funcs=[arithmetic_reward],
        args=config_cls(**config_kwargs(max_steps=1)),
        train_dataset=make_arithmetic_dataset("train", 16, seed=0),
        processing_class=tiny_tokenizer,
    )


def _with_engine(trainer, mode, datasets, monkeypatch):
    golds = {row["problem"]: row["answer"] for data in datasets for row in data.rows}
    engine = FakeEngine(mode, FakeLLM(trainer.processing_class, golds))
    trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, engine, -1
    monkeypatch.setattr(generation, "_vllm_sampling_params", lambda **params: params)  # vLLM is not installed here
    monkeypatch.setattr(GenerateBackend, "generate", lambda *a, **k: pytest.fail("generate was used"))
    return engine


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_the_runs_vllm_engine_generates_after_a_weight_sync(trainer, mode, monkeypatch):
    data = EvalData.held_out(make_arithmetic_dataset("eval", 8, seed=0), arithmetic_reward)
    engine = _with_engine(trainer, mode, [data], monkeypatch)
    callback = EvaluationCallback(data, arithmetic_reward, every=1, max_new_tokens=8, num_samples=4, seed=3,
                                  save_generations=False).bind(trainer)  # fmt: skip
    first = callback.evaluate()
    assert callback.backend_name == f"vllm-{mode}" and engine.syncs == 1
    assert callback.evaluate() == first and engine.syncs == 1  # same step: no second push
    assert first["held_out_accuracy"] == 1.0 and first["held_out_accuracy_stderr"] == 0.0
    assert first["held_out/pass@4"] == 1.0 and first["held_out/avg@4"] == 1.0
    if mode == "colocate":
        greedy_prompts, greedy_params = engine.llm.calls[0]
        sampled_prompts, sampled_params = engine.llm.calls[1]
        assert len(greedy_prompts) == len(sampled_prompts) == 8  # one request per problem
        assert [p["n"] for p in greedy_params] == [1] * 8 and {p["max_tokens"] for p in greedy_params} == {8}
        assert [p["seed"] for p in greedy_params] == [None] * 8  # greedy: no generator
        assert [p["seed"] for p in sampled_params] == [3 + i for i in range(8)]  # per problem, split-independent
        assert [p["n"] for p in sampled_params] == [4] * 8 and sampled_params[0]["temperature"] == 1.0
    else:
        (greedy, n_greedy, params), (sampled, n_sampled, _) = engine.vllm_client.calls[:2]
        assert len(greedy) == len(sampled) == 8 and (n_greedy, n_sampled) == (1, 4) and params["max_tokens"] == 8


def test_several_benchmarks_with_a_preset_get_their_own_keys_and_standard_errors(trainer, monkeypatch, tmp_path):
    first = EvalData.held_out(make_arithmetic_dataset("eval", 6, seed=0), arithmetic_reward, name="easy")
    second = EvalData.held_out(make_arithmetic_dataset("eval", 5, seed=1), arithmetic_reward, name="other")
    _with_engine(trainer, "colocate", [first, second], monkeypatch)
    callback = EvaluationCallback([first, second], arithmetic_reward, every=1, max_new_tokens=8,
                                  preset="d3s").bind(trainer)  # fmt: skip
    assert callback.sampled.num_samples == 32 and callback.sampled.top_p == 0.9  # D3S's decoding, length capped
    assert callback.sampled.max_new_tokens == 8 and callback.ks == [1, 8, 16, 32]
    metrics = callback.evaluate()
    for name in ("easy", "other"):
        for key in ("greedy_accuracy", "pass@1", "pass@8", "pass@16", "pass@32", "avg@32"):
            assert metrics[f"held_out/{name}/{key}"] == 1.0 and metrics[f"held_out/{name}/{key}_stderr"] == 0.0
    assert metrics["held_out_accuracy"] == metrics["held_out/easy/greedy_accuracy"]
    step = tmp_path / "out" / "eval_generations" / "step-0"
    assert sorted(p.name for p in step.iterdir()) == ["easy-greedy.jsonl", "easy-sampled.jsonl",
                                                      "other-greedy.jsonl", "other-sampled.jsonl"]  # fmt: skip
    assert len((step / "other-sampled.jsonl").read_text().splitlines()) == 5


def test_generate_is_used_without_an_engine_and_when_asked(trainer, monkeypatch):
    data = EvalData.held_out(make_arithmetic_dataset("eval", 4, seed=0), arithmetic_reward)
    callback = EvaluationCallback(data, arithmetic_reward, every=1, max_new_tokens=4, save_generations=False)
    callback.bind(trainer).evaluate()
    assert callback.backend_name == "generate"
    engine = FakeEngine("colocate", None)
    trainer.use_vllm, trainer.vllm_generation = True, engine
    forced = EvaluationCallback(data, arithmetic_reward, every=1, max_new_tokens=4, engine="generate",
                                save_generations=False).bind(trainer)  # fmt: skip
    forced.evaluate()
    assert forced.backend_name == "generate" and engine.syncs == 0
