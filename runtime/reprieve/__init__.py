"""Reprieve runtime: preemption-safe checkpointing for JAX training."""
