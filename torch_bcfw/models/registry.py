"""The model classes a saved result may name: the library's own plus those users register.

A saved :class:`~torch_bcfw.fit.FitResult` stores its model as a registered name and its ``config()``; loading
builds the model only through this registry (a file can never make the loader import or call anything else).
Register your own :class:`~torch_bcfw.models.base.StructuredModel` subclasses before loading results that use them::

    import torch_bcfw

    @torch_bcfw.register_model
    class MyChain(torch_bcfw.Chain):
        ...
"""
from __future__ import annotations

import math

from .base import StructuredModel

__all__ = ["register_model", "model_name", "model_from_config"]

_REGISTRY: dict[str, type] = {}


def register_model(cls=None, *, name: str | None = None):
    """Register a :class:`StructuredModel` subclass under ``name`` (default: its class name).

    Usable as ``register_model(MyModel)`` or as a decorator (``@register_model`` or
    ``@register_model(name="my-model")``).  Registering another class under a taken name raises
    ``ValueError``; registering the same class again is a no-op.
    """
    def add(c):
        if not (isinstance(c, type) and issubclass(c, StructuredModel)):
            raise TypeError(f"register_model expects a StructuredModel subclass, got {c!r}")
        key = name if name is not None else c.__name__
        if not isinstance(key, str) or not key:
            raise ValueError(f"model name must be a non-empty string, got {key!r}")
        old = _REGISTRY.get(key)
        if old is not None and old is not c:
            raise ValueError(f"model name {key!r} is already registered for {old.__module__}.{old.__qualname__}")
        _REGISTRY[key] = c
        return c

    return add if cls is None else add(cls)


def model_name(model: StructuredModel) -> str:
    """The registered name of ``model``'s class (``ValueError`` when the class is not registered)."""
    cls = type(model)
    for key, c in _REGISTRY.items():
        if c is cls:
            return key
    raise ValueError(f"model class {cls.__module__}.{cls.__qualname__} is not registered, so a saved result could not "
                     "be loaded back: call torch_bcfw.register_model on it first")


def _check_plain(value, where: str) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if math.isnan(value):
            raise ValueError(f"{where} is NaN")
        return
    if isinstance(value, (list, tuple)):
        for j, v in enumerate(value):
            _check_plain(v, f"{where}[{j}]")
        return
    raise ValueError(f"{where} must be a number, string, bool, None or a list of them, got {type(value).__name__}")


def model_from_config(name, config) -> StructuredModel:
    """Build the registered model ``name`` from its saved ``config`` (keyword arguments), with clear errors.

    ``name`` may also be the ``module.QualName`` of a registered class (the form of older files).
    """
    if not isinstance(name, str):
        raise ValueError(f"the saved model class must be a string, got {type(name).__name__}")
    cls = _REGISTRY.get(name)
    if cls is None:
        cls = next((c for c in _REGISTRY.values() if f"{c.__module__}.{c.__qualname__}" == name), None)
    if cls is None:
        raise ValueError(f"the file names model class {name!r}, which is not a registered model; registered: "
                         f"{sorted(_REGISTRY)}. Register your own class with torch_bcfw.register_model before loading")
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise ValueError(f"the saved model_config must be a dict with string keys, got {type(config).__name__}")
    for k, v in config.items():
        _check_plain(v, f"model_config[{k!r}]")
    try:
        return cls(**config)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the saved model_config does not build a {name}: {exc}") from None
