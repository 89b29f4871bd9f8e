"""AdamW with decoupled weight decay whose whole state is named tensors plus a step count.

torch.optim's state_dict is keyed by parameter position and saved with pickle; this one saves
as safetensors next to the factors, so a checkpoint is plain tensors and JSON.
"""

from __future__ import annotations

import math

import torch


class AdamW:
    def __init__(self, params: dict[str, torch.Tensor], betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        self.params = params
        self.b1, self.b2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        self.m = {k: torch.zeros_like(p) for k, p in params.items()}
        self.v = {k: torch.zeros_like(p) for k, p in params.items()}
        self.t = 0

    @torch.no_grad()
    def step(self, lr: float) -> None:
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for k, p in self.params.items():
            if p.grad is None:
                continue
            g = p.grad
            self.m[k].mul_(self.b1).add_(g, alpha=1 - self.b1)
            self.v[k].mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            if self.weight_decay:
                p.mul_(1 - lr * self.weight_decay)
            denom = (self.v[k] / c2).sqrt_().add_(self.eps)
            p.addcdiv_(self.m[k], denom, value=-lr / c1)

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {**{f"adam.m.{k}": v for k, v in self.m.items()},
                **{f"adam.v.{k}": v for k, v in self.v.items()}}

    def load_state(self, tensors: dict[str, torch.Tensor], t: int) -> None:
        for k in self.params:
            self.m[k].copy_(tensors[f"adam.m.{k}"])
            self.v[k].copy_(tensors[f"adam.v.{k}"])
        self.t = t


def clip_grad_norm(params: dict[str, torch.Tensor], max_norm: float) -> float:
    """Scales the gradients so their global L2 norm is at most max_norm; returns the norm."""
    grads = [p.grad for p in params.values() if p.grad is not None]
    total = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
    if max_norm and total > max_norm:
        for g in grads:
            g.mul_(max_norm / (total + 1e-12))
    return total


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak`, then cosine decay to 10% of it at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
