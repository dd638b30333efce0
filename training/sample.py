"""What the model writes: continuations of fixed validation prompts at each evaluation and at the
end of a run (TensorBoard text, the metrics' `samples`), and of any prompt from a finished run:

    python -m training.sample runs/gpt/<run> --prompt "Deep learning models" --tokens 64 --seed 0
    python -m training.sample runs/gpt/<run> --prompt "The results" --temperature 0 # greedy

A finished run's final/ is a transformers model folder (write_final): GPT2LMHeadModel's weights
(model.safetensors), config.json, generation_config.json and the run's own tokenizer, so that
`pipeline("text-generation", model="runs/gpt/<run>/final")` opens it offline. This command reads the
same folder and trusts nothing in it unchecked: the shape from config.json, the tokenizer saved there
(against the hash config.json records), every tensor's name, shape and finiteness before a model is
built. An unfinished run is read from its newest checkpoint, an older final/ (model.pt) too.

Greedy (the most likely token each time) shows what the model has learned most firmly; sampling
(temperature, top-k, a fixed seed) shows its variety, reproducibly. No KV cache: each new token is
one forward pass over the last n_positions tokens, which for tens of tokens costs less than the
code a cache would need. The text is printed as it is generated.
"""
import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

from training.device import eager_mode
from training.model import GPT, from_transformers, model_config, to_transformers

PROMPT_TOKENS = 16  # of each fixed validation prompt
N_PROMPTS = 2
TEMPERATURE, TOP_K, SEED = 0.8, 50, 0  # the sampled continuations during training
GREEDY_BELOW = 1e-3  # a temperature under it is greedy: nearly so anyway, and dividing by less can overflow
MAX_TOKENS = 100_000  # no KV cache: hours at the lab shape on a CPU; a larger number is a typo
HF_WEIGHTS, HF_CONFIG, LEGACY_WEIGHTS = "model.safetensors", "config.json", "model.pt"  # in final/
SHAPE = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")  # of a GPT2Config


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


# ----------------------------------------------------------------------------- final/: a transformers folder

def write_final(net, tokenizer, folder):
    """`net` (training.model.GPT) and the run's `tokenizer` as a transformers model folder. The JSON
    files are written here, not by save_pretrained: transformers 5 names a tokenizer class that 4.x
    cannot open, and this keeps the folder the same under every supported version."""
    from safetensors.torch import save

    from data.tokenizer import EOT, tokenizer_sha256
    from training import runfiles
    cfg, vocab, eot = net.cfg, tokenizer.get_vocab_size(), tokenizer.token_to_id(EOT)
    # bytes written here: safetensors' own save_file makes the file unreadable to the user's group
    (folder / HF_WEIGHTS).write_bytes(save(to_transformers(net.state_dict()), metadata={"format": "pt"}))
    # what save_pretrained writes, the shape always spelled out; the hash: training.sample refuses a
    # tokenizer.json that is not the one the model learned
    runfiles.write_json(folder / HF_CONFIG, {**cfg.to_diff_dict(), **{k: getattr(cfg, k) for k in SHAPE},
                                          "eos_token_id": eot, "bos_token_id": eot,
                                          "architectures": ["GPT2LMHeadModel"],
                                          "tokenizer_sha256": tokenizer_sha256(tokenizer)})
    # the padding rows (vocab up to cfg.vocab_size, whole tiles for the matmuls) are no token: generate()
    # must never pick one; at most 63 ids, masked once per step
    runfiles.write_json(folder / "generation_config.json", {
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot,
        **({"suppress_tokens": list(range(vocab, cfg.vocab_size))} if cfg.vocab_size > vocab else {})})
    tokenizer.save(str(folder / "tokenizer.json"))
    runfiles.write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT, "eos_token": EOT, "unk_token": EOT,
        "model_max_length": cfg.n_positions, "clean_up_tokenization_spaces": False})


