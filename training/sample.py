"""What the model writes: continuations of fixed validation prompts at each evaluation and at the
end of a run (TensorBoard text, the metrics' `samples`), and of any prompt from a finished run:

    python -m training.sample runs/gpt/<run> --prompt "Deep learning models" --tokens 64 --seed 0
    python -m training.sample runs/gpt/<run> --prompt "The results" --temperature 0 # greedy

Greedy (the most likely token each time) shows what the model has learned most firmly; sampling
(temperature, top-k, a fixed seed) shows its variety, reproducibly. No KV cache: each new token is
one forward pass over the last n_positions tokens, which for tens of tokens costs less than the
code a cache would need.
"""
import argparse
import sys
from pathlib import Path

import torch

from training.device import eager_mode

PROMPT_TOKENS = 16  # of each fixed validation prompt
N_PROMPTS = 2
TEMPERATURE, TOP_K, SEED = 0.8, 50, 0  # the sampled continuations during training


@torch.no_grad()
def generate(model, idx, new_tokens, temperature=0.0, top_k=0, generator=None, vocab_size=None):
    """(B, T) prompt ids -> (B, new_tokens) continuation ids; greedy where temperature is 0.
    vocab_size: the tokenizer's, so that the model's padding rows are never chosen."""
    out = []
    for _ in range(new_tokens):
        logits = model(idx[:, -model.cfg.n_positions:]).float()[:, :vocab_size]  # (B, V): the next token's
        if temperature == 0:
            token = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            token = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
        idx = torch.cat([idx, token], dim=1)
        out.append(token)
    return torch.cat(out, dim=1)


