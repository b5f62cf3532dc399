"""Integrations with the engines grpo_family runs on, where their defaults do not work as they are:
:mod:`.vllm_cpu` (vLLM's CPU build: colocated weight sync, start-up checks, the child-process environment)."""
