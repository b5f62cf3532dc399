"""docs/architecture.md §7 ("Add a method") names every step a new method takes: a throw-away method, written in a
temporary package step by step as the section says, passes the generated-docs, bounds, memory and method-case checks
the real methods pass, and each check fails while its step is missing."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import tiny_config_kwargs

import grpo_family
from grpo_family.algorithms import surrogates

ROOT = Path(__file__).resolve().parents[1]
NAME = "throwaway"
PACKAGE = "throwaway_method_pkg"

ALGORITHM = '''
"""A throw-away surrogate: the unclipped ratio times the advantage."""
import torch
from grpo_family.algorithms.surrogates import SurrogateOutput, register_surrogate


@register_surrogate("throwaway")
def throwaway_surrogate(logps, old_logps, advantages, mask, *, scale, importance_sampling_ratio=None):
    """``(N, T)``: ``-scale * exp(logp - logp_old) * A``."""
    advantages = advantages if advantages.dim() == 2 else advantages[:, None]
    loss = -scale * torch.exp(logps - old_logps) * advantages
    none = torch.zeros_like(loss, dtype=torch.bool)
    return SurrogateOutput(loss, none, none, {"scale": torch.full((loss.size(0),), float(scale))})
'''

TRAINER = '''
"""A throw-away method (docs/architecture.md §7)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from grpo_family.bounds import Bound, Float
from grpo_family.trainers.base import GRPOFamilyConfig, GRPOFamilyTrainer

from . import algorithms  # noqa: F401 - registers the surrogate


@dataclass
class ThrowawayConfig(GRPOFamilyConfig):
    """GRPOConfig plus a scale (A throw-away paper, 2026)."""

    field_bounds: ClassVar[dict[str, Bound]] = {"throwaway_scale": Float(0, min_open=True)}

    throwaway_scale: float = field(default=1.0, metadata={"help": "Scale of the objective, > 0. Default 1.0."})

    def __post_init__(self):
        super().__post_init__()
        if self.throwaway_scale > 10 and self.beta == 0.0:
            raise ValueError("throwaway_scale > 10 needs beta > 0: set beta.")


class ThrowawayTrainer(GRPOFamilyTrainer):
    """A throw-away method."""

    method_name = "throwaway"
    surrogate = "throwaway"
    summary = "the unclipped ratio, scaled"
    reported_result = "none"
    _name = "Throwaway"
    _paper = {"title": "A Throw-away Paper", "id": "0000.00000", "citation": "@article{throwaway}"}

    def surrogate_options(self):
        return {"scale": self.args.throwaway_scale}
