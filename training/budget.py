"""The token budget in whole micro-batches, and the micro-batch itself: from the checkpoint, the
flag, the preset (CPU) or a probe of what fits this GPU; with several processes, the smallest. Then the loop's
batches (sharded by accelerate, their position two integers) and evaluate(): the validation loss."""
import gc
import json
import math
import re
import sys
from dataclasses import dataclass
from typing import NamedTuple

import torch
from accelerate.data_loader import prepare_data_loader, skip_first_batches

from data import files
from data.blocks import epoch_loader
from training import CACHE_HOME, errors
from training.device import eager_mode, proc_file


@dataclass(frozen=True)
class Budget:
    """One optimizer step = `accum` micro-batch rounds of `micro_batch` sequences on each of `world` processes;
    the budget in whole rounds (`total_micro`, rounded up): the last step may average fewer."""
    micro_batch: int
    world: int
    accum: int
    seq_len: int
    total_micro: int
    unit: int = 0  # the micro-batch the run started with: its budget and validation are counted in it (0: this one)

    @property
    def val_unit(self):  # sequences per --val-batches batch, the same across resumes with another micro-batch
        return self.unit or self.micro_batch

    @property
    def tokens_per_micro(self):  # all processes together
        return self.micro_batch * self.world * self.seq_len

    @property
    def total_steps(self):
        return math.ceil(self.total_micro / self.accum)

    def micro_in_step(self, micro_done):  # the step after `micro_done` rounds: accum, fewer only at the end
        return min(self.accum, self.total_micro - micro_done)


class Due(NamedTuple):
    log: bool  # a point of the loss curve (a sync point: the loss is read)
    evaluate: bool  # a validation loss (the final one follows the loop)
    checkpoint: bool
    last: bool  # the budget is spent


def due(step, args, total_steps):
    """What is due after `step`; after the last, a checkpoint only with --keep-checkpoints (final/ instead)."""
    last = step == total_steps
    ckpt = args.keep_checkpoints if last else bool(args.ckpt_every and step % args.ckpt_every == 0)
    return Due(log=step % args.log_every == 0 or last, evaluate=step % args.eval_every == 0 and not last,
               checkpoint=ckpt, last=last)


def check_model_fits(args, vocab_size, device):
    """Before any data is read: the weights, gradients and AdamW's two moments (16 bytes a parameter of
    training/model.py's: 12 C^2 + 13 C a block, the embeddings, the last LayerNorm) fit the memory there is."""
    c = args.n_embd
    params = ((vocab_size + 63) // 64 * 64 + args.seq_len) * c + args.n_layer * (12 * c**2 + 13 * c) + 2 * c
    if device.type == "cuda":
        have = torch.cuda.mem_get_info(device)[0]
    else:  # the kernel's MemAvailable (kB), where it says
        found = re.search(r"^MemAvailable:\s*(\d+)", proc_file("meminfo"), re.MULTILINE)
        have = found and int(found[1]) * 1024
    if have and 16 * params > have:
        raise errors.UserError(f"a model of --n-layer {args.n_layer} --n-embd {c} --seq-len {args.seq_len} needs "
                              f"~{16 * params / 2**30:,.1f} GiB for its weights, gradients and AdamW alone; "
                              f"{device.type} has {have / 2**30:,.1f} GiB available")


def plan_budget(tokens, global_batch, micro_batch, world, seq_len, unit=None):
    """The Budget of `tokens` in whole micro-batches of `unit` (the run's first), counted in `micro_batch`es: a
    resume with another micro-batch takes the same sequences, so the same steps and learning-rate schedule."""
    if global_batch % (micro_batch * world):
        raise errors.UserError(f"--global-batch {global_batch} is not a multiple of micro-batch {micro_batch} x "
                              f"{world} processes")
    unit = unit or micro_batch
    sequences = math.ceil(tokens / (unit * world * seq_len)) * unit  # per process
    return Budget(micro_batch, world, global_batch // (micro_batch * world), seq_len,
                  math.ceil(sequences / micro_batch), unit if unit != micro_batch else 0)


def choose_micro_batch(args, model, accelerator, accelerations, preset_micro, resumed_micro=None):
    """(micro-batch, where it came from): --micro-batch, on a resume too (a run out of memory resumes with a smaller
    one); else a resume's, a GPU's probe or the preset's on a CPU, at most this process's share."""
    flag, global_batch, world = args.micro_batch, args.global_batch, accelerator.num_processes
    if flag != "auto":
        if resumed_micro and flag != resumed_micro:
            return flag, f"flag; the checkpoint had {resumed_micro}: same global batch"
        return flag, "flag"
    if resumed_micro:
        return resumed_micro, "as the checkpoint"
    if accelerator.device.type != "cuda":
        return fit_micro_batch(global_batch, world, preset_micro), "preset"
    micro, source = probe_micro_batch(model, accelerations, accelerator.device, global_batch // world, world)
    return agree_on_micro_batch(accelerator, micro), source


def fit_micro_batch(global_batch, world, limit):
    """The largest micro-batch <= limit that divides this process's share of the global batch."""
    if global_batch % world:
        raise errors.UserError(f"--global-batch {global_batch} cannot be split over {world} processes")
    share = global_batch // world
    return max(m for m in range(1, min(limit, share) + 1) if share % m == 0)


def agree_on_micro_batch(accelerator, micro):
    """The smallest any process found: processes accumulating different counts would wait on each other for ever."""
    return int(accelerator.gather(torch.tensor([micro], device=accelerator.device)).min())


def find_micro_batch(try_step, share):
    """The largest divisor of `share` for which try_step(m) runs without running out of memory."""
    for m in sorted((d for d in range(1, share + 1) if share % d == 0), reverse=True):
        try:
            try_step(m)
            return m
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError, or cuBLAS's workspace (not the caching allocator's)
            if not isinstance(e, torch.cuda.OutOfMemoryError) and "CUBLAS_STATUS_ALLOC_FAILED" not in str(e) \
                    and "out of memory" not in str(e):
                raise
        # freed here, not inside the except: there its traceback still holds the failed try's tensors
        gc.collect()
        torch.cuda.empty_cache()
    raise errors.UserError("not even a micro-batch of 1 sequence fits on this GPU")


def probe_micro_batch(model, accelerations, device, share, world=1):
    """--micro-batch auto on a GPU: a forward + backward per candidate beside a ballast, remembered in ~/.cache/lab5/
    micro_batch.json per GPU, model config, accelerations (all), process count and share (delete it to probe again)."""
    cfg = model.cfg
    key = f"{torch.cuda.get_device_name(device)}|{vars(cfg)}|{vars(accelerations)}|world {world}|share {share}"
    cache = CACHE_HOME / "micro_batch.json"
    try:  # missing, unreadable or damaged: probe again
        known = {k: v for k, v in json.loads(cache.read_text()).items() if type(v) is int and v > 0}
    except (OSError, ValueError, AttributeError):
        known = {}
    if key in known:
        return fit_micro_batch(share, 1, known[key]), "remembered"
    # fp32 beside the weights and gradients: AdamW's two moments and one more params' worth for the optimizer
    # step's temporaries (3x); under DDP one more for its buckets and hook's copies (4x)
    ballast_size = (4 if world > 1 else 3) * sum(p.numel() for p in model.parameters())
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accelerations.precision)

    def try_step(m):
        ballast = torch.empty(ballast_size, dtype=torch.float32, device=device)
        batch = torch.zeros(m, cfg.n_positions + 1, dtype=torch.long, device=device)  # no RNG: training unchanged
        try:
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                model(batch[:, :-1], batch[:, 1:]).backward()
        finally:  # a failed backward's partial gradients too: the next try starts from none
            model.zero_grad(set_to_none=True)
            del ballast, batch

    known[key] = find_micro_batch(try_step, share)
    torch.cuda.reset_peak_memory_stats(device)  # TensorBoard's peak memory: training's, not the failed tries'
    try:
        files.write_json(cache, known)
    except errors.OutputError as e:  # a read-only home: probe again next time
        print(f"warning: the probed micro-batch is not remembered: {e}", file=sys.stderr)
    return known[key], "probed"


