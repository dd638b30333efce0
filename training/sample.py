"""What the model writes: fixed validation prompts' continuations at the end of a run (TensorBoard, the metrics'
`samples`), and any prompt's from a run's final/ (or newest checkpoint), printed as it comes; greedy shows what the
model learned most firmly, sampling (temperature, top-k, a fixed seed) its variety, reproducibly:

    python -m training.sample runs/gpt/<run> --prompt "Deep learning models" --tokens 64 --seed 0
    python -m training.sample runs/gpt/<run> --prompt "The results" --temperature 0 # greedy
"""
from training import lifecycle  # first, before the slow imports: the standard library only

lifecycle.start(__name__)  # the imports' start; a Ctrl-C while starting is one line, not a traceback

import argparse
import os
import sys
from functools import partial

import torch

from data import files
from training import rundir
from training.device import eager_mode
from training.final import load_run
from training.flags import Parser, add_output_flags, number, path_flag, path_or_name_flag

TEMPERATURE, TOP_K, SEED = 0.8, 50, 0  # the sampled continuations at the end of training
GREEDY_BELOW = 1e-3  # a temperature under it is greedy: nearly so anyway, and dividing by less can overflow
MAX_TOKENS = 100_000  # past n_positions each token is a whole pass: hours at the lab shape on a CPU; a typo


@torch.no_grad()
def token_stream(model, idx, new_tokens, choose, vocab_size=None, stop=None):
    """Each next token (B, 1) after the (B, T) prompt ids, `choose`n from the logits cut to vocab_size (no padding
    row), until a stop signal. The KV cache runs only new tokens; past n_positions the window slides: all run again."""
    cache, n = [[] for _ in range(model.cfg.n_layer)], model.cfg.n_positions
    for _ in range(new_tokens):
        if stop is not None and stop.signal:  # Slurm's warning: the job must end in time, samples or not
            return
        if idx.size(1) > n:
            logits = model(idx[:, -n:])
        else:
            logits = model(idx[:, cache[0][0].size(2) if cache[0] else 0:], cache=cache)
        token = choose(logits.float()[:, :vocab_size])
        idx = torch.cat([idx, token], dim=1)
        yield token


def pick(logits, temperature, top_k, generator):
    """(B, 1) next tokens from (B, V) logits: the most likely, or sampled at `temperature` among the top k."""
    if temperature < GREEDY_BELOW:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)


def greedy_and_sampled(model, idx, new_tokens, generator, vocab_size, stop=None):
    """The greedy and the sampled (B, n <= new_tokens) continuations of the (B, T) prompts, as one batch of 2B rows."""
    rows, b = torch.cat([idx, idx]), idx.size(0)

    def both(logits):
        return torch.cat([pick(logits[:b], 0.0, 0, None), pick(logits[b:], TEMPERATURE, TOP_K, generator)])
    out = torch.cat([rows[:, :0], *token_stream(model, rows, new_tokens, both, vocab_size, stop)], dim=1)
    return out[:b], out[b:]


