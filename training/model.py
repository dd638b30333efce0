"""GPT-2 as GPT2Config describes it: pre-LayerNorm blocks, tanh-GELU, tied embeddings, no dropout,
attention as one scaled_dot_product_attention call. Parameter names are transformers' GPT2LMHeadModel's
without its `transformer.` prefix, so a state_dict maps onto that class one to one (to_transformers). At the end:
the loss in chunks (`--loss chunked`), the same math without the full fp32 logits."""
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    """GPT2Config's fields and defaults (GPT-2 small), not the class: importing transformers costs a second."""
    vocab_size: int
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    activation_function: str = "gelu_new"  # GPT-2's tanh approximation
    resid_pdrop: float = 0.0
    embd_pdrop: float = 0.0
    attn_pdrop: float = 0.0
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def to_transformers(self):
        """As GPT2Config's config.json holds it (transformers' Auto* classes open it by model_type)."""
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "tie_word_embeddings": True, **asdict(self)}


def model_config(vocab_size, eot_id, **shape):
    """GPT-2 small unless `shape` says otherwise; the vocabulary padded to a multiple of 64 (tensor cores)."""
    return GPTConfig(vocab_size=(vocab_size + 63) // 64 * 64, bos_token_id=eot_id, eos_token_id=eot_id, **shape)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.n_head, self.attention = cfg.n_head, attention
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if self.attention == "sdpa":  # flash attention on sm80+, memory-efficient kernel on older GPUs
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # "eager": the textbook softmax(QK^T / sqrt(d)) V with an explicit causal mask
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = CausalSelfAttention(cfg, attention)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """attention: "sdpa" (training) or "eager" (the textbook form, for the ladder); loss: "plain" or "chunked"
    (training/step.py's declared change)."""

    def __init__(self, cfg: GPTConfig, attention="sdpa"):
        super().__init__()
        self.cfg, self.attention, self.loss = cfg, attention, "plain"
        self.changes = {}  # the declared accelerations' changes to it, by training/step.py's change_model
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        self.apply(self._init)
        for block in self.h:  # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer)
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, std=cfg.initializer_range / math.sqrt(2 * cfg.n_layer))

    def _init(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.cfg.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        """The mean loss; without targets the next token's logits (B, V)."""
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))  # (B, T, C)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        if targets is None:  # sampling
            return self.lm_head(x[:, -1])
        if self.loss == "chunked":  # never all the fp32 logits at once (chunked_cross_entropy below)
            return chunked_cross_entropy(x, self.lm_head.weight, targets)
        logits = self.lm_head(x)  # (B, T, V)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # HF: (in, out)


def to_transformers(state_dict):
    """-> GPT2LMHeadModel's: Conv1D's weights transposed; no lm_head.weight (tied: safetensors wants one copy)."""
    return {f"transformer.{k}": (v.t() if k.endswith(CONV1D) else v).detach().cpu().contiguous()
            for k, v in state_dict.items() if k != "lm_head.weight"}


def from_transformers(tensors):
    state = {k.removeprefix("transformer."): v.t() if k.endswith(CONV1D) else v
             for k, v in tensors.items() if k != "lm_head.weight"}
    if "wte.weight" in state:
        state["lm_head.weight"] = state["wte.weight"]  # tied
    return state


# The LM loss without the full fp32 logits (4 GiB per lab batch;
# `--loss chunked`, a speed candidate): each chunk of tokens gets its
# logits, loss and at once the logits' gradient (softmax - one-hot) /
# tokens, turned into the hidden states' and LM head's gradients (as
# Liger-Kernel's fused linear cross-entropy).
CHUNK_TOKENS = 4096  # 4,096 x 50,304 fp32 logits = 0.8 GB at most at a time


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk):
        # hidden (N, C), weight (V, C), targets (N,); under autocast the matmuls run in its dtype
        n = targets.numel()
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, n, chunk):
            h, t = hidden[start:start + chunk], targets[start:start + chunk]
            logits = F.linear(h, weight).float()  # (chunk, V): the only logits alive
            lse = torch.logsumexp(logits, dim=-1)
            loss += (lse - logits.gather(1, t[:, None]).squeeze(1)).sum()
            grad = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
            grad[torch.arange(len(t), device=t.device), t] -= 1.0  # n x d(mean loss)/d(logits), in [-1, 1]
            # the 1/n comes after the matmuls, in fp32: under fp16 autocast they run in fp16 before any
            # loss scaling, and (softmax - one-hot) / n underflows there (most of the LM head's gradient 0)
            grad_hidden[start:start + chunk] = grad.to(h.dtype) @ weight.to(h.dtype)
            grad_weight += grad.t().to(h.dtype) @ h
        ctx.save_for_backward(grad_hidden.div_(n), grad_weight.div_(n))
        ctx.dtypes = hidden.dtype, weight.dtype
        return loss / n

    @staticmethod
    def backward(ctx, grad_loss):
        (grad_hidden, grad_weight), (hidden_dtype, weight_dtype) = ctx.saved_tensors, ctx.dtypes
        # scaled in fp32 (GradScaler's scale is in grad_loss), then cast as autograd casts a plain loss's
        return (grad_hidden * grad_loss).to(hidden_dtype), (grad_weight * grad_loss).to(weight_dtype), None, None


def chunked_cross_entropy(hidden, weight, targets, chunk=CHUNK_TOKENS):
    """F.cross_entropy(F.linear(hidden, weight).float().view(-1, V), targets.view(-1)) and its gradients,
    never holding more than `chunk` tokens' logits. hidden (B, T, C), targets (B, T)."""
    hidden, targets = hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ChunkedCrossEntropy.apply(hidden, weight, targets, chunk)
    total = sum(F.cross_entropy(F.linear(hidden[s:s + chunk], weight).float(), targets[s:s + chunk], reduction="sum")
                for s in range(0, targets.numel(), chunk))  # evaluation: the loss only, no gradient matmuls
    return total / targets.numel()
