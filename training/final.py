"""final/: a finished run's weights as a transformers model folder, written once after a successful run and read
back (load_run: an unfinished run's newest verified checkpoint stands in) with nothing trusted unchecked: config.json
against the hash the weights record, the tokenizer against config.json's, every tensor's name and shape.

The declared changes to the model (training/step.py) are its "lab5"
section; where GPT-2's config cannot describe them, final/ holds
lab5.json and lab5.safetensors instead: transformers finds no model
there (it would load one missing or mismatching tensors into a GPT-2)
and refuses the folder.

At the end, what the model writes: the KV-cached token stream
(training/sample.py's command line prints it), a finished run's samples."""
import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

from data.files import UMASK, read_small, strict, write_json
from data.tokenizer import EOT, TokenizerError, open_tokenizer, tokenizer_sha256
from training import checkpoints, step
from training.checkpoints import failed_write_explained
from training.device import eager_mode
from training.errors import UserError
from training.model import GPT, from_transformers, model_config, to_transformers

HF_WEIGHTS, HF_CONFIG = "model.safetensors", "config.json"  # in final/
NAMES = {True: (HF_CONFIG, HF_WEIGHTS), False: ("lab5.json", "lab5.safetensors")}  # by: is it a GPT-2?
SHAPE = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")  # of a GPT2Config


def save_final(accelerator, model, out_dir, tokenizer, keep_metrics):
    """Before the metrics.json that marks a run finished: final/ written into final.tmp and renamed. A failed write
    leaves the checkpoint to resume from, or, where there is none, calls keep_metrics() (the weights are lost)."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        final, tmp = out_dir / "final", out_dir / "final.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        with failed_write_explained(tmp, "the final weights", lambda folder: final_remains(folder, keep_metrics)):
            tmp.mkdir()
            write_final(accelerator.unwrap_model(model), tokenizer, tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()


def final_remains(out_dir, keep_metrics):
    if checkpoints.latest_checkpoint(out_dir)[0]:  # unfinished: the same command resumes it
        return checkpoints.resume_advice(out_dir) + " and save final/"
    keep_metrics()
    return (f"the metrics are in {out_dir / 'metrics.json'}; no checkpoint holds the weights (--ckpt-every 0, or the "
            f"run ended before the first one)")


def config_sha256(config):
    """A config's content hash, recorded in model.safetensors: an edit the shapes cannot reveal (n_head) is found."""
    canonical = json.dumps(json.loads(json.dumps(strict(config), default=str)), sort_keys=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def write_final(net, tokenizer, folder):
    """`net` (training.model.GPT) and the run's `tokenizer` as a transformers model folder; the JSON files
    written here, not by save_pretrained: transformers 5 names a tokenizer class that 4.x cannot open."""
    from safetensors.torch import save_file
    cfg, vocab, eot = net.cfg, tokenizer.get_vocab_size(), tokenizer.token_to_id(EOT)
    config = {**cfg.to_transformers(), "eos_token_id": eot, "bos_token_id": eot, "lab5": net.changes,
              "tokenizer_sha256": tokenizer_sha256(tokenizer)}  # training.sample refuses another tokenizer.json
    if foreign := step.not_gpt2(net.changes):
        config["transformers"] = f"declined: GPT-2's config cannot describe {' '.join(foreign)}"
        print(f"final/ is no transformers model: GPT-2's config cannot describe {' '.join(foreign)} "
              f"(python -m training.sample loads it)")
    config_name, weights_name = NAMES[not foreign]
    metadata = {"format": "pt", "config_sha256": config_sha256(config)}
    save_file(to_transformers(net.state_dict()), folder / weights_name, metadata=metadata)  # streamed: no copy
    os.chmod(folder / weights_name, 0o666 & ~UMASK)  # save_file makes it 0600: the group may read it
    write_json(folder / config_name, config)
    # the padding rows (vocab up to cfg.vocab_size, whole tiles for the matmuls) are no token: generate()
    # must never pick one; at most 63 ids, masked once per step
    write_json(folder / "generation_config.json", {
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot,
        **({"suppress_tokens": list(range(vocab, cfg.vocab_size))} if cfg.vocab_size > vocab else {})})
    tokenizer.save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT, "eos_token": EOT, "unk_token": EOT,
        "model_max_length": cfg.n_positions, "clean_up_tokenization_spaces": False})


