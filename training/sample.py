"""What the model writes: continuations of fixed validation prompts at each evaluation and at the
end of a run (TensorBoard text, the metrics' `samples`), and of any prompt from a finished run:

    python -m training.sample runs/gpt/<run> --prompt "Deep learning models" --tokens 64 --seed 0
    python -m training.sample runs/gpt/<run> --prompt "The results" --temperature 0 # greedy

The command reads a run's final/ (a transformers model folder; training/final.py writes it and
checks it on reading), or an unfinished run's newest checkpoint.

Greedy (the most likely token each time) shows what the model has learned most firmly; sampling
(temperature, top-k, a fixed seed) shows its variety, reproducibly. No KV cache: each new token is
one forward pass over the last n_positions tokens, which for tens of tokens costs less than the
code a cache would need. The text is printed as it is generated.
"""
import argparse
import math
import os
import sys

import torch

from training import UserError, runfiles
from training.device import eager_mode
from training.final import load_run

PROMPT_TOKENS = 16  # of each fixed validation prompt
N_PROMPTS = 2
TEMPERATURE, TOP_K, SEED = 0.8, 50, 0  # the sampled continuations during training
GREEDY_BELOW = 1e-3  # a temperature under it is greedy: nearly so anyway, and dividing by less can overflow
MAX_TOKENS = 100_000  # no KV cache: hours at the lab shape on a CPU; a larger number is a typo


@torch.no_grad()
def token_stream(model, idx, new_tokens, temperature=0.0, top_k=0, generator=None, vocab_size=None):
    """Each next token (B, 1) after the (B, T) prompt ids; greedy where temperature < GREEDY_BELOW.
    vocab_size: the tokenizer's, so that the model's padding rows are never chosen."""
    for _ in range(new_tokens):
        idx = idx[:, -model.cfg.n_positions:]  # all the model sees
        logits = model(idx).float()[:, :vocab_size]  # (B, V): the next token's
        if temperature < GREEDY_BELOW:
            token = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            token = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
        idx = torch.cat([idx, token], dim=1)
        yield token


def generate(model, idx, new_tokens, temperature=0.0, top_k=0, generator=None, vocab_size=None):
    """(B, T) prompt ids -> (B, new_tokens) continuation ids (token_stream's, at once)."""
    return torch.cat(list(token_stream(model, idx, new_tokens, temperature, top_k, generator, vocab_size)), dim=1)


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
    p = runfiles.ArgumentParser(prog="python -m training.sample", description="Continue a prompt with the weights "
                                "of a gpt_train.py run.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", type=runfiles.path_flag,
                   help="the run's --out-dir (final/, or a checkpoint of an unfinished run)")
    p.add_argument("--prompt", default="", help="text to continue ('': from <|endoftext|>)")
    p.add_argument("--tokens", type=int, default=64, help=f"new tokens, at most {MAX_TOKENS:,}: without a KV cache "
                   "each is a forward pass over up to n_positions tokens, which at the lab shape on a CPU is hours")
    p.add_argument("--temperature", type=float, default=TEMPERATURE, help=f"0 (or below {GREEDY_BELOW}): greedy")
    p.add_argument("--top-k", type=int, default=TOP_K, help="sample among the k most likely; 0: all")
    p.add_argument("--seed", type=int, default=SEED, help="the sampling's random generator")
    p.add_argument("--tokenizer", type=runfiles.path_or_name_flag, default=None,
                   help="None: the run's own (final/); needed only where it kept none "
                   "(a checkpoint, an older final/) and args.json's path moved; always checked against the run")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps, where available")
    return p


def flag_problem(args):
    """Why the flags cannot be used, in one line, or None."""
    if not 1 <= args.tokens <= MAX_TOKENS:
        return f"--tokens must be in [1, {MAX_TOKENS:,}], got {args.tokens}"
    if not math.isfinite(args.temperature) or args.temperature < 0:
        return f"--temperature must be a finite number >= 0, got {args.temperature}"
    if args.top_k < 0 or not 0 <= args.seed < 2 ** 64:
        return f"--top-k must be >= 0 and --seed in [0, 2^64), got {args.top_k} and {args.seed}"
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:  # bytes the shell passed that are no UTF-8 (Python keeps them as surrogates)
        return "--prompt is not UTF-8 text; pass it as UTF-8"
    return device_problem(args.device)


def device_problem(name):
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        return f"--device {name}: not a device name (cpu, cuda, cuda:N, mps)"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cpu" or (device.type == "cuda" and (device.index or 0) < gpus) or \
            (device.type == "mps" and torch.backends.mps.is_available()):
        return None
    return f"--device {name}: not available here ({gpus} GPU{'' if gpus == 1 else 's'} visible)"


def stream_text(decode, tokens, context=4, hold=8):
    """The text of each new token as soon as its characters are whole: a token that ends inside a
    multi-byte character waits (at most `hold` tokens) for the rest. Each piece is decoded after a few
    tokens of `context`, as the whole text would be, and cut off behind it."""
    done, pending = [], []
    for token in tokens:
        pending.append(token)
        text = decode(done + pending)
        if text.endswith("\ufffd") and len(pending) < hold:
            continue
        before = decode(done)
        yield text[len(before):] if text.startswith(before) else decode(pending)
        done, pending = (done + pending)[-context:], []
    if pending:  # the last bytes never completed a character
        yield decode(pending)


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    problem = flag_problem(args)
    if problem:
        print(f"{p.prog}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    try:
        model, tok = load_run(args.run_dir, args.tokenizer, torch.device(args.device))
        ids = tok.tokenizer.encode(args.prompt, add_special_tokens=False).ids or [tok.eot]
        rng = torch.Generator(args.device).manual_seed(args.seed)
        stream = token_stream(model, torch.tensor([ids], device=args.device), args.tokens, args.temperature,
                              args.top_k, rng, tok.vocab_size)
        print(args.prompt, end="", flush=True)
        text = []
        for piece in stream_text(tok.tokenizer.decode, (t.item() for t in stream)):
            print(piece, end="", flush=True)
            text.append(piece)
        print()
        return "".join(text)
    except UserError as e:  # TextError, TokenizerError too
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # what was generated is printed already
        print(flush=True)
        print("interrupted: the text above is what was generated so far", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        sys.exit(1)


if __name__ == "__main__":
    main()