'''

CASE = """
from method_cases import MethodCase

CASE = MethodCase(bad_config=({"throwaway_scale": 20.0}, "throwaway_scale > 10 needs beta > 0"), host_syncs=(13, 1),
                  metric="throwaway/scale")
"""

DOCUMENT = """# Throwaway

## 4. Configuration

| Field | Default | Meaning |
|---|---|---|
| `throwaway_scale` | `1.0` | Scale of the objective. |
"""

RECIPE = """# Throw-away, small: one 24 GB GPU.
method: throwaway
model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
dataset_name: openai/gsm8k
num_generations: 8
per_device_train_batch_size: 16
max_completion_length: 512
"""


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def new_method(tmp_path, monkeypatch):
    """Steps 1-3 of §7 in a temporary package: the maths, the trainer, the registration."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "algorithms.py").write_text(textwrap.dedent(ALGORITHM))  # step 1
    (package / "trainer.py").write_text(textwrap.dedent(TRAINER))  # step 2
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(surrogates, "SURROGATES", dict(surrogates.SURROGATES))  # the registration is undone after
    module = f"{PACKAGE}.trainer"
    monkeypatch.setitem(grpo_family._METHOD_CLASSES, NAME, (module, "ThrowawayConfig", "ThrowawayTrainer"))  # step 3
    for cls in ("ThrowawayConfig", "ThrowawayTrainer"):
        monkeypatch.setitem(grpo_family._LAZY, cls, (module, cls))
    monkeypatch.delattr(grpo_family, "METHODS", raising=False)  # computed again from _METHOD_CLASSES
    try:
        yield tmp_path
    finally:
        for name in ("ThrowawayConfig", "ThrowawayTrainer"):
            vars(grpo_family).pop(name, None)
        for name in [m for m in sys.modules if m.startswith(PACKAGE)]:
            del sys.modules[name]


def test_the_section_names_every_step():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("## 7. Add a method") :]
    for step in (
        "grpo_family/algorithms/<method>.py", "@register_estimator", "@register_loss_term", "@register_surrogate",
        "grpo_family/trainers/<method>.py", "field_bounds", "_METHOD_CLASSES", "docs/methods/<method>.md",
        "tests/test_<method>.py", "tests/method_cases/<method>.py", "examples/recipes/<method>_small.yaml",
        "# Memory layout:", "benchmarks/memory.py", "python docs/generate.py", "benchmarks/learning.py --methods <method>",
        "benchmarks/compute.py --only <method>", "tests/test_add_a_method.py",
    ):  # fmt: skip
        assert step in section, f"docs/architecture.md §7 does not name {step!r}"


def test_a_new_method_passes_the_shared_checks(new_method, monkeypatch):
    tmp = new_method
    from grpo_family import METHODS

    assert NAME in METHODS
    config_cls, trainer_cls = METHODS[NAME]

    # The generated tables (docs/generate.py) take it from METHODS, with the stage it uses.
    generate = _load(ROOT / "docs" / "generate.py", "_generate_for_test")
    assert f"| `{NAME}` | *A Throw-away Paper* | the unclipped ratio, scaled |" in generate.methods_block()
    (row,) = [line for line in generate.method_stages_block().splitlines() if line.startswith(f"| `{NAME}` |")]
    assert "| `surrogate` |" in row and f"[{NAME}.md](methods/{NAME}.md)" in row

    # Step 4, the document: its configuration table must list the config's fields (tests/test_docs.py).
    import test_docs

    monkeypatch.setitem(test_docs.CONFIGS, NAME, (config_cls.__module__, config_cls.__name__))
    monkeypatch.setattr(test_docs, "DOCS", tmp / "docs")
    (tmp / "docs").mkdir()
    with pytest.raises(FileNotFoundError, match=f"{NAME}.md"):
        test_docs.test_config_table_lists_every_field(NAME)
    (tmp / "docs" / f"{NAME}.md").write_text(DOCUMENT.replace("`throwaway_scale`", "`scale`"))
    with pytest.raises(AssertionError, match=r"lacks \['throwaway_scale'\]"):
        test_docs.test_config_table_lists_every_field(NAME)
    (tmp / "docs" / f"{NAME}.md").write_text(DOCUMENT)
    test_docs.test_config_table_lists_every_field(NAME)

    # Step 2's bounds beside the fields (tests/test_bounds.py): every field bounded, every bad value refused.
    import test_bounds

    monkeypatch.setitem(test_bounds.METHOD_CONFIGS, NAME, config_cls)
    monkeypatch.setitem(test_bounds.ALL_CONFIGS, NAME, config_cls)
    test_bounds.test_every_field_of_every_config_has_a_bound(NAME)
    test_bounds.test_every_out_of_bounds_value_is_refused_when_the_config_is_built(NAME, tmp)
    test_bounds.test_defaults_and_built_configs_are_within_bounds(NAME, tmp)
    bound = config_cls.field_bounds.pop("throwaway_scale")
    with pytest.raises(AssertionError, match=r"no bound declared for \['throwaway_scale'\]"):
        test_bounds.test_every_field_of_every_config_has_a_bound(NAME)
    config_cls.field_bounds["throwaway_scale"] = bound

    # Step 5, the method case (tests/method_cases/<method>.py): the shared tests read it.
    import test_stages

    with pytest.raises(ModuleNotFoundError, match=f"method_cases.{NAME}"):
        test_stages.test_every_method_has_a_test_case()
    case_file = tmp / "case.py"
    case_file.write_text(textwrap.dedent(CASE))
    monkeypatch.setitem(sys.modules, f"method_cases.{NAME}", _load(case_file, f"method_cases.{NAME}"))
    test_stages.test_every_method_has_a_test_case()
    test_stages.test_every_stage_is_a_method_of_the_base_class_and_every_override_is_a_stage()
    import test_hostile_inputs  # (its BAD_CONFIGS reads every method's case at import)
    from method_cases import case

    monkeypatch.setitem(test_hostile_inputs.BAD_CONFIGS, NAME, case(NAME).bad_config)
    # In a whole-suite run that module was imported before the registration above, with the METHODS of then.
    monkeypatch.setattr(test_hostile_inputs, "METHODS", grpo_family.METHODS)
    test_hostile_inputs.test_incompatible_config_is_refused_when_built(
        NAME, lambda **overrides: tiny_config_kwargs(tmp / "out", **overrides)
    )

    # Step 6, the recipes and their hardware layout (tests/test_memory_estimator.py).
    import test_memory_estimator

    memory = test_memory_estimator.memory  # benchmarks/memory.py as that test imports it
    recipe = tmp / f"{NAME}_small.yaml"
    recipe.write_text(RECIPE)
    with pytest.raises(AssertionError, match="state its hardware in its header"):
        test_memory_estimator.test_every_recipe_has_a_layout_and_a_known_model(recipe)
    recipe.write_text("# Memory layout: 1 x 24 GB; 24 GB per GPU, 1 training process, no ZeRO\n" + RECIPE)
    test_memory_estimator.test_every_recipe_has_a_layout_and_a_known_model(recipe)
    assert re.search(rf"\| `{NAME}_small` \| 1 x 24 GB \|", memory.table([recipe]))
