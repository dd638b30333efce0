"""What the model writes: continuations of fixed validation prompts at the end of a run (TensorBoard
text, the metrics' `samples`), and of any prompt from a finished run:

    python -m training.sample runs/gpt/<run> --prompt "Deep learning models" --tokens 64 --seed 0
    python -m training.sample runs/gpt/<run> --prompt "The results" --temperature 0 # greedy

The command reads a run's final/ (a transformers model folder; training/final.py writes it and
checks it on reading), or an unfinished run's newest checkpoint.

Greedy (the most likely token each time) shows what the model has learned most firmly; sampling
(temperature, top-k, a fixed seed) shows its variety, reproducibly. A KV cache keeps each layer's keys
and values, so a new token is one position's forward pass, until the text outgrows the model's
positions (then each token is a pass over the last n_positions). Printed as it is generated.

Run as a command, its --metrics-out records the text, the settings and the job's clock (`process_seconds`
from the process's start, split into `phases`).
"""
from training import lifecycle  # first, before the slow imports: the standard library only

lifecycle.start(__name__)  # the imports' start; a Ctrl-C while starting is one line, not a traceback

import argparse
import os
import sys

import torch

from training import runfiles
from training.device import eager_mode
from training.final import load_run
from training.flags import Parser, number, path_flag, path_or_name_flag

PROMPT_TOKENS = 16  # of each fixed validation prompt
N_PROMPTS = 2
TEMPERATURE, TOP_K, SEED = 0.8, 50, 0  # the sampled continuations at the end of training
GREEDY_BELOW = 1e-3  # a temperature under it is greedy: nearly so anyway, and dividing by less can overflow
MAX_TOKENS = 100_000  # past n_positions each token is a whole pass: hours at the lab shape on a CPU; a typo


@torch.no_grad()
def token_stream(model, idx, new_tokens, temperature=0.0, top_k=0, generator=None, vocab_size=None):
    """Each next token (B, 1) after the (B, T) prompt ids; greedy where temperature < GREEDY_BELOW.
    vocab_size: the tokenizer's, so that the model's padding rows are never chosen."""
    cache = [[] for _ in range(model.cfg.n_layer)]
    for _ in range(new_tokens):
        token = pick(next_logits(model, idx, cache).float()[:, :vocab_size], temperature, top_k, generator)
        idx = torch.cat([idx, token], dim=1)
        yield token


def next_logits(model, idx, cache):
    """The next token's logits (B, V) after the (B, T) text `idx`, through the KV cache `cache` (one list per
    block, extended in place): only the tokens not yet cached run. Past the model's n_positions the window
    slides and every position shifts, so nothing cached holds: the last n_positions tokens run again."""
    n = model.cfg.n_positions
    if idx.size(1) > n:
        return model(idx[:, -n:])
    return model(idx[:, cache[0][0].size(2) if cache[0] else 0:], cache=cache)


def pick(logits, temperature, top_k, generator):
    """(B, 1) next tokens from (B, V) logits: the most likely, or sampled at `temperature` among the top k."""
    if temperature < GREEDY_BELOW:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)


def generate(model, idx, new_tokens, temperature=0.0, top_k=0, generator=None, vocab_size=None):
    """(B, T) prompt ids -> (B, new_tokens) continuation ids (token_stream's, at once)."""
    return torch.cat(list(token_stream(model, idx, new_tokens, temperature, top_k, generator, vocab_size)), dim=1)


@torch.no_grad()
def greedy_and_sampled(model, idx, new_tokens, generator, vocab_size, stop=None):
    """The greedy and the sampled (TEMPERATURE, TOP_K) continuations of the (B, T) prompts, as one batch of
    2B rows: one forward pass per token for both. A stop signal (stop.signal set) ends them early, with
    what was generated. -> the two (B, n) continuations, n <= new_tokens."""
    rows, b, new, cache = torch.cat([idx, idx]), idx.size(0), [], [[] for _ in range(model.cfg.n_layer)]
    for _ in range(new_tokens):
        if stop is not None and stop.signal:  # Slurm's warning: the job must end in time, samples or not
            break
        logits = next_logits(model, rows, cache).float()[:, :vocab_size]
        token = torch.cat([pick(logits[:b], 0.0, 0, None), pick(logits[b:], TEMPERATURE, TOP_K, generator)])
        rows = torch.cat([rows, token], dim=1)
        new.append(token)
    out = torch.cat(new, dim=1) if new else rows[:, :0]
    return out[:b], out[b:]


