"""Never lose a run: the training state, checkpoints written to ckpt-N.tmp with a manifest and renamed (resume
takes the newest that verifies), and a resume refused unless it continues the same run (IDENTITY_FLAGS)."""
import contextlib
import json
import os
import shutil
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from safetensors import SafetensorError

from data import files
from training import step
from training.errors import OutputError, UserError, reason

STATE_FILE = "trainer_state.json"
STOP_CLOCK = "stop_clock.json"  # written last by a process a signal stopped: {"step", "process_seconds_total"}


@dataclass
class TrainState:
    """The loop's counters and curves; all of it survives a resume."""
    step: int = 0  # optimizer steps taken
    lr_step: int = 0  # steps the LR schedule advanced (an fp16 step skipped by the scaler does not)
    micro_batches: int = 0  # the data position: micro-batch rounds consumed
    tokens_seen: int = 0
    train_seconds: float = 0.0  # the timed loop, summed over restarts
    steady_seconds: float = 0.0  # the same without each start's first step
    steady_tokens: int = 0
    compile_seconds: float = 0.0
    losses: list = field(default_factory=list)  # [step, mean loss] at each log point
    val_losses: list = field(default_factory=list)
    throughput: list = field(default_factory=list)  # [step, tokens/s]
    loss_window: list = field(default_factory=lambda: [0.0, 0])  # loss summed since the last log point, steps
    process_seconds: float = 0.0  # the run's processes before this one (a requeued job), up to their checkpoint
    resumed: bool = False


def record_stop_clock(out_dir, step, total_seconds):
    """A stopped process's seconds up to its end; a failure is a warning (exit 3, requeue, must not become 1)."""
    try:
        files.write_json(out_dir / STOP_CLOCK, {"step": step, "process_seconds_total": round(total_seconds, 3)})
    except OutputError as e:
        print(f"warning: {e}; the next process counts this one's seconds up to its checkpoint", file=sys.stderr)


def earlier_seconds(out_dir, state):
    """A resumed run's earlier seconds: the stopped process's last word if it names this checkpoint, else its own."""
    # none (killed, not stopped), damaged or another checkpoint's: the checkpoint's own count
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        last = json.loads(files.read_small(out_dir / STOP_CLOCK, 4096))
        seconds = last["process_seconds_total"]
        # its checkpoint's write and the exit: seconds to minutes, never more than an hour (an edited file)
        if last["step"] == state.step and isinstance(seconds, (int, float)) \
                and state.process_seconds <= seconds <= state.process_seconds + 3600:
            return float(seconds)
    return state.process_seconds


def load_state(ckpt):
    """(TrainState, the identity of the run that saved it) from a verified checkpoint; one written by another
    version of this file (keys it does not know) is one line."""
    saved = json.loads((ckpt / STATE_FILE).read_text())
    try:
        identity = saved.pop("run")
        return TrainState(**{**saved, "resumed": True}), identity
    except (KeyError, TypeError) as e:  # TrainState(unknown=...): TypeError
        raise UserError(f"{ckpt / STATE_FILE} is not a training state this version reads ({reason(e)}); "
                               f"resume with the version that wrote it, or pick a new --out-dir") from None


def save_checkpoint(accelerator, out_dir, state, identity):
    """accelerate's save_state into ckpt-N.tmp, a manifest, then a rename: a killed write leaves no ckpt-N."""
    final, tmp = out_dir / f"ckpt-{state.step:07d}", out_dir / f"ckpt-{state.step:07d}.tmp"
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    # model, optimizer, GradScaler, every process's RNG states; torch.save format because safetensors
    # cannot hold the tied lm_head/wte weight and says so at every save
    with failed_write_explained(tmp, "a checkpoint"):
        accelerator.save_state(str(tmp), safe_serialization=False)
        accelerator.wait_for_everyone()  # every process's files are on disk before the manifest and the rename
        if accelerator.is_main_process:
            files.write_json(tmp / STATE_FILE, {**asdict(state), "run": identity})
            files.write_manifest(tmp, sorted(p for p in tmp.iterdir() if p.is_file()))
    if accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)  # the same step saved before (a resumed run stopped again at once)
        os.replace(tmp, final)
        for old in sorted(out_dir.glob("ckpt-*[0-9]"))[:-2]:  # the newest two: one may be damaged later
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


@contextlib.contextmanager
def failed_write_explained(tmp, what, remains=None):
    """A failed write into `tmp`: the partial folder goes, the run stops in one line saying what remains."""
    try:
        yield
    except (OSError, RuntimeError, OutputError, SafetensorError) as e:  # safetensors: a full disk too
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"writing {what} into {tmp} failed ({reason(e)}); "
                              f"{(remains or resume_advice)(tmp.parent)}") from None


def resume_advice(out_dir):
    ckpt, _ = latest_checkpoint(out_dir)
    if ckpt:
        return f"{ckpt.name} in {out_dir} is intact: free space there, then run the same command to resume from it"
    return f"no checkpoint in {out_dir} to resume from: free space there, then run again (it starts over)"