def fixed_prompts(blocks, eot, n=2, length=16):
    """The same prompts every run: the first `length` tokens of a document (after the block's first end-of-text
    where a whole prompt fits after it) in each of the first n validation blocks."""
    prompts = []
    for ids in (b.tolist() for b in blocks[:n]):
        size = min(length, len(ids) // 2)
        start = ids.index(eot) + 1 if eot in ids and ids.index(eot) + 1 + size <= len(ids) else 0
        prompts.append(ids[start:start + size])
    size = min(map(len, prompts), default=0)
    return [p[:size] for p in prompts]


def final_samples(run, tokenizer, validation_blocks, new_tokens, writer, at_step, val_loss, stop=None):
    """After final/ (main process): the fixed prompts' continuations into TensorBoard and the metrics' `samples`;
    eager (nothing recompiles), the model unwrapped from DDP (no collectives)."""
    prompts = fixed_prompts(validation_blocks, tokenizer.token_to_id("<|endoftext|>"))
    if not prompts or not new_tokens:
        return None
    accelerator, net = run.accelerator, run.accelerator.unwrap_model(run.model).eval()
    rng = torch.Generator(accelerator.device).manual_seed(SEED)
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


def build_parser():
    p = Parser(prog="python -m training.sample", description="Continue a prompt with the weights of a "
               "gpt_train.py run.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", type=path_flag, help="the run's --out-dir (final/, or a checkpoint of an unfinished run)")
    p.add_argument("--prompt", type=utf8_text, default="", help="text to continue ('': from <|endoftext|>)")
    p.add_argument("--tokens", type=number(int, 1, MAX_TOKENS), default=64, help=f"new tokens, at most {MAX_TOKENS:,}: "
                   "past the model's n_positions each is a forward pass over n_positions tokens (hours on a CPU)")
    p.add_argument("--temperature", type=number(float, 0), default=TEMPERATURE,
                   help=f"0 (or below {GREEDY_BELOW}): greedy")
    p.add_argument("--top-k", type=number(int, 0), default=TOP_K, help="sample among the k most likely; 0: all")
    p.add_argument("--seed", type=number(int, 0, 2**64, ends="[)"), default=SEED,
                   help="the sampling's random generator")
    p.add_argument("--tokenizer", type=path_or_name_flag, default=None, help="None: the run's own (final/); needed "
                   "only where it kept none (a checkpoint) and args.json's path moved; always checked against the run")
    p.add_argument("--device", type=device_flag, default="cpu", help="cpu, cuda, cuda:N or mps, where available")
    add_output_flags(p, "write the text, the settings and the process's time here as JSON")
    return p


def utf8_text(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes the shell passed that are no UTF-8 (Python keeps them as surrogates)
        raise argparse.ArgumentTypeError("not UTF-8 text; pass it as UTF-8") from None
    return text


def device_flag(name):
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"not a device name: {name!r} (cpu, cuda, cuda:N, mps)") from None
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cpu" or (device.type == "cuda" and (device.index or 0) < gpus) or \
            (device.type == "mps" and torch.backends.mps.is_available()):
        return name
    raise argparse.ArgumentTypeError(f"{name} not available here ({gpus} GPU{'' if gpus == 1 else 's'} visible)")


def stream_text(decode, tokens, context=4, hold=8):
    """Each new token's text once whole (at most `hold` tokens later), decoded after `context` tokens as in the text."""
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
    args = build_parser().parse_args(argv)
    try:
        with lifecycle.one_line_errors(lambda: "the text above is what was generated so far"):
            if args.metrics_out:
                rundir.check_output(args.metrics_out, "--metrics-out", args.force)
            phases.switch("model")
            model, tok = load_run(args.run_dir, args.tokenizer, torch.device(args.device))
            phases.switch("sampling")
            ids = tok.tokenizer.encode(args.prompt, add_special_tokens=False).ids or [tok.eot]
            choose = partial(pick, temperature=args.temperature, top_k=args.top_k,
                             generator=torch.Generator(args.device).manual_seed(args.seed))
            stream = token_stream(model, torch.tensor([ids], device=args.device), args.tokens, choose, tok.vocab_size)
            print(args.prompt, end="", flush=True)
            text = []
            try:
                for piece in stream_text(tok.tokenizer.decode, (t.item() for t in stream)):
                    print(piece, end="", flush=True)
                    text.append(piece)
            finally:
                print(flush=True)  # the text's line ends, a Ctrl-C's too
            phases.switch("teardown")
            if args.metrics_out:  # the clock taken just before the last output is written
                settings = {k: getattr(args, k) for k in ("prompt", "temperature", "top_k", "seed", "device")}
                files.write_json(args.metrics_out, phases.stamp({
                    "run_dir": str(args.run_dir), **settings, "text": "".join(text), "new_tokens": args.tokens,
                    "command": "python -m training.sample " + " ".join(sys.argv[1:] if argv is None else argv)}))
            return "".join(text)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        sys.exit(1)


if __name__ == "__main__":
    lifecycle.run(main)
