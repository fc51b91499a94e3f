"""The validation / test hooks shared by the example LightningModules."""
from __future__ import annotations

__all__ = ["EvalHooks"]


class EvalHooks:
    """Mixin (put it before ``LightningModule``): validation and test both run ``self._eval_step(batch)`` per
    batch and ``self._eval_end(stage)`` (``"val"`` / ``"test"``) at the end of the epoch."""

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch)

    def on_validation_epoch_end(self):
        self._eval_end("val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch)

    def on_test_epoch_end(self):
        self._eval_end("test")