def load_run(run_dir, tokenizer_spec, device):
    """(model in eval mode, LoadedTokenizer) of a run: final/ (`tokenizer_spec`: its own), or its newest checkpoint."""
    run_dir, final = Path(run_dir), Path(run_dir) / "final"
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    config, path = NAMES[(final / HF_WEIGHTS).is_file()]
    config, path = final / config, final / path
    if path.is_file():
        cfg = read_config(config)
        state, recorded = read_weights(path)
        if recorded and recorded != cfg.config_sha256:  # a final/ from before the hash: not checked
            raise UserError(f"{config} was changed after the run wrote it (its content hash "
                            f"{cfg.config_sha256[:16]} is not the {recorded[:16]} {path} records); restore it, or "
                            f"train again")
        tok = own_tokenizer(final, cfg, tokenizer_spec)
    else:
        ckpt, _ = checkpoints.latest_checkpoint(run_dir)
        path = ckpt and ckpt / "pytorch_model.bin"
        if not path or not path.is_file():
            raise UserError(f"{run_dir}: no weights (neither final/ nor a complete checkpoint)")
        tok, shape, changes = checkpoint_tokenizer(ckpt, tokenizer_spec)
        cfg, (state, _) = model_config(tok.vocab_size, tok.eot, **shape), read_weights(path)
        cfg.changes = changes
    return build_model(cfg, state, path).to(device), tok