def fixed_prompts(blocks, eot, n=N_PROMPTS, length=PROMPT_TOKENS):
    """The first `length` tokens of a document in each of the first n validation blocks (after the
    block's first end-of-text where a whole prompt fits after it): the same prompts every evaluation."""
    prompts = []
    for i in range(min(n, len(blocks))):
        ids = blocks[i]["input_ids"]
        size = min(length, len(ids) // 2)
        start = ids.index(eot) + 1 if eot in ids and ids.index(eot) + 1 + size <= len(ids) else 0
        prompts.append(ids[start:start + size])
    size = min(map(len, prompts), default=0)
    return [p[:size] for p in prompts]


class Sampler:
    """On the main process: the fixed prompts' continuations, greedy and sampled, into TensorBoard
    and `last` (the metrics' `samples`). Called outside the timed loop, under no_grad and eager mode
    (nothing recompiles) with the model unwrapped from DDP (no collective calls on one process)."""

    def __init__(self, tokenizer, validation_blocks, new_tokens):
        self.tokenizer, self.new_tokens, self.last = tokenizer, new_tokens, None
        eot = tokenizer.token_to_id("<|endoftext|>")
        self.prompts = fixed_prompts(validation_blocks, eot) if new_tokens > 0 else []  # 0: no samples

    def __call__(self, model, accelerator, writer, step, val_loss):
        if not self.prompts:
            return
        net = accelerator.unwrap_model(model)
        idx = torch.tensor(self.prompts, device=accelerator.device)
        vocab = self.tokenizer.get_vocab_size()
        net.eval()
        with eager_mode(), accelerator.autocast():
            greedy = generate(net, idx, self.new_tokens, vocab_size=vocab)
            rng = torch.Generator(accelerator.device).manual_seed(SEED)
            sampled = generate(net, idx, self.new_tokens, TEMPERATURE, TOP_K, rng, vocab)
        net.train()
        decode = self.tokenizer.decode
        self.last = {"step": step, "val_loss": val_loss, "new_tokens": self.new_tokens, "temperature": TEMPERATURE,
                     "top_k": TOP_K, "seed": SEED,
                     "continuations": [{"prompt": decode(p), "greedy": decode(g), "sampled": decode(s)}
                                       for p, g, s in zip(self.prompts, greedy.tolist(), sampled.tolist())]}
        for kind in ("greedy", "sampled"):
            writer.add_text(f"samples/{kind}", "\n\n".join(f"*{c['prompt']}* **→** {c[kind]}"
                                                           for c in self.last["continuations"]), step)


# ----------------------------------------------------------------------------- the command line

def build_parser():
    p = argparse.ArgumentParser(prog="python -m training.sample", description="Continue a prompt with the weights "
                                "of a gpt_train.py run.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", type=Path, help="the run's --out-dir (args.json and its weights)")
    p.add_argument("--prompt", default="", help="text to continue ('': from <|endoftext|>)")
    p.add_argument("--tokens", type=int, default=64, help="new tokens")
    p.add_argument("--temperature", type=float, default=TEMPERATURE, help="0: greedy")
    p.add_argument("--top-k", type=int, default=TOP_K, help="sample among the k most likely; 0: all")
    p.add_argument("--seed", type=int, default=SEED, help="the sampling's random generator")
    p.add_argument("--tokenizer", default=None, help="None: the run's (args.json)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    return p


def weights_file(run_dir):
    """The final weights a finished run keeps (checkpoints.FINAL_WEIGHTS), else the model file of the
    newest checkpoint that verifies (an unfinished run, or --keep-checkpoints); None if neither."""
    from training import checkpoints
    final = run_dir / checkpoints.FINAL_WEIGHTS
    if final.is_file():
        return final
    ckpt, _ = checkpoints.latest_checkpoint(run_dir)
    return ckpt / "pytorch_model.bin" if ckpt and (ckpt / "pytorch_model.bin").is_file() else None


def load_run(run_dir, tokenizer_spec, device):
    """(model in eval mode, LoadedTokenizer) of a gpt_train.py run directory; UserError if unusable."""
    import json

    from data.tokenizer import TokenizerError, open_tokenizer
    from training import UserError
    from training.model import GPT, model_config
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    try:
        run_args = json.loads((run_dir / "args.json").read_text())
    except (OSError, ValueError):
        raise UserError(f"{run_dir}: no readable args.json (not a gpt_train.py run directory)") from None
    weights = weights_file(run_dir)
    if weights is None:
        raise UserError(f"{run_dir}: no weights (neither final weights nor a complete checkpoint)")
    try:  # args.json holds the path as typed when the run started (relative to where it started)
        tok = open_tokenizer(tokenizer_spec or run_args["tokenizer"])
    except TokenizerError as e:
        raise UserError(f"{e}{'' if tokenizer_spec else '; pass the run tokenizer with --tokenizer'}") from None
    cfg = model_config(tok.vocab_size, tok.eot, n_layer=run_args["n_layer"], n_head=run_args["n_head"],
                                 n_embd=run_args["n_embd"], n_positions=run_args["seq_len"])
    model = GPT(cfg)
    try:
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    except RuntimeError as e:
        raise UserError(f"{weights} does not fit the run's model with tokenizer {tok.source} "
                        f"({str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else e})") from None
    return model.to(device).eval(), tok


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.tokens <= 0 or args.temperature < 0 or args.top_k < 0:
        p.error("--tokens must be > 0, --temperature and --top-k >= 0")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no GPU here")
    from training import UserError
    try:
        model, tok = load_run(args.run_dir, args.tokenizer, torch.device(args.device))
    except UserError as e:  # TextError too
        sys.exit(f"error: {e}")
    ids = tok.tokenizer.encode(args.prompt, add_special_tokens=False).ids or [tok.eot]
    rng = torch.Generator(args.device).manual_seed(args.seed)
    idx = torch.tensor([ids], device=args.device)
    out = generate(model, idx, args.tokens, args.temperature, args.top_k, rng, tok.vocab_size)
    text = tok.tokenizer.decode(out[0].tolist())
    print(args.prompt + text)
    return text


if __name__ == "__main__":
    main()
