"""Never lose a run: the training state, checkpoints that verify, the same-run check on resume,
and the run directory (checked, locked, never overwritten once finished).

    TrainState              what the loop counts; saved as trainer_state.json in every checkpoint
    save_checkpoint         accelerate's save_state into ckpt-N.tmp, a manifest, then a rename
    latest_checkpoint       the newest checkpoint that verifies against its manifest
    run_identity            what a resume must match; check_same_run refuses anything else
    open_run_dir            outputs checked, folder locked, the checkpoint to resume from found
"""
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accelerate.utils import broadcast_object_list

from data import files
from training import UserError

MANIFEST = "manifest.json"  # written last: a checkpoint without a matching one is incomplete or damaged
STATE_FILE = "trainer_state.json"


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
    resumed: bool = False


def load_state(ckpt):
    """(TrainState, the identity of the run that saved it) from a verified checkpoint."""
    saved = json.loads((ckpt / STATE_FILE).read_text())
    identity = saved.pop("run")
    return TrainState(**{**saved, "resumed": True}), identity


def save_checkpoint(accelerator, out_dir, state, identity, keep=2):
    """accelerate's save_state into ckpt-N.tmp, a manifest (size and sha256 of every file), then an
    atomic rename: a killed write leaves no ckpt-N, and later damage is found by verify_checkpoint."""
    final = out_dir / f"ckpt-{state.step:07d}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    # model, optimizer, GradScaler, every process's RNG states; torch.save format because safetensors
    # cannot hold the tied lm_head/wte weight and says so at every save
    accelerator.save_state(str(tmp), safe_serialization=False)
    accelerator.wait_for_everyone()  # every process's files are on disk before the manifest and the rename
    if accelerator.is_main_process:
        files.write_json(tmp / STATE_FILE, {**asdict(state), "run": identity})
        manifest = {p.name: {"bytes": p.stat().st_size, "sha256": files.sha256_file(p)}
                    for p in sorted(tmp.iterdir()) if p.is_file()}
        files.write_json(tmp / MANIFEST, manifest)
        if final.exists():  # the same step saved before (a resumed run stopped again at once)
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in sorted(out_dir.glob("ckpt-*[0-9]"))[:-keep]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def verify_checkpoint(path):
    """None if every file matches the manifest, else why not."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return "no readable manifest (an interrupted or older checkpoint)"
    for name, expected in manifest.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != expected["bytes"]:
            return f"{name} has {file.stat().st_size} bytes, the manifest says {expected['bytes']}"
        if files.sha256_file(file) != expected["sha256"]:
            return f"{name} does not match its checksum"
    return None


def latest_checkpoint(out_dir):
    """(the newest checkpoint that verifies, [(name, why skipped) for newer ones that did not])."""
    skipped = []
    for path in sorted(Path(out_dir).glob("ckpt-*[0-9]"), reverse=True):  # complete renames only
        problem = verify_checkpoint(path)
        if problem is None:
            return path, skipped
        skipped.append((path.name, problem))
    return None, skipped


def run_identity(args, vocab_size, world):
    """What a checkpoint's run depends on (the micro-batch is added once chosen): a resume with
    anything else is refused before any work."""
    tokenizer_file = Path(args.tokenizer)
    return {"n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd, "seq_len": args.seq_len,
            "vocab_size": vocab_size, "tokenizer": files.sha256_file(tokenizer_file)[:16]
            if tokenizer_file.is_file() else args.tokenizer, "tokens": args.tokens,
            "global_batch": args.global_batch, "world_size": world, "seed": args.seed}


def check_same_run(saved, current):
    """A resume continues the same run: refuse, in one line, anything that would change it."""
    for key, value in current.items():
        if key in saved and saved[key] != value:
            raise UserError(f"the checkpoint was made with {key} = {saved[key]}, this run has {value}; "
                            f"resume with the same settings or pick a new --out-dir")


def open_run_dir(out_dir, metrics_out, accelerator, stack):
    """(out_dir, the checkpoint to resume from or None). Checks the outputs, locks the folder until
    `stack` closes (a finished run is never overwritten); with several processes, the main one's answer."""
    ckpt = None
    if accelerator.is_main_process:
        files.check_output_dir(out_dir, "--out-dir")
        if metrics_out:
            files.check_output(metrics_out, "--metrics-out")
        stack.enter_context(files.RunLock(out_dir))
        if (out_dir / "metrics.json").exists():
            raise UserError(f"{out_dir} holds a finished run (metrics.json); pick a new --out-dir")
        ckpt, skipped = latest_checkpoint(out_dir)
        for name, why in skipped:
            print(f"warning: skipping checkpoint {name}: {why}", file=sys.stderr)
    if accelerator.num_processes > 1:  # the main process's choice (its clock named the default folder)
        ckpt, out_dir = broadcast_object_list([ckpt, out_dir])
    return out_dir, ckpt
