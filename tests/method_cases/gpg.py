"""``gpg``: the shared tests' data (see ``tests/method_cases/__init__.py``)."""

from conftest import digit_share_reward

from method_cases import MethodCase


def gpg_parity_reward(completions, answer, **kwargs):
    """Dense reward for odd gold answers, 0 for even ones: the groups of even-answer prompts are degenerate, so GPG's
    beta_th resampling draws extra prompts."""
    dense = digit_share_reward(completions)
    return [value if int(gold) % 2 else 0.0 for value, gold in zip(dense, answer)]


def resume_check(logs):
    assert max(logs[3]["gpg/rounds"], logs[4]["gpg/rounds"]) > 1


CASE = MethodCase(
    bad_config=(
        {"steps_per_generation": 2, "gradient_accumulation_steps": 1},
        r"steps_per_generation \(2\) must equal gradient_accumulation_steps \(1\).*Leave steps_per_generation",
    ),
    # Its own loss logs one entropy and reads alpha where TRL's loss logs its clip and entropy metrics.
    host_syncs=(-1, -8),
    metric="gpg/alpha",
    options={"beta_th": None},  # resampling has its own tests; here one generation round per step
    resume_options=dict(beta_th=1.0, max_generation_rounds=3),
    resume_rewards=(gpg_parity_reward,),
    resume_check=resume_check,
    accepts_beta=False,  # GPG has no KL term and rejects any beta != 0
    vllm_is_mode=None,  # its config turns TRL's correction off
)
