"""SGPO's judge settings as one object (:class:`JudgeConfig`) and the judge they describe (:func:`make_judge`).

Each setting is declared once, here: its default, its help text, the flag that sets it and its bound
(:data:`JUDGE_BOUNDS`). ``SGPOConfig`` holds the settings as flat ``judge_*`` fields made from these
(:func:`judge_flag_fields`), because TRL's ``TrlParser`` (transformers' ``HfArgumentParser``) makes command-line flags
and recipe keys from flat dataclass fields only (a dataclass-typed field's flag is handed whole, as one string, to the
class); ``SGPOConfig.judge`` is a :class:`JudgeConfig` built from them on each read, which is all the judging code
reads. The settings are checked against their flags' bounds (:mod:`grpo_family.bounds`), with messages that name the
flags a user sets.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from typing import Any

from ..bounds import Bound, Flag, Float, Int, OneOf, Text, Url, check_bounds
from .step_judges import HeuristicReferenceJudge, OpenAICompatibleJudge, ProgrammaticJudge, TransformersJudge

logger = logging.getLogger(__name__)

JUDGE_TYPES = ("programmatic", "openai", "transformers", "heuristic")  # what make_judge builds
GRACE_S = 1.0  # beyond batch_timeout, for a judge that honours the deadline itself to hand back its results
_COLUMN = Text(nonempty=True)

# Each judge setting's bound, by the flag that sets it: declared once, read by JudgeConfig (by field, below) and by
# SGPOConfig's flat judge_* fields (its field_bounds).
JUDGE_BOUNDS: dict[str, Bound] = {
    "judge_type": OneOf(JUDGE_TYPES),
    "judge_base_url": Url(optional=True),
    "judge_model": Text(nonempty=True, optional=True),
    "judge_api_key_env": Text(
        pattern=r"([A-Za-z_][A-Za-z0-9_]*)?",
        pattern_words="the NAME of the environment variable holding the key (letters, digits, _), not the key itself",
        bad=("sk-abc 123",),
        optional=True,
        secret=True,
    ),
    "num_judge_votes": Int(1),
    "judge_temperature": Float(0, optional=True),
    "judge_max_tokens": Int(1),
    "judge_timeout": Float(0, min_open=True),
    "judge_max_retries": Int(0),
    "judge_concurrency": Int(1),
    "judge_batch_timeout": Float(0, min_open=True),
    "judge_prompt_template_path": Text(nonempty=True, file=True, optional=True),
    "step_splitter": OneOf(("paragraph", "line", "sentence")),
    "judge_max_steps": Int(1, optional=True),
    "judge_problem_column": Text(nonempty=True, optional=True),
    "judge_answer_column": _COLUMN,
    "judge_reference_column": _COLUMN,
    "require_reference": Flag(),
    "judge_structured_output": Flag(),
}


def _flag(default, flag: str, help: str):
    """A judge setting: its default, the ``SGPOConfig`` field (and command-line flag) that sets it, and its help text.
    Declared here once: ``SGPOConfig``'s flat ``judge_*`` fields are made from these (``judge_flag_fields``)."""
    return dataclasses.field(default=default, metadata={"flag": flag, "help": help})


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    """Which step judge SGPO asks, how, and which dataset columns it reads. Each field's ``flag`` metadata names the
    ``SGPOConfig`` field (and command-line flag) it comes from, whose help text gives the default and the paper's
    value:

    * the judge: ``type`` (``judge_type``), ``base_url``, ``model``, ``api_key_env`` (the *name* of the variable
      holding the key), ``num_votes`` (``num_judge_votes``), ``temperature``, ``max_tokens``, ``timeout``,
      ``max_retries``, ``concurrency``, ``prompt_template_path``, ``structured_output`` (verdicts constrained to
      JSON by the server; ``openai`` only);
    * a batch: ``batch_timeout`` (what is still pending then is a failure), ``step_splitter``, ``max_steps``
      (``judge_max_steps``);
    * the data: ``problem_column``, ``answer_column``, ``reference_column``, ``require_reference``.
    """

    type: str = _flag(
        "programmatic",
        "judge_type",
        "'programmatic' (exact checker of the bundled arithmetic task; offline; default), 'openai' (any "
        "OpenAI-compatible endpoint, e.g. `vllm serve`; the paper's setting), 'transformers' (a local model) or "
        "'heuristic' (HeuristicReferenceJudge: flags the first stated result that is not a number of the "
        "reference solution or gold answer; crude, CPU only, for smoke tests and CI). A judge object passed to "
        "the trainer (judge=...) overrides this.",
    )
    base_url: str | None = _flag(
        None,
        "judge_base_url",
        "OpenAI-compatible API root, e.g. 'http://judge-host:8000/v1' (judge_type='openai').",
    )
    model: str | None = _flag(
        None,
        "judge_model",
        "Served model name (openai; paper: o4-mini, Claude 3.7, DeepSeek-V3-0324, Qwen3-235B-A22B, "
        "QwQ-32B) or model path / Hub id (transformers).",
    )
    api_key_env: str = _flag(
        "JUDGE_API_KEY",
        "judge_api_key_env",
        "Environment variable holding the judge API key (never put the key itself in a config). Unset = "
        "no Authorization header. Default 'JUDGE_API_KEY'.",
    )
    num_votes: int = _flag(
        1,
        "num_judge_votes",
        "Independent judge votes per completion, majority on the error position. Default 1 (paper: 1; 4 in Table 4).",
    )
    temperature: float | None = _flag(
        None,
        "judge_temperature",
        "Judge sampling temperature; None = 0.0 for one vote, 0.6 for several.",
    )
    max_tokens: int = _flag(
        16384,
        "judge_max_tokens",
        "Judge completion budget per vote (reasoning judges need many). Default 16384.",
    )
    timeout: float = _flag(
        600.0,
        "judge_timeout",
        "Seconds for one judge HTTP request. Default 600 (reasoning judges).",
    )
    max_retries: int = _flag(
        2,
        "judge_max_retries",
        "Retries of a failed / unparseable judge request, with exponential backoff (judge_type='openai' "
        "only: the local 'transformers' judge does not retry). Default 2.",
    )
    concurrency: int = _flag(
        64,
        "judge_concurrency",
        "Judge requests in flight at once. Default 64.",
    )
    batch_timeout: float = _flag(
        900.0,
        "judge_batch_timeout",
        "Deadline in seconds for judging one generation batch; what is still pending becomes a failure "
        "(NaN reward, advantage 0) and training goes on. Default 900.",
    )
    prompt_template_path: str | None = _flag(
        None,
        "judge_prompt_template_path",
        "Judge prompt template file ([system] / [user] sections, placeholders {problem}, "
        "{reference_solution}, {gold_answer}, {steps}, {num_steps}); None = the library's "
        "grpo_family/judges/judge_prompt.txt.",
    )
    step_splitter: str = _flag(
        "paragraph",
        "step_splitter",
        "Where the step splitter's fallback chain starts: 'paragraph' (blank lines; default), 'line' or "
        "'sentence' (docs/methods/sgpo.md §2.2).",
    )
    max_steps: int | None = _flag(
        None,
        "judge_max_steps",
        "Merge steps into at most this many blocks before judging (bounds prompts). Default None.",
    )
    problem_column: str | None = _flag(
        None,
        "judge_problem_column",
        "Dataset column with the problem text; None = the last user message of the prompt.",
    )
    answer_column: str = _flag(
        "answer",
        "judge_answer_column",
        "Dataset column with the gold final answer (default 'answer').",
    )
    reference_column: str = _flag(
        "solution",
        "judge_reference_column",
        "Dataset column with the reference solution shown to the judge (default 'solution').",
    )
    require_reference: bool = _flag(
        False,
        "require_reference",
        "Judge only prompts with a reference solution (others keep GRPO's binary reward). Default False: "
        "the gold answer stands in for a missing reference (docs/methods/sgpo.md §12 A13).",
    )
    structured_output: bool = _flag(
        False,
        "judge_structured_output",
        "judge_type='openai': constrain each verdict to the JSON {\"first_error_step\": j or null} "
        "(j within the response's steps) with the OpenAI API's response_format JSON schema, enforced by vLLM's "
        "structured outputs; no unparseable verdicts, but no written reasoning before the verdict. Default off.",
    )

    @classmethod
    def from_flags(cls, config) -> JudgeConfig:
        """The settings held by ``config``'s flat fields (``SGPOConfig``'s ``judge_*`` fields and the others named
        in each field's ``flag``)."""
        return cls(**{f.name: getattr(config, f.metadata["flag"]) for f in dataclasses.fields(cls)})

    def __post_init__(self):
        check_bounds(self)  # each setting against its flag's bound (grpo_family.bounds); the error names the flag
        if self.structured_output and self.type != "openai":
            raise ValueError(
                f"judge_structured_output applies to judge_type='openai' (a served judge), not {self.type!r}."
            )