def batch_stream(blocks, accelerator, micro_batch, global_batch, seed, consumed):
    """This process's micro-batches after the first `consumed`. Each epoch's order is fixed by (seed, epoch):
    a resume sees what an uninterrupted run would; whole global batches: N processes see what one sees."""
    cuda = accelerator.device.type == "cuda"

    def loader(epoch):  # sharded across processes by accelerate; pinned memory, non-blocking copies
        dl = epoch_loader(blocks, micro_batch, seed, epoch, whole=global_batch, pin_memory=cuda, num_workers=0)
        return prepare_data_loader(dl, accelerator.device, num_processes=accelerator.num_processes,
                                   process_index=accelerator.process_index, put_on_device=True,
                                   rng_types=[], non_blocking=cuda)

    epoch, skip = divmod(consumed, len(loader(0)))  # len: this process's batches per epoch
    while True:
        yield from skip_first_batches(loader(epoch), skip) if skip else loader(epoch)
        epoch, skip = epoch + 1, 0


def check_enough(blocks, global_batch):
    """An epoch is whole global batches: the training blocks must hold one (said before any output)."""
    if len(blocks) < global_batch:
        raise errors.UserError(f"{len(blocks)} training blocks are fewer than one global batch ({global_batch} "
                               f"sequences): give a larger --text, or a smaller --global-batch or --seq-len")


@torch.no_grad()
def evaluate(model, blocks, accelerator, micro_batch, max_batches, unit=None):
    """Mean loss per token of max_batches x `unit` sequences (the same for any micro_batch); eager: no compiles."""
    left = max_batches * (unit or micro_batch)
    model.eval()
    loader = prepare_data_loader(epoch_loader(blocks, micro_batch, seed=0, epoch=0, drop_last=False),
                                 accelerator.device, num_processes=accelerator.num_processes,
                                 process_index=accelerator.process_index, put_on_device=True, rng_types=[])
    total = torch.zeros(2, device=accelerator.device)
    with eager_mode():
        for batch in loader:
            batch = batch[:left]
            if not len(batch):
                break
            left -= len(batch)
            with accelerator.autocast():
                loss = model(batch[:, :-1], batch[:, 1:]).float()
            total += torch.stack([loss * len(batch), torch.tensor(float(len(batch)), device=total.device)])
    total = accelerator.reduce(total, reduction="sum")
    model.train()
    return (total[0] / total[1]).item() if total[1] else float("nan")
