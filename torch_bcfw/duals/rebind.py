"""The dual state a caller moves from one set of features to the next (the Lightning callback): which class, and the
saved state re-bound to new features."""
from __future__ import annotations

from .active_set import ActiveSetDualState
from .dense import dense_dual_state

__all__ = ["rebindable_state", "rebound_state"]


def rebindable_state(model, data, lam: float, n_total: int | None = None):
    """A fresh state of ``(model, data, lam)`` that :meth:`~torch_bcfw.duals.base.DualState.rebind` can move: the
    model's own (:meth:`~torch_bcfw.models.base.StructuredModel.dual_state`) when it is
    :attr:`~torch_bcfw.duals.base.DualState.rebindable`, else an :class:`ActiveSetDualState` (also, without building
    its table, for a model that keeps the default dense state).  ``n_total``: the problem's number of examples when
    ``data`` is one rank's shard of it."""
    if type(model).dual_state is dense_dual_state:
        return ActiveSetDualState(model, data, lam, n_total)
    state = model.dual_state(data, lam) if n_total is None else model.dual_state(data, lam, n_total=n_total)
    return state if state.rebindable else ActiveSetDualState(model, data, lam, n_total)


def rebound_state(model, data, lam: float, sd: dict, kinds: tuple):
    """The saved state ``sd`` (a ``state_dict``) re-bound to ``data``'s features; ``kinds``: the state classes the
    caller keeps (those :func:`rebindable_state` gives its model).  ``ValueError`` for a state of another class, or
    for ``data`` holding other examples than the saved state."""
    cls = next((c for c in (*kinds, ActiveSetDualState) if c.__name__ == sd["kind"]), None)
    if cls is None:
        raise ValueError(f"the saved dual state is a {sd['kind']}, but {type(model).__name__} keeps a "
                         f"{kinds[0].__name__}")
    return cls.from_state_dict(model, data, lam, sd)
