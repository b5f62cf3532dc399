"""Hand-graded (completion, gold) cases for the answer-reading rewards, as data.

Written and graded by hand before any reward was run on them: ``grade`` is what a careful human grader gives under
the extraction policy of ``docs/answer_extraction.md`` (1 right, 0 wrong, None "cannot score": the gold itself is
missing or unreadable). ``reward`` names the grpo_family reward that grades the case; ``cls`` is the class of input
(the classes of issue 21 are all here: hedges, retractions, drafts inside ``<think>``, hedges math-verify accepts,
``\\$`` money, lower-case and in-sentence letters, ``<answer>`` with an anchor inside, numeric and NaN golds,
non-integer arithmetic answers, None completions, multi-box golds, self-corrections, truncated boxes).

Used by ``tests/test_reward_cases.py`` (our rewards) and ``benchmarks/rewards.py`` (ours beside TRL's
``accuracy_reward``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NAN = float("nan")


@dataclass(frozen=True)
class Case:
    id: str
    reward: str  # "math_accuracy", "choice_accuracy", "qa_exact_match", "arithmetic"
    cls: str
    completion: Any
    gold: Any
    grade: float | None
    # The rule of the answer contract (docs/answer_extraction.md) the completion breaks, "" when it keeps it. A
    # completion that breaks the contract scores 0 in training mode whatever its grade; so a false negative (grade 1,
    # score 0) is allowed only where this is set.
    breaks: str = ""

    @property
    def expected(self) -> float | None:
        """The training-mode score: None for an unreadable gold, 0 for a broken contract, else the grade."""
        return None if self.grade is None else (0.0 if self.breaks else float(self.grade))


# These cases predate the answer contract of issue 29; the rule each one breaks under it was annotated when the
# contract was written (docs/answer_extraction.md), grades unchanged. 14 cases graded 1 break the contract (two
# answer slots, text after the slot, an option's text after the letter): their training-mode score is 0.
BREAKS = {
    **dict.fromkeys(["math-001", "math-002", "math-003", "math-004", "math-005", "math-006", "math-007"], "value"),
    **dict.fromkeys(["math-013", "math-023", "math-024", "math-025", "math-026", "math-027", "math-028"], "value"),
    **dict.fromkeys(["math-048", "math-058"], "value"),
    **dict.fromkeys(["math-008", "math-009", "math-034", "math-054", "math-055"], "after"),
    **dict.fromkeys(["math-010", "math-011", "math-012", "math-014", "math-017", "math-050", "math-051"], "slots"),
    **dict.fromkeys(["math-053"], "slots"),
    **dict.fromkeys(["math-018"], "think"),
    **dict.fromkeys(["math-056", "math-057"], "box"),
    **dict.fromkeys(["choice-001", "choice-002", "choice-003", "choice-004", "choice-005", "choice-006"], "value"),
    **dict.fromkeys(["choice-008", "choice-009", "choice-016", "choice-025", "choice-030", "choice-031"], "value"),
    **dict.fromkeys(["choice-035", "choice-036"], "value"),
    **dict.fromkeys(["choice-010"], "after"),
    **dict.fromkeys(["choice-007", "choice-019", "choice-033"], "slots"),
    **dict.fromkeys(["qa-014"], "after"),
    **dict.fromkeys(["qa-017", "qa-018"], "slots"),
    **dict.fromkeys(["qa-027"], "value"),
    **dict.fromkeys(["arith-012", "arith-013", "arith-014", "arith-015", "arith-016", "arith-020"], "value"),
    **dict.fromkeys(["arith-017", "arith-018", "arith-019", "arith-025", "arith-026"], "slots"),
    **dict.fromkeys(["arith-021"], "after"),
    **dict.fromkeys(["arith-024"], "think"),
    **dict.fromkeys(["math-093", "math-094"], "value"),
}


def _cases(reward: str, prefix: str, rows: list[tuple]) -> list[Case]:
    return [Case(f"{prefix}-{i:03d}", reward, cls, completion, gold, grade, BREAKS.get(f"{prefix}-{i:03d}", ""))
            for i, (cls, completion, gold, grade) in enumerate(rows, 1)]  # fmt: skip


MATH = _cases(
    "math_accuracy",
    "math",
    [
        # hedged plain-text answers and retractions
        ("hedge", r"So $3 \times 6 = 18$. The final answer is 18 or 21.", "18", 0),
        ("hedge", "The final answer is 18 or 21.", "21", 0),
        ("retraction", "The final answer is 18. Just kidding, it is 21.", "18", 0),
        ("retraction", "The final answer is 18. Just kidding, it is 21.", "21", 0),
        ("hedge", "The answer is either 18 or 21.", "18", 0),
        ("hedge", "The answer is 18, or possibly 21.", "18", 0),
        ("hedge", "Final answer: 18 (or 21 if we count the teacher)", "18", 0),
        ("retraction", "The answer is 18.\n\nHmm, actually it should be 21.", "18", 0),
        ("retraction", "Answer: 18\nWait, that's wrong. Let me redo it.", "18", 0),
        ("hedge", r"\boxed{18} or \boxed{21}", "18", 0),
        ("hedge", r"\boxed{18} or \boxed{21}", "21", 0),
        ("hedge", r"The final answer is: $\boxed{18}$ or $\boxed{21}$", "21", 0),
        ("hedge", "<answer>18 or 21</answer>", "18", 0),
        ("hedge", "<answer>18</answer> or <answer>21</answer>", "18", 0),
        # a draft answer inside <think> never counts
        ("think_draft", r"<think>Maybe <answer>18</answer> works.</think> The answer is \boxed{21}", "18", 0),
        ("think_draft", r"<think>Maybe <answer>18</answer> works.</think> The answer is \boxed{21}", "21", 1),
        ("think_draft", "<think>The answer is 18.</think>", "18", 0),
        ("think_draft", r"<think>Let me compute: 6*3 = 18. So \boxed{18}", "18", 0),
        ("think_draft", r"<think>\boxed{18}</think>The answer is \boxed{21}.", "18", 0),
        ("think_ok", r"</think>The answer is \boxed{18}.", "18", 1),
        ("think_ok", "<think>hmm</think>\n\nThe final answer is $\\boxed{18}$.", "18", 1),
        ("think_ok", r"<think>6*7</think><answer>\boxed{42}</answer>", "42", 1),
        # hedges math-verify itself accepts (it drops \text{...}, reads one side of a relation)
        ("mv_hedge", r"\boxed{7 \text{ (or maybe 8)}}", "7", 0),
        ("mv_hedge", r"The answer is \boxed{18 \approx 21}", "18", 0),
        ("mv_hedge", r"\boxed{21 = 18}", "18", 0),
        ("mv_hedge", r"\boxed{5\text{ or }6}", "5", 0),
        ("mv_hedge", r"\boxed{18 \text{ or } 21}", "21", 0),
        ("mv_hedge", r"\boxed{18 + 1 = 19}", "18", 0),
        ("relation_ok", r"\boxed{x = 5}", "5", 1),
        ("relation_ok", r"\boxed{y = 2x + 1}", "2x+1", 1),
        ("unit", r"\boxed{5 \text{ cm}}", "5", 1),
        # \$ is a dollar sign, in completions and in golds
        ("dollar", r"The total cost is \boxed{\$5}.", "5", 1),
        ("dollar", r"\boxed{\$1,234.50}", "1234.50", 1),
        ("dollar", r"She pays \boxed{\$18.90} in total.", r"\$18.90", 1),
        ("dollar", r"\boxed{18.90}", r"\$18.90", 1),
        ("dollar", r"\boxed{18.9}", r"\$18.90", 1),
        ("dollar", r"\boxed{19.80}", r"\$18.90", 0),
        ("dollar", r"Total: \boxed{\$ 42}", "42", 1),
        ("dollar", r"The answer is \$18.", "18", 1),
        ("dollar", "The answer is $18$ dollars.", "18", 1),
        # plain text, <answer> tags, \fbox, self-corrections, truncated boxes
        ("plain", "The final answer is 42.", "42", 1),
        ("plain", "Answer: 42", "42", 1),
        ("plain", "42", "42", 1),
        ("plain", "The answer is 18.", "18", 1),
        ("plain", "The final answer is $\\frac{1}{3}$.", r"\frac13", 1),
        ("plain", "The answer is 0.5", "1/2", 1),
        ("plain", "The final answer is 1,234.", "1234", 1),
        ("plain", "I think it's 18.", "18", 1),
        ("answer_tag", "<answer>42</answer>", "42", 1),
        ("answer_tag", "<answer>18</answer> Actually no, <answer>21</answer>", "21", 1),
        ("answer_tag", "<answer>18</answer> Actually no, <answer>21</answer>", "18", 0),
        ("fbox", r"\fbox{42}", "42", 1),
        (
            "self_correction",
            r"First I got \boxed{40}. Wait, I made an error: 6*7 = 42, so the answer is \boxed{42}.",
            "42",
            1,
        ),  # fmt: skip
        ("self_correction", r"\boxed{18}. Let me double-check: $3 \times 6 = 18$. Yes.", "18", 1),
        ("self_correction", r"Thus the answer is \boxed{18}. I hope this helps!", "18", 1),
        ("truncated", r"The answer is \boxed{4", "4", 0),
        ("truncated", r"We get \boxed{12}. Then the total is \boxed{1", "12", 0),
        ("truncated", r"The answer is \boxed{}", "0", 0),
        # equivalence and plain wrong answers
        ("equivalent", r"\boxed{\frac{1}{2}}", "0.5", 1),
        ("equivalent", r"\boxed{0.5}", r"\frac{1}{2}", 1),
        ("equivalent", r"\boxed{\frac{2}{4}}", r"\frac12", 1),
        ("equivalent", r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}", 1),
        ("equivalent", r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1),
        ("equivalent", r"\boxed{1.5}", r"\frac{3}{2}", 1),
        ("equivalent", r"\boxed{(1, 2)}", "(1,2)", 1),
        ("equivalent", r"\boxed{x^2 + 1}", "1 + x^2", 1),
        ("equivalent", r"\boxed{\pi}", r"\pi", 1),
        ("equivalent", r"\boxed{\text{18}}", "18", 1),
        ("equivalent", r"\boxed{-3}", "-3", 1),
        ("equivalent", r"\boxed{\frac{1}{2}}", "1/2", 1),
        ("equivalent", r"\boxed{1{,}234}", "1234", 1),
        ("equivalent", r"\boxed{[0, 1)}", "[0,1)", 1),
        ("wrong", r"\boxed{(2, 1)}", "(1,2)", 0),
        ("wrong", r"\boxed{43}", "42", 0),
        ("wrong", r"\boxed{3.14}", r"\pi", 0),
        ("wrong", r"\boxed{3}", "-3", 0),
        ("wrong", "The answer is 18/21.", "18", 0),
        # golds: GSM8K, reference solutions, multi-box (tuple) golds, missing or NaN golds
        ("gold_form", r"\boxed{18}", "Natalia sold 9 clips, twice.\n#### 18", 1),
        ("gold_form", r"\boxed{72}", "She sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", 1),
        ("gold_form", r"\boxed{3}", r"We find $x=\boxed{3}$.", 1),
        ("gold_form", r"\boxed{42}", "$42$", 1),
        ("multi_box_gold", r"\boxed{2, 3}", "2, 3", 1),
        ("multi_box_gold", r"\boxed{3, 2}", "2, 3", 1),
        ("multi_box_gold", r"\boxed{2}", "2, 3", 0),
        ("bad_gold", r"\boxed{3}", NAN, None),
        ("bad_gold", r"\boxed{3}", None, None),
        ("bad_gold", r"\boxed{3}", "", None),
        # issue 40: a line "Answer" then a maths span (Math-Verify's fixtures mv-all-125..128, 130), and the twin
        # with two different spans after it, which commits to neither
        ("answer_then_math", r"Answer \[ 9 \]", "$9$", 1),
        ("answer_then_math", "Answer $ 9 $", "$9$", 1),
        ("answer_then_math", "Answer $$ 9 $$", "$9$", 1),
        ("answer_then_math", r"Answer \( 9 \)", "$9$", 1),
        ("answer_then_math", r"Answer \( (9+1) \)", "$10$", 1),
        ("answer_then_math", "Answer $ 9 $ or $ 8 $", "$9$", 0),
        ("answer_then_math", r"Answer \( 9 \) or \( 8 \)", "$8$", 0),
    ],
)

CHOICE = _cases(
    "choice_accuracy",
    "choice",
    [
        ("hedge", "The answer is A or B", "A", 0),
        ("hedge", "Answer: B, C", "B", 0),
        ("hedge", "(B) and (D)", "B", 0),
        ("hedge", "<answer>B. Paris C. Lyon</answer>", "B", 0),
        ("hedge", "The answer is (A) or (C), probably A.", "A", 0),
        ("hedge", "Both A and C are correct.", "A", 0),
        ("hedge", r"\boxed{A} or \boxed{B}", "A", 0),
        ("retraction", "The answer is B. Wait, no, it is D.", "B", 0),
        ("retraction", "The answer is B. Wait, no, it is D.", "D", 0),
        ("retraction", "Answer: B\nActually, I think it is C.", "C", 0),
        ("lowercase", "So the answer is (b).", "B", 1),
        ("lowercase", "<answer>c</answer>", "C", 1),
        ("lowercase", "Answer: c", "C", 1),
        ("in_sentence", "D is the answer.", "D", 1),
        ("in_sentence", "Option B is correct.", "B", 1),
        ("in_sentence", "The answer is C, since A and B are wrong.", "C", 1),
        ("think_draft", "<think>I pick <answer>A</answer> maybe.</think><answer>B</answer>", "A", 0),
        ("think_draft", "<think>I pick <answer>A</answer> maybe.</think><answer>B</answer>", "B", 1),
        ("think_draft", "<think>The answer is A</think>", "A", 0),
        ("plain", "<answer>C</answer>", "C", 1),
        ("plain", "<answer>C</answer>", "c", 1),
        ("plain", "The correct option is C.", "C", 1),
        ("plain", r"\boxed{C}", "C", 1),
        ("plain", r"\boxed{\text{C}}", "C", 1),
        ("plain", "C. Pneumonia", "C", 1),
        ("plain", "Answer: E", "E", 1),
        ("plain", "A", "A", 1),
        ("plain", "(A)", "A", 1),
        ("plain", "**Answer: B**", "B", 1),
        ("plain", "<answer>B) Paris</answer>", "B", 1),
        ("plain", "Answer: (C) Mitochondria", "C", 1),
        ("plain", "The answer is: \n\nB", "B", 1),
        ("self_correction", "<answer>A</answer><answer>C</answer>", "C", 1),
        ("wrong", "Answer: D", "B", 0),
        ("wrong", "I am not sure.", "A", 0),
        ("wrong", "The answer is a bit unclear, but I'd go with neither.", "A", 0),
        ("bad_gold", "<answer>B</answer>", 1, None),
        ("bad_gold", "<answer>B</answer>", None, None),
    ],
)

QA = _cases(
    "qa_exact_match",
    "qa",
    [
        ("anchor_in_tag", "<answer>The answer is Paris</answer>", "Paris", 1),
        ("anchor_in_tag", "<answer>Answer: Paris</answer>", "Paris", 1),
        ("plain", "<answer>Paris</answer>", ["Paris", "Paris, France"], 1),
        ("plain", "<answer>the Eiffel Tower</answer>", "Eiffel Tower", 1),
        ("plain", "Answer: Barack Obama", "Barack Obama", 1),
        ("plain", "The final answer is Paris.", "Paris", 1),
        ("plain", r"\boxed{\text{Paris}}", "Paris", 1),
        ("plain", "<answer>Paris</answer>", {"text": ["Paris"], "answer_start": [0]}, 1),
        ("plain", "<answer>Paris</answer>", ["London", None, "Paris"], 1),
        ("plain", "<answer>Trick or Treat</answer>", "Trick or Treat", 1),
        ("hedge", "<answer>Paris or London</answer>", "Paris", 0),
        ("hedge", "<answer>Paris, or maybe Lyon</answer>", "Paris", 0),
        ("retraction", "The answer is Paris. Just kidding, it is London.", "Paris", 0),
        ("retraction", "<answer>Paris</answer>\nActually, I'm not sure, it might be Lyon.", "Paris", 0),
        ("think_draft", "<think><answer>London</answer></think><answer>Paris</answer>", "Paris", 1),
        ("think_draft", "<think><answer>London</answer></think><answer>Paris</answer>", "London", 0),
        ("think_draft", "<think>Answer: Paris</think>", "Paris", 0),
        ("self_correction", "<answer>Paris</answer> Wait, no: <answer>Lyon</answer>", "Lyon", 1),
        ("numeric_gold", "<answer>1912</answer>", 1912, 1),
        ("numeric_gold", "<answer>3.5</answer>", 3.5, 1),
        ("numeric_gold", "<answer>1913</answer>", 1912, 0),
        ("bad_gold", "<answer>1912</answer>", NAN, None),
        ("bad_gold", "<answer>Paris</answer>", None, None),
        ("bad_gold", "<answer>Paris</answer>", [], None),
        ("wrong", "<answer>yes</answer>", "no", 0),
        ("wrong", "<answer>Obama</answer>", "Barack Obama", 0),
        ("wrong", "<answer></answer>", "Paris", 0),
        ("wrong", "<answer>London</answer>", "Paris", 0),
    ],
)

ARITHMETIC = _cases(
    "arithmetic",
    "arith",
    [
        ("plain", "5*3=15\n7+15=22\n22-4=18\nAnswer: 18", "18", 1),
        ("plain", "Answer: 18.", "18", 1),
        ("plain", "answer: 18", "18", 1),
        ("plain", "Answer:18", "18", 1),
        ("plain", "Answer: 18\n", "18", 1),
        ("plain", "Answer: 18", 18, 1),
        ("plain", "Answer: -18", "-18", 1),
        ("plain", "The answer is 18", "18", 1),
        ("plain", [{"role": "assistant", "content": "Answer: 18"}], "18", 1),
        ("not_integer", "Answer: 18.5", "18", 0),
        ("not_integer", "Answer: 18,000", "18", 0),
        ("not_integer", "Answer: 18/2", "18", 0),
        ("not_integer", "Answer: 18e3", "18", 0),
        ("not_integer", "Answer: 18 + 1 = 19", "18", 0),
        ("not_integer", "Answer: 18 18", "18", 0),
        ("not_integer", "Answer: 1" + "8" * 5000, "18", 0),
        ("self_correction", "Answer: 17\nAnswer: 18", "18", 1),
        ("self_correction", "Answer: 18\nAnswer: 17", "18", 0),
        ("self_correction", "Answer: 18\nAnswer: 18", "18", 1),
        ("hedge", "Answer: 18 or 21", "18", 0),
        ("retraction", "Answer: 18\nJust kidding, it is 21.", "18", 0),
        ("think_draft", "<think>Answer: 18</think>Answer: 21", "18", 0),
        ("think_draft", "<think>Answer: 18</think>Answer: 21", "21", 1),
        ("think_draft", "<think>Answer: 18", "18", 0),
        ("empty", None, "18", 0),
        ("empty", "", "18", 0),
        ("bad_gold", "Answer: 18", "abc", None),
    ],
)

ALL_CASES: list[Case] = MATH + CHOICE + QA + ARITHMETIC
