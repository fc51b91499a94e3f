"""The validation / test hooks and training pieces shared by the example LightningModules."""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["EvalHooks", "PackedLoaders"]


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


class PackedLoaders:
    """Mixin of a datamodule with ``train`` / ``val`` / ``test`` item lists (``val`` may be ``None``), ``batch_size``,
    ``eval_batch_size``, ``seed``, ``validate_on_test`` and a ``collate`` function: the training batches are shuffled
    (seeded), the others in a fixed order; without ``val`` the validation loader is the test one if
    ``validate_on_test``, else empty."""

    def train_dataloader(self):
        g = torch.Generator().manual_seed(self.seed)
        return torch.utils.data.DataLoader(self.train, batch_size=self.batch_size, shuffle=True, generator=g,
                                           collate_fn=self.collate)

    def _eval_loader(self, items):
        return torch.utils.data.DataLoader(items, batch_size=self.eval_batch_size, shuffle=False,
                                           collate_fn=self.collate)

    def val_dataloader(self):
        if self.val is not None:
            return self._eval_loader(self.val)
        return self._eval_loader(self.test) if self.validate_on_test else []

    def test_dataloader(self):
        return self._eval_loader(self.test)

    def bcfw_dataloader(self):
        """All training examples in a fixed order (the callback's feature pass)."""
        return self._eval_loader(self.train)

    def bcfw_val_dataloader(self):
        """The held-out examples (``val``) in a fixed order: the held-out data on which
        :class:`~torch_bcfw.lightning.lam_choice.LamChoice` chooses the head's ``lam``."""
        if self.val is None:
            raise ValueError(f"{type(self).__name__} has no validation split for bcfw_val_dataloader (give it one, or "
                             "LamChoice(holdout=<fraction>))")
        return self._eval_loader(self.val)


def cosine_schedule(module, opt: torch.optim.Optimizer) -> dict:
    """``configure_optimizers``' answer: ``opt`` with its learning rate cosine-annealed over the trainer's
    ``max_epochs`` (10 without a trainer)."""
    epochs = module.trainer.max_epochs if module.trainer is not None and module.trainer.max_epochs else 10
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


def warmup_hinge_loss(module, feats: Tensor, labels: Tensor, offsets: Tensor, ce_batch_size: int) -> Tensor:
    """Training loss of a chain-head module (hyperparameters ``ce_epochs``, ``ce_weight``, ``hinge_weight``):
    cross-entropy through ``module.classifier`` for the first ``ce_epochs`` epochs (or while the head is zero), then
    ``hinge_weight`` times the structured hinge plus ``ce_weight`` times the cross-entropy.  Logs ``train/ce``
    (``ce_batch_size``) and ``train/hinge``."""
    hp = module.hparams
    hinge_phase = module.current_epoch >= hp.ce_epochs and bool(module.head.w.abs().sum() > 0)
    loss = 0.0
    if not hinge_phase or hp.ce_weight > 0:
        ce = F.cross_entropy(module.classifier(feats), labels)
        module.log("train/ce", ce, on_step=False, on_epoch=True, batch_size=ce_batch_size)
        loss = ce if not hinge_phase else hp.ce_weight * ce
    if hinge_phase:
        h = module.hinge(feats, labels, offsets)
        module.log("train/hinge", h, on_step=False, on_epoch=True, batch_size=len(offsets) - 1)
        loss = loss + hp.hinge_weight * h
    return loss