def read_config(path):
    """The GPT2Config of a run's config.json, checked enough to build a model from."""
    from training import UserError
    try:
        raw = json.loads(path.read_text())
        shape, eot = {k: raw[k] for k in SHAPE}, raw["eos_token_id"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: not a readable GPT-2 config ({type(e).__name__}: {e})") from None
    if not all(type(v) is int and v > 0 for v in shape.values()) or shape["n_embd"] % shape["n_head"] \
            or type(eot) is not int or not 0 <= eot < shape["vocab_size"]:
        raise UserError(f"{path}: not a GPT-2 shape ({', '.join(f'{k} {v!r}' for k, v in shape.items())}, "
                        f"eos_token_id {eot!r})")
    cfg = model_config(shape.pop("vocab_size"), eot, **shape)
    cfg.tokenizer_sha256 = raw.get("tokenizer_sha256")
    return cfg


def read_weights(path):
    """{name: tensor} of a safetensors or torch.save file; a damaged one is one line (never pickle's
    advice to load it unsafely)."""
    from training import UserError
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # garbage makes the readers raise anything: SafetensorError, UnpicklingError, EOFError
        raise UserError(f"{path} is damaged or not a weights file ({type(e).__name__})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path} is not a state_dict of tensors")
    return state


def build_model(cfg, state, path):
    """GPT(cfg) holding `state`, once every name and shape fits and every value is finite."""
    from training import UserError
    have = {k: tuple(v.shape) for k, v in state.items()}
    blocks = len({k.split(".")[1] for k in have if k.startswith("h.")})
    if blocks != cfg.n_layer or have.get("wte.weight") != (cfg.vocab_size, cfg.n_embd):  # before building it
        raise UserError(f"{path} does not fit its config ({blocks} blocks, wte {have.get('wte.weight')}; the "
                        f"config: {cfg.n_layer} blocks, wte {(cfg.vocab_size, cfg.n_embd)})")
    with torch.device("meta"):  # the expected names and shapes, nothing allocated
        model = GPT(cfg)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if have != want:
        name = min(set(have) ^ set(want) or {k for k in want if have[k] != want[k]})
        raise UserError(f"{path} does not fit its config ({name}: {have.get(name)}, expected {want.get(name)})")
    if not all(v.is_floating_point() and torch.isfinite(v).all() for v in state.values()):
        raise UserError(f"{path} holds NaN, infinite or non-float weights (a diverged or damaged run)")
    model.load_state_dict({k: v.float().contiguous() for k, v in state.items()}, assign=True)
    model.lm_head.weight = model.wte.weight  # assign replaced both: tie them again
    return model.eval()


# ----------------------------------------------------------------------------- reading a run

def load_run(run_dir, tokenizer_spec, device):
    """(model in eval mode, LoadedTokenizer) of a gpt_train.py run directory: final/ (its own
    tokenizer; `tokenizer_spec` must be the same one), else an older final/ or the newest checkpoint
    that verifies (the tokenizer from `tokenizer_spec` or args.json, checked); UserError if unusable."""
    from training import UserError, checkpoints
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    final, note = run_dir / "final", None
    if (final / HF_WEIGHTS).is_file():
        cfg = read_config(final / HF_CONFIG)
        tok = own_tokenizer(final, cfg, tokenizer_spec)
        state, path = from_transformers(read_weights(final / HF_WEIGHTS)), final / HF_WEIGHTS
    elif (final / LEGACY_WEIGHTS).is_file():
        cfg, path = read_config(final / HF_CONFIG), final / LEGACY_WEIGHTS
        tok = named_tokenizer(run_dir, tokenizer_spec, cfg)
        state = read_weights(path)
        note = (f"note: {final} is the older format (no tokenizer kept with it): {tok.source} is checked only "
                f"for its size and end-of-text id")
    else:
        ckpt, _ = checkpoints.latest_checkpoint(run_dir)
        if ckpt is None or not (ckpt / "pytorch_model.bin").is_file():
            raise UserError(f"{run_dir}: no weights (neither final/ nor a complete checkpoint)")
        cfg, expect = checkpoint_config(ckpt)
        tok = named_tokenizer(run_dir, tokenizer_spec, cfg, expect)
        state, path = read_weights(ckpt / "pytorch_model.bin"), ckpt / "pytorch_model.bin"
    model = build_model(cfg, state, path).to(device)
    if note:  # once the weights have loaded
        print(note, file=sys.stderr)
    return model, tok


def checkpoint_config(ckpt):
    """(GPT2Config, the tokenizer's sha256 prefix) from the run identity a checkpoint saved."""
    from training import UserError, checkpoints
    try:
        run = checkpoints.load_state(ckpt)[1]
        shape = dict(n_layer=run["n_layer"], n_head=run["n_head"], n_embd=run["n_embd"], n_positions=run["seq_len"])
        return model_config(run["vocab_size"], None, **shape), run["tokenizer"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{ckpt}: no readable run identity ({type(e).__name__}: {e})") from None


def opened(spec, hint=""):
    from data.tokenizer import TokenizerError, open_tokenizer
    from training import UserError
    try:
        return open_tokenizer(spec)
    except TokenizerError as e:
        raise UserError(f"{e}{hint}") from None


def own_tokenizer(final, cfg, spec):
    """final/'s tokenizer, the one config.json's hash names; `spec`, if given, must be the same one."""
    from training import UserError
    tok = opened(final)
    if tok.sha256 != cfg.tokenizer_sha256:
        raise UserError(f"{final}/tokenizer.json (sha256 {tok.sha256[:16]}) is not the tokenizer the model "
                        f"learned (config.json records {str(cfg.tokenizer_sha256)[:16]})")
    other = opened(spec) if spec else tok
    if other.sha256 != tok.sha256:
        raise UserError(f"--tokenizer {spec} ({other.vocab_size:,} tokens, sha256 {other.sha256[:16]}) is not the "
                        f"run's ({final}/tokenizer.json: {tok.vocab_size:,} tokens, sha256 {tok.sha256[:16]}); "
                        f"leave --tokenizer out")
    return fitting(tok, cfg, final)


def named_tokenizer(run_dir, spec, cfg, expect=None):
    """The tokenizer --tokenizer or args.json names (weights kept without one), checked against the
    model: its size and end-of-text id, and its hash where the checkpoint recorded one (`expect`)."""
    from training import UserError
    if not spec:
        try:  # the path as typed when the run started (relative to where it started)
            spec = json.loads((run_dir / "args.json").read_text())["tokenizer"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"{run_dir}: no readable args.json naming the tokenizer; "
                            f"pass it with --tokenizer") from None
    tok = opened(spec, "; pass the run's tokenizer with --tokenizer")
    if expect and tok.sha256[:16] != expect:
        raise UserError(f"tokenizer {spec} ({tok.vocab_size:,} tokens, sha256 {tok.sha256[:16]}) is not the one "
                        f"the run trained with (sha256 {expect}); pass the run's with --tokenizer")
    if cfg.eos_token_id is None:
        cfg.bos_token_id = cfg.eos_token_id = tok.eot
    return fitting(tok, cfg, spec)


def fitting(tok, cfg, where):
    from training import UserError
    if tok.padded_vocab_size != cfg.vocab_size or tok.eot != cfg.eos_token_id:
        raise UserError(f"tokenizer {where} ({tok.vocab_size:,} tokens, <|endoftext|> {tok.eot}) does not fit the "
                        f"model ({cfg.vocab_size:,} rows, end of text {cfg.eos_token_id})")
    return tok


# ----------------------------------------------------------------------------- the command line

def build_parser():
    p = argparse.ArgumentParser(prog="python -m training.sample", description="Continue a prompt with the weights "
                                "of a gpt_train.py run.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("run_dir", type=Path, help="the run's --out-dir (final/, or a checkpoint of an unfinished run)")
    p.add_argument("--prompt", default="", help="text to continue ('': from <|endoftext|>)")
    p.add_argument("--tokens", type=int, default=64, help=f"new tokens, at most {MAX_TOKENS:,}: without a KV cache "
                   "each is a forward pass over up to n_positions tokens, which at the lab shape on a CPU is hours")
    p.add_argument("--temperature", type=float, default=TEMPERATURE, help=f"0 (or below {GREEDY_BELOW}): greedy")
    p.add_argument("--top-k", type=int, default=TOP_K, help="sample among the k most likely; 0: all")
    p.add_argument("--seed", type=int, default=SEED, help="the sampling's random generator")
    p.add_argument("--tokenizer", default=None, help="None: the run's own (final/); needed only where it kept none "
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
    from training import UserError
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
