"""What the model writes for any prompt, from a run's final/ (or newest checkpoint), printed as it comes (the
generation itself, and the fixed prompts' continuations at the end of a run: training/final.py); greedy shows what
the model learned most firmly, sampling (temperature, top-k, a fixed seed) its variety, reproducibly:

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
from training.final import GREEDY_BELOW, SEED, TEMPERATURE, TOP_K, load_run, pick, token_stream
from training.flags import Parser, add_output_flags, number, path_flag, path_or_name_flag

MAX_TOKENS = 100_000  # past n_positions each token is a whole pass: hours at the lab shape on a CPU; a typo


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
