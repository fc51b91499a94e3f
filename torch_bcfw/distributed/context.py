"""Who this process is in a ``torch.distributed`` run: rank, world size, backend, device and timeout.

Backends: ``gloo`` for CPU tensors, ``nccl`` for CUDA tensors (``cuda:LOCAL_RANK``).  The timeout bounds every
collective (with nccl it is enforced by torch's watchdog, which may abort the process instead of raising).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .errors import DistributedError

__all__ = ["DistributedContext", "init_from_env", "current_context", "DEFAULT_TIMEOUT_S"]

#: collective timeout (seconds) of the groups :func:`init_from_env` creates
DEFAULT_TIMEOUT_S = 300.0

LAUNCH_HINT = ("launch with torchrun (`torchrun --nproc-per-node N -m torch_bcfw fit --config ...`, or "
               "`torchrun --nproc-per-node N script.py` for a script that calls "
               "torch_bcfw.distributed.init_from_env()), "
               "or call torch.distributed.init_process_group(...) before building a DistributedContext")

_ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _group_timeout_s(backend: str, device: torch.device) -> float | None:
    """The collective timeout of the default group, where the backend exposes it (gloo and nccl do)."""
    try:
        return float(dist.group.WORLD._get_backend(device).options._timeout.total_seconds())
    except (AttributeError, RuntimeError):
        return None


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in the default process group.

    Attributes:
        rank: this process's rank, ``0 <= rank < world_size``.
        world_size: the number of processes (1 is a valid, trivial run).
        backend: ``"gloo"`` or ``"nccl"`` (the default group's backend).
        device: where the collectives' tensors live: ``cpu`` for gloo, ``cuda:LOCAL_RANK`` for nccl.
        timeout_s: the bound (seconds) on every collective of the group.
        local_rank: the rank within this node (``LOCAL_RANK``; 0 when unknown).
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    timeout_s: float
    local_rank: int = 0

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise DistributedError(f"invalid rank {self.rank} for world size {self.world_size}")
        if self.timeout_s <= 0:
            raise DistributedError(f"timeout_s must be > 0, got {self.timeout_s}")

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the rank that writes files and logs)."""
        return self.rank == 0

    @classmethod
    def from_process_group(cls, timeout_s: float | None = None) -> "DistributedContext":
        """The context of the initialised default process group (else ``DistributedError``).  ``timeout_s``: the
        group's collective timeout; ``None`` reads it from the group, else takes torch's default."""
        if not dist.is_available():
            raise DistributedError("torch.distributed is not available in this build of torch")
        if not dist.is_initialized():
            raise DistributedError(f"the default process group is not initialised: {LAUNCH_HINT}")
        backend = str(dist.get_backend())
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if backend == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        elif backend == "gloo":
            device = torch.device("cpu")
        else:
            raise DistributedError(f"backend {backend!r} is not supported: use gloo (CPU) or nccl (CUDA)")
        if timeout_s is None:
            timeout_s = _group_timeout_s(backend, device)
        if timeout_s is None:
            timeout_s = dist.default_pg_timeout.total_seconds()
        return cls(dist.get_rank(), dist.get_world_size(), backend, device, float(timeout_s), local_rank)


def init_from_env(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                  device: str | torch.device | None = None) -> DistributedContext:
    """Initialise the default process group from torchrun's environment (or take the initialised one, whose backend
    must match) and return its context; ``DistributedError`` when the environment, backend or rendezvous fails.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; ``None`` picks nccl when ``device`` is a CUDA device, gloo otherwise.
        timeout_s: bound (seconds) on the rendezvous and on every collective of the group.
        device: where the data lives (``"cpu"``, ``"cuda"``); ``None`` means CPU.
    """
    if not dist.is_available():
        raise DistributedError("torch.distributed is not available in this build of torch")
    if timeout_s <= 0:
        raise DistributedError(f"timeout_s must be > 0, got {timeout_s}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if backend is None:
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend not in ("gloo", "nccl"):
        raise DistributedError(f"backend {backend!r} is not supported: use gloo (CPU) or nccl (CUDA)")
    if dist.is_initialized():
        ctx = DistributedContext.from_process_group()
        if ctx.backend != backend:
            raise DistributedError(f"the default process group is already initialised with backend {ctx.backend!r}, "
                                   f"not {backend!r}")
        return ctx
    missing = [v for v in _ENV_VARS if not os.environ.get(v)]
    if missing:
        raise DistributedError(f"environment variable(s) {', '.join(missing)} not set: {LAUNCH_HINT}")
    try:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise DistributedError(f"RANK / WORLD_SIZE / LOCAL_RANK must be integers, got "
                               f"{os.environ.get('RANK')!r} / {os.environ.get('WORLD_SIZE')!r} / "
                               f"{os.environ.get('LOCAL_RANK')!r}") from None
    if world_size < 1 or not 0 <= rank < world_size:
        raise DistributedError(f"RANK={rank} is not in [0, WORLD_SIZE={world_size})")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise DistributedError("backend nccl needs CUDA, which is not available: use backend='gloo'")
        torch.cuda.set_device(local_rank)
    try:
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
    except RuntimeError as exc:  # DistStoreError / DistNetworkError: the rendezvous failed or timed out
        raise DistributedError(f"rank {rank} of {world_size}: process group initialisation ({backend}, "
                               f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}) failed: {exc}") from exc
    return DistributedContext.from_process_group(timeout_s)


def current_context() -> DistributedContext | None:
    """The context of the initialised default process group, or ``None`` outside a distributed run."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    return DistributedContext.from_process_group()