def fixed_prompts(blocks, eot, n=N_PROMPTS, length=PROMPT_TOKENS):
    """The first `length` tokens of a document in each of the first n validation blocks (after the
    block's first end-of-text where a whole prompt fits after it): the same prompts every run."""
    prompts = []
    for i in range(min(n, len(blocks))):
        ids = blocks[i].tolist()
        size = min(length, len(ids) // 2)
        start = ids.index(eot) + 1 if eot in ids and ids.index(eot) + 1 + size <= len(ids) else 0
        prompts.append(ids[start:start + size])
    size = min(map(len, prompts), default=0)
    return [p[:size] for p in prompts]


def final_samples(run, tokenizer, validation_blocks, new_tokens, writer, at_step, val_loss, stop=None):
    """On the main process, once training is done (final/ already written): the fixed validation prompts'
    continuations, greedy and sampled, into TensorBoard and the metrics' `samples`. Under no_grad and eager
    mode (nothing recompiles) with the model unwrapped from DDP (no collective calls on one process)."""
    prompts = fixed_prompts(validation_blocks, tokenizer.token_to_id("<|endoftext|>"))
    if not prompts or not new_tokens:
        return None
    accelerator = run.accelerator
    net = accelerator.unwrap_model(run.model)
    rng = torch.Generator(accelerator.device).manual_seed(SEED)
    net.eval()
    with eager_mode(), accelerator.autocast():
        greedy, sampled = greedy_and_sampled(net, torch.tensor(prompts, device=accelerator.device), new_tokens, rng,
                                             tokenizer.get_vocab_size(), stop)
    decode = tokenizer.decode
    samples = {"step": at_step, "val_loss": val_loss, "new_tokens": greedy.size(1), "temperature": TEMPERATURE,
               "top_k": TOP_K, "seed": SEED,
               "continuations": [{"prompt": decode(p), "greedy": decode(g), "sampled": decode(s)}
                                 for p, g, s in zip(prompts, greedy.tolist(), sampled.tolist())]}
    for kind in ("greedy", "sampled"):
        writer.add_text(f"samples/{kind}", "\n\n".join(f"*{c['prompt']}* **→** {c[kind]}"
                                                        for c in samples["continuations"]), at_step)
    return samples


# ----------------------------------------------------------------------------- the command line

def build_parser():
    p = Parser(prog="python -m training.sample", description="Continue a prompt with the weights of a "
               "gpt_train.py run.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", type=path_flag, help="the run's --out-dir (final/, or a checkpoint of an unfinished run)")
    p.add_argument("--prompt", default="", help="text to continue ('': from <|endoftext|>)")
    p.add_argument("--tokens", type=number(int, 1, MAX_TOKENS), default=64, help=f"new tokens, at most {MAX_TOKENS:,}: "
                   "past the model's n_positions each is a forward pass over n_positions tokens (hours on a CPU)")
    p.add_argument("--temperature", type=number(float, 0), default=TEMPERATURE,
                   help=f"0 (or below {GREEDY_BELOW}): greedy")
    p.add_argument("--top-k", type=number(int, 0), default=TOP_K, help="sample among the k most likely; 0: all")
    p.add_argument("--seed", type=number(int, 0, 2**64, high_open=True), default=SEED,
                   help="the sampling's random generator")
    p.add_argument("--tokenizer", type=path_or_name_flag, default=None,
                   help="None: the run's own (final/); needed only where it kept none (a checkpoint, an older final/) "
                        "and args.json's path moved; always checked against the run")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps, where available")
    p.add_argument("--metrics-out", type=path_flag, default=None, help="write the text, the settings and the process's "
                   "time here as JSON")
    return p


def flag_problem(args):
    """Why the flags cannot be used together or here (the prompt's encoding, the device), in one line, or None;
    each flag's own range is its argparse type's."""
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
    phases = lifecycle.phases()
    p = build_parser()
    args = p.parse_args(argv)
    problem = flag_problem(args)
    if problem:
        p.error(problem)
    try:
        with lifecycle.one_line_errors(lambda: "the text above is what was generated so far"):
            return sample(args, argv, phases)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        sys.exit(1)


def sample(args, argv, phases):
    """The command's work: the run's model, the prompt's continuation printed as it comes, the metrics."""
    if args.metrics_out:
        runfiles.check_output(args.metrics_out, "--metrics-out", "training.sample")
    phases.switch("model")
    model, tok = load_run(args.run_dir, args.tokenizer, torch.device(args.device))
    phases.switch("sampling")
    ids = tok.tokenizer.encode(args.prompt, add_special_tokens=False).ids or [tok.eot]
    rng = torch.Generator(args.device).manual_seed(args.seed)
    stream = token_stream(model, torch.tensor([ids], device=args.device), args.tokens, args.temperature,
                          args.top_k, rng, tok.vocab_size)
    print(args.prompt, end="", flush=True)
    text = []
    try:
        for piece in stream_text(tok.tokenizer.decode, (t.item() for t in stream)):
            print(piece, end="", flush=True)
            text.append(piece)
    finally:
        print(flush=True)  # the text's line ends, a Ctrl-C's too
    phases.switch("teardown")
    if args.metrics_out:
        write_metrics(args, argv, "".join(text), phases)
    return "".join(text)


def write_metrics(args, argv, text, phases):
    runfiles.write_json(args.metrics_out, phases.stamp({
        "run_dir": str(args.run_dir), "prompt": args.prompt, "text": text, "new_tokens": args.tokens,
        "temperature": args.temperature, "top_k": args.top_k, "seed": args.seed, "device": args.device,
        "command": "python -m training.sample " + " ".join(sys.argv[1:] if argv is None else argv),
    }))  # the clock taken just before the last output is written


if __name__ == "__main__":
    lifecycle.run(main)
