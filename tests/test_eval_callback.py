"""EvaluationCallback in a short training run: it logs held-out greedy accuracy and sampled pass@k to the log
history and to every report_to integration (through on_log) at the steps it should, and the run trains exactly as
it does without it (same rewards, losses and weights: its sampling does not touch the training run's random state,
and the step's own training log still happens)."""

from __future__ import annotations

import torch
from dist_suite import WARM_START, scenario
from transformers import TrainerCallback

from grpo_family import get_method
from grpo_family.eval import EvalData, EvaluationCallback
from grpo_family.tasks import arithmetic_reward, make_arithmetic_dataset


class Backend(TrainerCallback):
    """Stands in for a report_to integration: what reaches on_log reaches wandb / tensorboard / trackio."""

    def __init__(self):
        self.logged: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logged.append({**logs, "step": state.global_step})


def train(tiny_model_dir, tiny_tokenizer, config_kwargs, *, evaluate: bool):
    config_cls, trainer_cls = get_method("grpo")
    backend = Backend()
    callbacks = [backend]
    callback = None
    if evaluate:
        held_out = EvalData.held_out(make_arithmetic_dataset("eval", 8, seed=0), arithmetic_reward)
        callback = EvaluationCallback(held_out, arithmetic_reward, every=2, max_new_tokens=8, num_samples=4,
                                      temperature=1.0, ks=[1, 4], seed=3)  # fmt: skip
        callbacks.append(callback)
    trainer = trainer_cls(
        model=tiny_model_dir,
        reward_funcs=[arithmetic_reward],
        args=config_cls(**config_kwargs(max_steps=5, logging_steps=1, temperature=1.0)),
        train_dataset=make_arithmetic_dataset("train", 64, seed=0),
        processing_class=tiny_tokenizer,
        callbacks=callbacks,
    )
    if callback is not None:
        callback.bind(trainer)
        callback.initial = callback.evaluate()
    torch.manual_seed(0)
    trainer.train()
    return trainer, backend, callback


def test_the_callback_logs_to_the_backends_and_leaves_training_unchanged(
    tiny_model_dir, tiny_tokenizer, config_kwargs
):
    plain, plain_backend, _ = train(tiny_model_dir, tiny_tokenizer, config_kwargs, evaluate=False)
    trainer, backend, callback = train(tiny_model_dir, tiny_tokenizer, config_kwargs, evaluate=True)

    evaluated = [row for row in trainer.state.log_history if "held_out_accuracy" in row]
    assert [row["step"] for row in evaluated] == [0, 2, 4, 5]  # before training, every 2 steps, the last step
    assert sorted(callback.history) == [0, 2, 4, 5]
    for row in evaluated:
        assert {"held_out/pass@1", "held_out/pass@4", "held_out/avg@4", "held_out/maj@4"} <= set(row)
        assert row["held_out/pass@1"] <= row["held_out/pass@4"] <= 1.0
        assert row["held_out/pass@1"] == row["held_out/avg@4"]
    reached = [row for row in backend.logged if "held_out_accuracy" in row]
    assert [row["step"] for row in reached] == [0, 2, 4, 5]  # every evaluation reached the integrations

    def training_logs(state):
        drop = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
        return [{k: v for k, v in row.items() if k not in drop} for row in state.log_history
                if "held_out_accuracy" not in row]  # fmt: skip

    assert len(training_logs(trainer.state)) == 6  # the 5 steps' own logs (logging_steps=1) and the summary
    assert training_logs(trainer.state) == training_logs(plain.state)
    for (name, a), (_, b) in zip(trainer.model.named_parameters(), plain.model.named_parameters()):
        assert torch.equal(a, b), name