JudgeConfig.field_bounds = {f.name: JUDGE_BOUNDS[f.metadata["flag"]] for f in dataclasses.fields(JudgeConfig)}


def judge_flag_fields() -> list[tuple[str, Any, dataclasses.Field]]:
    """``SGPOConfig``'s flat judge fields, one per :class:`JudgeConfig` field: its flag as the name, its type, its
    default and its help text (for ``dataclasses.make_dataclass``; TRL's parser makes flags of flat fields only)."""
    types = typing.get_type_hints(JudgeConfig)
    return [
        (
            f.metadata["flag"],
            types[f.name],
            dataclasses.field(default=f.default, metadata={"help": f.metadata["help"]}),
        )
        for f in dataclasses.fields(JudgeConfig)
    ]


def make_judge(config: JudgeConfig):
    """The judge ``config`` describes (a :class:`JudgeConfig`, or a config holding one as ``.judge``: ``SGPOConfig``)."""
    config = getattr(config, "judge", config)
    if config.temperature == 0 and config.num_votes > 1:
        logger.warning("num_judge_votes > 1 with judge_temperature 0: the votes will be identical.")
    if config.type == "programmatic":
        return ProgrammaticJudge()
    if config.type == "heuristic":
        return HeuristicReferenceJudge()
    if config.type == "openai":
        if not config.base_url or not config.model:
            raise ValueError(
                "judge_type='openai' needs judge_base_url (e.g. 'http://judge-host:8000/v1' for `vllm serve`) and "
                "judge_model (the served model name), or pass a judge object: SGPOTrainer(..., judge=...)."
            )
        return OpenAICompatibleJudge(
            config.base_url,
            config.model,
            api_key_env=config.api_key_env,
            num_votes=config.num_votes,
            temperature=config.temperature,
            max_tokens=config.max_tokens,
            timeout=config.timeout,
            max_retries=config.max_retries,
            concurrency=config.concurrency,
            batch_timeout=config.batch_timeout,
            prompt_template=config.prompt_template_path,
            structured=config.structured_output,
        )
    if not config.model:
        raise ValueError("judge_type='transformers' needs judge_model (a model path or Hub id), or pass judge=...")
    return TransformersJudge(
        config.model,
        model_kwargs={"dtype": "auto"},
        num_votes=config.num_votes,
        temperature=config.temperature,
        max_new_tokens=config.max_tokens,
        prompt_template=config.prompt_template_path,
    )


__all__ = ["GRACE_S", "JUDGE_BOUNDS", "JUDGE_TYPES", "JudgeConfig", "judge_flag_fields", "make_judge"]