def restore(accelerator, ckpt):
    """accelerate's load_state; a damaged file is one line (random_states_<rank>.pkl too: accelerate skips it)."""
    if problem := damaged(ckpt, ckpt / f"random_states_{accelerator.process_index}.pkl"):
        raise problem
    try:
        accelerator.load_state(str(ckpt))
    except Exception:  # garbage makes pickle raise anything (UnpicklingError, IndexError, EOFError...)
        files_read = (damaged(ckpt, p) for p in sorted(ckpt.iterdir()) if p.suffix in (".bin", ".pt", ".pkl"))
        if (problem := next(filter(None, files_read), None)) is None:  # every file reads: a bug to see whole
            raise
        raise problem from None


def damaged(ckpt, path):
    """None if accelerate's loader reads `path` (weights only: a planted pickle runs no code), else one line naming
    it, without torch's advice to load it unsafely (weights_only=False)."""
    from accelerate.utils import load
    try:
        with warnings.catch_warnings():  # garbage makes torch warn about pickle protocols first: one line only
            warnings.simplefilter("ignore")
            load(path, map_location="cpu")
        return None
    except Exception as error:
        why = reason(error)
        if "weights_only" in str(error) or "WeightsUnpickler" in str(error):  # torch's refusal: its first sentence
            detail = str(error).partition("WeightsUnpickler error:")[2].strip().split(". ")[0].split("\n")[0][:160]
            why = f"not plain tensors and numbers: {detail}".rstrip(": ")
        return UserError(f"checkpoint file {path} is damaged ({type(error).__name__}: {why}); delete {ckpt} to "
                               f"resume from the checkpoint before it, or pick a new --out-dir")


def remove_checkpoints(accelerator, out_dir):
    """A finished run's resume state (final/ and metrics.json stay): the checkpoints and the last stop's clock."""
    if accelerator.is_main_process:
        for ckpt in out_dir.glob("ckpt-*"):
            shutil.rmtree(ckpt)
        with contextlib.suppress(OSError):
            (out_dir / STOP_CLOCK).unlink(missing_ok=True)


def latest_checkpoint(out_dir):
    """(the newest checkpoint that verifies, [(name, why skipped) for newer ones that did not])."""
    skipped = []
    for path in sorted(Path(out_dir).glob("ckpt-*[0-9]"), reverse=True):  # complete renames only
        if (problem := files.manifest_problem(path)) is None:
            return path, skipped
        skipped.append((path.name, problem))
    return None, skipped


# What a resume must match, each key with the flag that sets it. Identity: whatever changes the numbers
# the run reports (data, split, schedule, shape, precision, the validation measure). Free: how the same
# steps are run or recorded (--micro-batch: the same global batch accumulated differently; --compile,
# --fused-adamw, --loss: the same math; --eval-every, --log-every, --ckpt-every, --sample-tokens, paths);
# with them, training/step.py's accelerations declared with changes_numbers=True: identity_flags().
IDENTITY_FLAGS = {
    "corpus": "--text (its content)", "val_fraction": "--val-fraction", "seed": "--seed",
    "tokenizer": "--tokenizer (its content)", "vocab_size": "--tokenizer (its vocabulary)",
    "n_layer": "--n-layer", "n_head": "--n-head", "n_embd": "--n-embd", "seq_len": "--seq-len",
    "tokens": "--tokens", "global_batch": "--global-batch", "world_size": "the number of processes",
    "lr": "--lr", "warmup": "--warmup", "weight_decay": "--weight-decay", "grad_clip": "--grad-clip",
    "precision": "--precision", "val_batches": "--val-batches"}


def identity_flags():
    return {**IDENTITY_FLAGS, **{a.name: a.flag for a in step.declared() if a.changes_numbers}}


def run_identity(args, tok, corpus_sha256, precision, world):
    """What a checkpoint's run depends on (identity_flags(); the micro-batch is added once chosen, not compared)."""
    named = {"corpus": corpus_sha256[:16], "tokenizer": tok.sha256[:16], "vocab_size": tok.vocab_size,
             "world_size": world, "precision": precision}
    return {key: named[key] if key in named else getattr(args, key) for key in identity_flags()}


def check_same_run(saved, current):
    """Refuse a resume that would change the run, in one line."""
    if differ := [key for key, value in current.items() if key in saved and saved[key] != value]:
        raise UserError("the checkpoint was made with " + ", ".join(f"{k} = {saved[k]}" for k in differ) +
                              "; this run has " + ", ".join(f"{k} = {current[k]}" for k in differ) +
                              f" ({', '.join(dict.fromkeys(identity_flags().get(k, k) for k in differ))}): resume with "
                              f"the same settings or pick a new --out-dir")


def continue_position(state, saved, micro):
    """A resume with another micro-batch: the data position recounted in `micro`s (exact: checkpoints follow whole
    steps). Returns the micro-batch the budget and validation are counted in (the run's first)."""
    if (old := saved.get("micro_batch")) and old != micro:
        state.micro_batches = -(-state.micro_batches * old // micro)  # ceil: exact after a whole step
    return saved.get("budget_micro_batch") or old or micro
