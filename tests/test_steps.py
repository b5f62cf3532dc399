"""Step splitting shared by every SGPO judge (docs/methods/sgpo.md §2.2, §3.3)."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_family.judges.steps import merge_steps, number_steps, split_steps

# Words without sentence punctuation, "$" or newlines, so the expected split is known by construction.
word = st.text(alphabet="abcxyz0123456789+=()", min_size=1, max_size=6)
phrase = st.lists(word, min_size=1, max_size=5).map(" ".join)
phrases = st.lists(phrase, min_size=1, max_size=12)


def test_paragraphs_are_steps():
    text = "First we expand.\nThen simplify.\n\n  Next, solve for x.  \n\n\n\nSo x = 3."
    assert split_steps(text) == ["First we expand.\nThen simplify.", "Next, solve for x.", "So x = 3."]


def test_blank_line_with_spaces_and_crlf_separate_paragraphs():
    assert split_steps("a\n   \t\nb") == ["a", "b"]
    assert split_steps("a\r\n\r\nb") == ["a", "b"]


def test_fallback_to_lines_when_one_paragraph_has_several_lines():
    text = "<think>\nLet n = 4.\nThen 2n = 8.\n</think>\nAnswer: 8"
    assert split_steps(text) == ["<think>", "Let n = 4.", "Then 2n = 8.", "</think>", "Answer: 8"]


def test_fallback_to_sentences_on_one_line():
    text = "We have 1.5 apples. Double it! Is that 3? Yes it is"
    assert split_steps(text) == ["We have 1.5 apples.", "Double it!", "Is that 3?", "Yes it is"]


def test_sentences_are_not_split_inside_maths():
    text = "Take $a = 1. b = 2$ as given. Then $$x. y$$ holds. Also \\(p. q\\) and \\[u! v\\] too. Cost \\$5. Done"
    assert split_steps(text) == [
        "Take $a = 1. b = 2$ as given.",
        "Then $$x. y$$ holds.",
        "Also \\(p. q\\) and \\[u! v\\] too.",
        "Cost \\$5.",
        "Done",
    ]


def test_unclosed_dollar_protects_the_rest():
    assert split_steps("Fine. Then $x. y. z") == ["Fine.", "Then $x. y. z"]


def test_one_blob_is_one_step_and_empty_is_zero_steps():
    assert split_steps("  x squared plus one  ") == ["x squared plus one"]
    assert split_steps("") == []
    assert split_steps(" \n\n\t \n") == []


def test_splitter_option_starts_the_chain_later():
    text = "A. B.\nC.\n\nD."
    assert split_steps(text) == ["A. B.\nC.", "D."]
    assert split_steps(text, splitter="line") == ["A. B.", "C.", "D."]
    assert split_steps(text, splitter="sentence") == ["A.", "B.", "C.", "D."]
    with pytest.raises(ValueError):
        split_steps(text, splitter="token")


def test_max_steps_merges_into_nearly_equal_contiguous_blocks():
    steps = [f"s{i}" for i in range(7)]
    assert merge_steps(steps, 3) == ["s0\n\ns1\n\ns2", "s3\n\ns4", "s5\n\ns6"]
    assert merge_steps(steps, 10) == steps
    text = "\n\n".join(steps)
    assert split_steps(text, max_steps=3) == merge_steps(steps, 3)
    # Merged line steps are re-joined with the separator they were split on.
    assert split_steps("a\nb\nc", max_steps=2) == ["a\nb", "c"]
    assert split_steps("a. b. c.", max_steps=2) == ["a. b.", "c."]
    with pytest.raises(ValueError):
        merge_steps(steps, 0)


def test_number_steps_renders_the_judge_format():
    assert number_steps(["Let x = 2.", "So 2x = 4."]) == "[1] Let x = 2.\n[2] So 2x = 4."
    assert number_steps([]) == ""


@settings(max_examples=60, deadline=None)
@given(phrases, st.sampled_from(["\n\n", "\n \n", "\n\n\n"]))
def test_paragraph_split_recovers_the_paragraphs(parts, sep):
    assert split_steps(sep.join(parts)) == [p.strip() for p in parts]


@settings(max_examples=60, deadline=None)
@given(phrases)
def test_single_newlines_recover_the_lines(parts):
    assert split_steps("\n".join(parts)) == [p.strip() for p in parts]


@settings(max_examples=60, deadline=None)
@given(phrases, st.sampled_from([". ", "! ", "? "]))
def test_sentence_split_recovers_the_sentences(parts, end):
    text = end.join(parts) + end.strip()
    expected = [p.strip() + end.strip() for p in parts]
    assert split_steps(text) == expected


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet="ab .!?$\n\t\\[]()", max_size=60), st.one_of(st.none(), st.integers(1, 6)))
def test_steps_are_stripped_nonempty_in_order_and_bounded(text, max_steps):
    steps = split_steps(text, max_steps=max_steps)
    assert all(s and s == s.strip() for s in steps)
    assert (len(steps) == 0) == (text.strip() == "")
    if max_steps is not None:
        assert len(steps) <= max_steps
    # No character is invented or lost apart from whitespace, and the order is kept.
    squash = re.compile(r"\s+")
    assert squash.sub("", "".join(steps)) == squash.sub("", text)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="ab\n", min_size=1, max_size=8), min_size=1, max_size=20), st.integers(1, 8))
def test_merge_keeps_every_step_in_order(steps, max_steps):
    blocks = merge_steps(steps, max_steps, joiner="|")
    assert "|".join(blocks) == "|".join(steps)
    assert len(blocks) == min(len(steps), max_steps)
    sizes = [b.count("|") + 1 for b in blocks]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@settings(max_examples=40, deadline=None)
@given(phrases)
def test_numbering_is_one_based_and_in_order(parts):
    rendered = number_steps(parts).split("\n")
    assert rendered == [f"[{j}] {p}" for j, p in enumerate(parts, start=1)]