def test_the_sampled_evaluation_is_reproducible_and_seeded(config_kwargs):
    from grpo_family.tasks import load_warm_start

    model, tokenizer = load_warm_start()  # the demo's policy: its samples vary in length and correctness
    config_cls, trainer_cls = get_method("grpo")
    held_out = EvalData.held_out(make_arithmetic_dataset("eval", 8, seed=0), arithmetic_reward)
    trainer = trainer_cls(
        model=model,
        reward_funcs=[arithmetic_reward],
        args=config_cls(**config_kwargs()),
        train_dataset=make_arithmetic_dataset("train", 64, seed=0),
        processing_class=tokenizer,
    )
    callbacks = [
        EvaluationCallback(held_out, arithmetic_reward, every=1, max_new_tokens=40, num_samples=8, seed=seed).bind(
            trainer
        )
        for seed in (0, 0, 1)
    ]
    state = torch.random.get_rng_state()
    first, again, other = (c.evaluate() for c in callbacks)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random state is untouched
    assert first == again  # same seed, same samples, same numbers
    assert first["held_out/sampled_mean_length"] != other["held_out/sampled_mean_length"]  # another seed differs


@scenario("eval_callback", WARM_START)
def test_two_processes_split_the_problems_and_gather_the_one_process_numbers(dist_output):
    """2 processes (gloo): each generates only its half of the held-out problems (greedy and sampled), the main
    process scores the gathered generations and broadcasts; both ranks hold the same history, and the evaluation
    before training equals a single-process one of the same model with the same batches (6 problems each: what the
    split gives 12 problems on 2 processes). The warm start's samples differ in length and correctness, so equal
    numbers mean equal samples. The generations of each evaluation are written once, beside the run."""
    import json

    from dist.eval_callback import HELD_OUT, SETTINGS
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from grpo_family.eval import Decoding, GenerateBackend, evaluate_data
    from grpo_family.tasks import warm_start_dir

    model_dir = str(warm_start_dir())  # built by the suite (dist_suite.WARM_START) before the launch
    rank0, rank1 = (json.loads((dist_output / f"rank{r}.json").read_text()) for r in (0, 1))
    assert sorted(rank0["history"], key=int) == ["0", "1", "2"] and rank0["history"] == rank1["history"]
    half = HELD_OUT // 2
    for kind in ("greedy", "sampled"):  # each rank generated only its share
        assert rank0["generated"][f"held-out/{kind}"] == list(range(half))
        assert rank1["generated"][f"held-out/{kind}"] == list(range(half, HELD_OUT))
    assert rank0["backend"] == "generate"  # no vLLM engine in this run
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    data = EvalData.held_out(make_arithmetic_dataset("eval", HELD_OUT, seed=0), arithmetic_reward)
    greedy = evaluate_data(GenerateBackend(model, tokenizer, batch_size=half), data, Decoding(max_new_tokens=40),
                           arithmetic_reward).summary  # fmt: skip
    sampled = evaluate_data(GenerateBackend(model, tokenizer, batch_size=half * 4), data, Decoding(1.0, 1.0, 0, 4, 40),
                            arithmetic_reward, ks=[1, 4], seed=SETTINGS["seed"]).summary  # fmt: skip
    before = rank0["history"]["0"]
    assert before["held_out/greedy_mean_length"] == greedy["mean_length"]
    assert before["held_out/sampled_mean_length"] == sampled["mean_length"]
    for key in ("pass@1", "pass@4", "pass@1_stderr", "pass@4_stderr", "avg@4", "maj@4"):
        assert before[f"held_out/{key}"] == sampled[key], key
    assert before["held_out_accuracy"] == greedy["greedy_accuracy"]
    assert before["held_out_accuracy_stderr"] == greedy["greedy_accuracy_stderr"]
    assert 0 < sampled["pass@1"] < 1  # samples that differ: equal numbers are equal samples, not a constant
    for step in (0, 1, 2):  # written by the main process only, one line per problem
        for kind in ("greedy", "sampled"):
            lines = (dist_output / "eval_generations" / f"step-{step}" / f"held-out-{kind}.jsonl").read_text()
            assert len(lines.splitlines()) == HELD_OUT
