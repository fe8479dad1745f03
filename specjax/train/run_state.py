"""Orbax checkpoints of the whole training state: params, optimizer state, step and the data
RNG state, so a killed run resumes exactly where its last save left it. Arrays are saved in
their shards and restored into the shardings of the target (on any mesh)."""

from __future__ import annotations

from pathlib import Path

import orbax.checkpoint as ocp

from specjax import sharding


class Checkpointer:
    """Saves/restores {params, opt_state} plus a JSON `meta` (step, data RNG state)."""

    def __init__(self, directory: str | Path, keep: int = 2):
        self.manager = ocp.CheckpointManager(
            Path(directory).absolute(),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False,
                                                 create=True))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: dict, meta: dict) -> None:
        if self.manager.latest_step() == step:
            return
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()

    def restore(self, target: dict, step: int | None = None) -> tuple[dict, dict]:
        """(state shaped and sharded like `target`, meta) from `step` (default: the latest);
        abstract leaves without a sharding land on the first local device."""
        step = self.manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.manager.directory}")
        abstract = sharding.abstract(target)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out.state, out.meta

    def close(self) -> None:
        self.manager.close()