def read_config(path):
    """The GPT2Config of final/config.json, checked enough to build a model from."""
    try:
        raw = json.loads(read_small(path, 1 << 20, follow=True))  # a FIFO planted there: no wait
        shape, eot = {k: raw[k] for k in SHAPE}, raw["eos_token_id"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: not a readable GPT-2 config ({type(e).__name__}: {e})") from None
    if not all(type(v) is int and v > 0 for v in shape.values()) or shape["n_embd"] % shape["n_head"] \
            or type(eot) is not int or not 0 <= eot < shape["vocab_size"]:
        raise UserError(f"{path}: not a GPT-2 shape ({', '.join(f'{k} {v!r}' for k, v in shape.items())}, "
                        f"eos_token_id {eot!r})")
    cfg = model_config(shape.pop("vocab_size"), eot, **shape)
    cfg.tokenizer_sha256, cfg.config_sha256 = raw.get("tokenizer_sha256"), config_sha256(raw)
    cfg.changes = raw.get("lab5", {})
    model_values = {a.name: list(a.values().values()) for a in step.declared() if a.model}
    if not isinstance(cfg.changes, dict) or any(v not in model_values.get(k, []) for k, v in cfg.changes.items()):
        raise UserError(f"{path}: changes to the model {cfg.changes} are not ones training/step.py declares")
    return cfg


def read_weights(path):
    """({name: tensor} in model.py's names, the recorded config hash or None) of a weights file; damaged: one line."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open
            with safe_open(str(path), "pt") as f:
                recorded = (f.metadata() or {}).get("config_sha256")
                state = {name: f.get_tensor(name) for name in f.keys()}
        else:
            state, recorded = torch.load(path, map_location="cpu", weights_only=True), None
    except Exception as e:  # garbage makes the readers raise anything: SafetensorError, UnpicklingError, EOFError
        raise UserError(f"{path} is damaged or not a weights file ({type(e).__name__})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path} is not a state_dict of tensors")
    return from_transformers(state) if path.suffix == ".safetensors" else state, recorded


def build_model(cfg, state, path):
    """GPT(cfg) holding `state`, once every name and shape fits and every value is finite."""
    with torch.device("meta"):  # the expected names and shapes, nothing allocated
        model = step.change_model(GPT(cfg), step.Accelerations(**cfg.changes))
    have, want = ({k: tuple(v.shape) for k, v in d.items()} for d in (state, model.state_dict()))
    if have != want:
        name = min(set(have) ^ set(want) or {k for k in want if have[k] != want[k]})
        raise UserError(f"{path} does not fit its config ({name}: {have.get(name)}, expected {want.get(name)})")
    if not all(v.is_floating_point() and torch.isfinite(v).all() for v in state.values()):
        raise UserError(f"{path} holds NaN, infinite or non-float weights (a diverged or damaged run)")
    model.load_state_dict({k: v.float().contiguous() for k, v in state.items()}, assign=True)
    model.lm_head.weight = model.wte.weight  # assign replaced both: tie them again
    return model.eval()


def own_tokenizer(final, cfg, spec):
    """final/'s tokenizer, the one config.json's hash names; `spec`, if given, must be the same one."""
    tok = open_tokenizer(final)
    if tok.sha256 != cfg.tokenizer_sha256:
        raise UserError(f"{final}/tokenizer.json (sha256 {tok.sha256[:16]}) is not the tokenizer the model "
                        f"learned (config.json records {str(cfg.tokenizer_sha256)[:16]})")
    other = open_tokenizer(spec) if spec else tok
    if other.sha256 != tok.sha256:
        raise UserError(f"--tokenizer {spec} ({other.vocab_size:,} tokens, sha256 {other.sha256[:16]}) is not the "
                        f"run's ({final}/tokenizer.json: {tok.vocab_size:,} tokens, sha256 {tok.sha256[:16]}); "
                        f"leave --tokenizer out")
    return tok


def checkpoint_tokenizer(ckpt, spec):
    """(the tokenizer `spec` or args.json names, checked against the run identity's hash; the model's shape)."""
    try:
        run = checkpoints.load_state(ckpt)[1]
        shape = dict(n_layer=run["n_layer"], n_head=run["n_head"], n_embd=run["n_embd"], n_positions=run["seq_len"])
        expect = run["tokenizer"]
        changes = {a.name: a.values()[run[a.name]] for a in step.declared() if a.model and a.name in run}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{ckpt}: no readable run identity ({type(e).__name__}: {e})") from None
    if not spec:
        try:  # the path as typed when the run started (relative to where it started)
            spec = json.loads(read_small(ckpt.parent / "args.json", 1 << 20, follow=True))["tokenizer"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"{ckpt.parent}: no readable args.json naming the tokenizer; "
                            f"pass it with --tokenizer") from None
    try:
        tok = open_tokenizer(spec)
    except TokenizerError as e:
        raise TokenizerError(f"{e}; pass the run's tokenizer with --tokenizer") from None
    if tok.sha256[:16] != expect:
        raise UserError(f"tokenizer {spec} ({tok.vocab_size:,} tokens, sha256 {tok.sha256[:16]}) is not the one "
                        f"the run trained with (sha256 {expect}); pass the run's with --tokenizer")
    return tok, shape, changes


# ----------------------------------------------------------------------------- what the model writes

TEMPERATURE, TOP_K, SEED = 0.8, 50, 0  # the sampled continuations at the end of training
GREEDY_BELOW = 1e-3  # a temperature under it is greedy: nearly so anyway, and dividing by less can overflow


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


def final_samples(run, tokenizer, validation_blocks, new_tokens, stop=None):
    """After final/ (main process): the fixed prompts' continuations for TensorBoard and the metrics' `samples`;
    eager (nothing recompiles), the model unwrapped from DDP (no collectives)."""
    prompts = fixed_prompts(validation_blocks, tokenizer.token_to_id(EOT))
    if not prompts or not new_tokens:
        return None
    accelerator, net = run.accelerator, run.accelerator.unwrap_model(run.model).eval()
    rng = torch.Generator(accelerator.device).manual_seed(SEED)
    with eager_mode(), accelerator.autocast():
        greedy, sampled = greedy_and_sampled(net, torch.tensor(prompts, device=accelerator.device), new_tokens, rng,
                                             tokenizer.get_vocab_size(), stop)
    decode = tokenizer.decode
    return {"new_tokens": greedy.size(1), "temperature": TEMPERATURE, "top_k": TOP_K, "seed": SEED,
            "continuations": [{"prompt": decode(p), "greedy": decode(g), "sampled": decode(s)}
                              for p, g, s in zip(prompts, greedy.tolist(), sampled.tolist())]}
