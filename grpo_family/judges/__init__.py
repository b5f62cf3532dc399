"""Step judges: what SGPO asks for the first wrong step of a response (docs/methods/sgpo.md §3).

* :mod:`.step_judges` -- the request and verdict types, the prompt template (``judge_prompt.txt``) and parser, and
  the four judges: ``OpenAICompatibleJudge`` (vLLM / hosted APIs), ``TransformersJudge`` (a local model),
  ``ProgrammaticJudge`` (the bundled task, exact) and ``HeuristicReferenceJudge`` (numbers checked against the
  reference solution; crude, for smoke tests and CI);
* :mod:`.steps` -- the one step splitter every judge sees the response through;
* :mod:`.config` -- the judge's settings as one object (:class:`JudgeConfig`, what ``SGPOConfig.judge`` holds) and
  :func:`make_judge`;
* :mod:`.batch` -- judging a generation batch: the items each completion becomes, one call under a deadline.

Importing this package needs only the standard library (torch and transformers are imported when a verdict is
voted or a local model is used), so :mod:`grpo_family.rewards` re-exports the judges without getting heavier.
"""

from .config import JUDGE_TYPES, JudgeConfig, make_judge
from .step_judges import (
    DEFAULT_PROMPT_PATH,
    FAIL,
    HeuristicReferenceJudge,
    JudgeRequest,
    JudgeVerdict,
    OpenAICompatibleJudge,
    ProgrammaticJudge,
    PromptTemplate,
    StepJudge,
    TransformersJudge,
    final_answer_step,
    has_final_answer,
    parse_verdict,
    reference_numbers,
    stated_results,
    strip_reasoning,
    verdict_schema,
)
from .steps import SPLITTERS, merge_steps, number_steps, split_steps

__all__ = [
    "DEFAULT_PROMPT_PATH",
    "FAIL",
    "JUDGE_TYPES",
    "SPLITTERS",
    "HeuristicReferenceJudge",
    "JudgeConfig",
    "JudgeRequest",
    "JudgeVerdict",
    "OpenAICompatibleJudge",
    "ProgrammaticJudge",
    "PromptTemplate",
    "StepJudge",
    "TransformersJudge",
    "final_answer_step",
    "has_final_answer",
    "make_judge",
    "merge_steps",
    "number_steps",
    "parse_verdict",
    "reference_numbers",
    "split_steps",
    "stated_results",
    "strip_reasoning",
    "verdict_schema",
]
