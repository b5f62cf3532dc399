"""Resuming a run exactly: complete-checkpoint detection, the epoch-aligned sampler and the per-process state a
resumed run needs beyond the Trainer's checkpoint (:class:`ResumableTrainerMixin`)."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from typing import Any

import torch

from .cache import save_model_folder
from .run_folder import COMPLETE_MARKER, check_resume, decided_on_main, latest_complete_checkpoint, write_run_settings

logger = logging.getLogger(__name__)

# Per-process file in each checkpoint with what `ResumableTrainerMixin._resume_state` returns.
_RESUME_STATE_FILE = "grpo_family_state_{}.pt"
# A checkpoint's model weights (one of them; a DeepSpeed checkpoint has global_step* folders instead).
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin",
    "pytorch_model.bin.index.json", "adapter_model.bin",
)  # fmt: skip


def _holds_weights(folder: str) -> bool:
    return any(os.path.exists(os.path.join(folder, name)) for name in WEIGHT_FILES)


def _to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor inside (nested dicts, lists, tuples) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_device(v, device) for v in value)
    return value


class EpochAlignedSampler(torch.utils.data.Sampler):
    """TRL's ``RepeatSampler`` made resumable: pass ``e`` over the data always uses the ``e``-th shuffle.

    ``RepeatSampler`` draws one permutation per pass from a generator seeded once, so epoch ``e`` of an uninterrupted
    run uses the ``e``-th draw. A run resumed in epoch ``e`` builds a new sampler, and transformers 5 no longer replays
    the skipped epochs, so it would shuffle like epoch 0 and train on other prompts than the uninterrupted run. Before
    each pass this wrapper starts (and abandons) one pass of the wrapped sampler for every epoch it has not seen -- a
    pass draws its permutation first -- so the order is TRL's in both cases. The epoch comes from the trainer state
    (``floor(state.epoch)``; restored from the checkpoint before the dataloader is iterated), which works wherever
    accelerate wraps or skips the batch sampler.
    """

    def __init__(self, sampler: torch.utils.data.Sampler, current_epoch: Callable[[], int]):
        self.sampler = sampler
        self.current_epoch = current_epoch
        self.passes = 0
        if hasattr(sampler, "generator"):  # the same object: accelerate may synchronise it across processes
            self.generator = sampler.generator

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        while self.passes < self.current_epoch():
            next(iter(self.sampler), None)
            self.passes += 1
        self.passes += 1
        yield from self.sampler


class ResumableTrainerMixin:
    """The resume half of :class:`~grpo_family.trainers.base.GRPOFamilyTrainer`: put before ``GRPOTrainer`` in the
    bases, it marks complete checkpoints, resolves ``resume_from_checkpoint=True`` to the newest complete one, makes
    the sampler epoch-aligned and saves/restores :meth:`_resume_state` next to the RNG state."""

    def _uses_peft(self) -> bool:
        """LoRA (a PEFT model) or full fine-tuning: the run record states it, and a resume must match it."""
        from peft import PeftModel

        return isinstance(self.accelerator.unwrap_model(self.model), PeftModel)

    def _save_checkpoint(self, model, trial) -> None:
        super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()  # every process's files (RNG, optimizer shards) are written
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if self.args.should_save and os.path.isdir(folder) and not _holds_weights(folder):
            # --save_on_each_node: transformers 5's save_pretrained writes weights on global rank 0 only, so the other
            # nodes' main processes write them here (the marker must stand where the weights are).
            self._save_weights_here(folder)
        if self.args.should_save and os.path.isdir(folder):
            write_run_settings(folder, self.args, self._run_method, self.accelerator.num_processes, self._uses_peft())
            with open(os.path.join(folder, COMPLETE_MARKER), "w") as f:
                f.write(f"global_step {self.state.global_step}\n")

    def _save_weights_here(self, folder: str) -> None:
        """The model's weights and config written into ``folder`` by this process, whatever its global rank (a plain
        replicated model only: a sharded one is saved by DeepSpeed on every rank already)."""
        model = self.accelerator.unwrap_model(self.model)
        sharded = getattr(self, "is_deepspeed_enabled", False) or getattr(self, "is_fsdp_enabled", False)
        if sharded or hasattr(model, "peft_config"):  # an adapter: resume names the missing file on that node
            return
        save_model_folder(model, None, folder)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """Transformers' ``train``; ``resume_from_checkpoint=True`` picks the newest *complete* checkpoint of
        ``output_dir`` (:func:`latest_complete_checkpoint`, on the main process) rather than the newest folder. A checkpoint of another
        method or batch layout, or one that already reached the end of the run, is refused
        (:func:`grpo_family.runtime.run_folder.check_resume`)."""
        if resume_from_checkpoint is True:  # decided on the main process: every process resumes the same one
            resume_from_checkpoint = decided_on_main(lambda: latest_complete_checkpoint(self.args.output_dir))
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"No complete checkpoint in {self.args.output_dir} to resume from. Start without "
                    "resume_from_checkpoint, or pass a checkpoint folder."
                )
        if isinstance(resume_from_checkpoint, str):  # another method or batch layout, or a finished run: refused
            check_resume(
                resume_from_checkpoint, self.args, self._run_method, self.accelerator.num_processes, self._uses_peft()
            )
        return super().train(resume_from_checkpoint, *args, **kwargs)

    @property
    def _run_method(self) -> str:
        return getattr(self, "method_name", type(self).__name__)

    # A checkpoint holds the model, optimizer, scheduler, RNG states and TrainerState. On top of that each process saves
    # `_resume_state()` next to its RNG file and a resumed run hands it to `_restore_resume_state()`, so the run
    # continues as if it had not stopped. Transformers calls `_load_rng_state` before the first resumed training step.
    def _get_train_sampler(self, dataset=None):
        sampler = super()._get_train_sampler(dataset)
        return EpochAlignedSampler(sampler, lambda: math.floor(self.state.epoch or 0))

    def _resume_state(self) -> dict[str, Any]:
        """This process's state a resumed run needs beyond the Trainer's checkpoint; methods add their own entries
        (calling ``super()``) and read them back in :meth:`_restore_resume_state`. Values must be what
        ``torch.load(weights_only=True)`` reads: tensors, numbers, strings, None, lists and dicts of them.

        TRL's own: the micro-step counter and, when the checkpoint falls inside a generation batch
        (``steps_per_generation > gradient_accumulation_steps`` or ``num_iterations > 1``), the buffered generations
        the next steps train on. Without them a resumed run would generate again at the wrong step.
        """
        generate_every = self.args.steps_per_generation * self.num_iterations
        state: dict[str, Any] = {"step": self._step, "generate_every": generate_every}
        if self._buffered_inputs is not None and self._step % generate_every:
            state["buffered_inputs"] = self._buffered_inputs
        return state

    def _restore_resume_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`_resume_state` saved."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        if state.get("generate_every") != generate_every:
            logger.warning(
                "The checkpoint was written with steps_per_generation x num_iterations = %s, this run uses %s: its "
                "buffered generations are dropped and the run generates afresh.", state.get("generate_every"),
                generate_every,
            )  # fmt: skip
            return
        self._step = state["step"]
        if "buffered_inputs" in state:
            self._buffered_inputs = state["buffered_inputs"]

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        path = os.path.join(output_dir, _RESUME_STATE_FILE.format(self.args.process_index))
        torch.save(self._resume_state(), path)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        path = os.path.join(checkpoint, _RESUME_STATE_FILE.format(self.args.process_index)) if checkpoint else None
        if path is None or not os.path.isfile(path):
            if checkpoint is not None:
                logger.warning("No %s in %s: method state starts afresh.", os.path.basename(path), checkpoint)
            return
        # Loaded on the CPU, then moved: map_location=accelerator.device fails for tensors saved on "cpu:0" (MULTI_CPU).
        state = torch.load(path, map_location="cpu", weights_only=True)
        self._restore_resume_state(_to_device(state, self.accelerator.device))
