"""A mixture-of-experts MLP (Qwen3-MoE): a router picks each token's top-k experts, each expert
is a SwiGLU MLP, and the token's output is their outputs weighted by the router.

Routing follows transformers' Qwen3-MoE: softmax over all experts in float32, top-k, the k
weights renormalised to sum to one when `norm_topk_prob`, then cast to the activations' dtype.

The experts run grouped: the `T * k` (token, expert) pairs are sorted by expert once, the tokens
gathered in that order, and each expert that received any runs its two matmuls over its whole
contiguous group; the weighted results are summed back into their tokens with one `index_add_`.
The Python loop is over experts with work (at most `num_experts` iterations, usually far fewer on
a decode step), never over tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from corral.engine.execution.model_config import MoEConfig


class MoEBlock(nn.Module):
    """Router `[experts, hidden]`, experts' fused gate/up `[experts, 2 * inter, hidden]` and down
    `[experts, hidden, inter]` projections (dense; filled by the loader)."""

    def __init__(self, hidden: int, c: MoEConfig, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.num_experts, self.top_k, self.norm_topk_prob = c.num_experts, c.top_k, c.norm_topk_prob

        def p(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)

        self.router = p(c.num_experts, hidden)
        self.gate_up = p(c.num_experts, 2 * c.intermediate_size, hidden)
        self.down = p(c.num_experts, hidden, c.intermediate_size)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's expert weights `[T, k]` (in `x`'s dtype) and expert ids `[T, k]`."""
        probs = F.linear(x, self.router).softmax(dim=-1, dtype=torch.float32)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor, linear=None) -> torch.Tensor:
        """`[T, hidden]` -> `[T, hidden]`. `linear` is accepted for the layer's call signature;
        the experts' stacked weights run on plain `F.linear`."""
        weights, experts = self.route(x)
        flat = experts.reshape(-1)
        order = flat.argsort(stable=True)  # the (token, slot) pairs grouped by expert
        tokens = order // self.top_k
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        xs = x.index_select(0, tokens)
        out = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            rows = slice(start, start + n)
            gate, up = F.linear(xs[rows], self.gate_up[e]).chunk(2, dim=-1)
            out[rows] = F.linear(F.silu(gate).mul_(up), self.down[e])
            start += n
        out.mul_(weights.reshape(-1)[order, None])
        return torch.zeros_like(x).index_add_(0, tokens, out)
