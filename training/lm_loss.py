"""The LM loss without the full fp32 logits (4 GiB per lab batch; `--loss chunked`, a speed candidate): each
chunk of tokens gets its logits, loss and at once the logits' gradient (softmax - one-hot) / tokens, turned
into the hidden states' and LM head's gradients (as Liger-Kernel's fused linear cross-entropy)."""
import torch
import torch.nn.functional as F

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
                for s in range(0, targets.numel(), chunk))  # evaluation: the loss only
    return total / targets.numel()
