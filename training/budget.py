"""The token budget in whole micro-batches, and the micro-batch itself: from the checkpoint, the
flag, the preset (CPU) or a probe of what fits this GPU; with several processes, the smallest."""
import gc
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from data import files
from data.files import UserError
from training import CACHE_HOME


@dataclass(frozen=True)
class Budget:
    """The token budget in whole micro-batches.

    One optimizer step = `accum` micro-batch rounds; one round = `micro_batch` sequences on each
    of `world` processes. The budget is rounded up to whole rounds (`total_micro`), so the last
    step may accumulate fewer rounds; the gradient is then averaged over those it had.
    """
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

    def micro_in_step(self, micro_done):
        """Rounds in the step that starts after `micro_done` rounds: accum, fewer only at the very end."""
        return min(self.accum, self.total_micro - micro_done)


class Due(NamedTuple):
    """What is due after an optimizer step."""
    log: bool  # a point of the loss curve (a sync point: the loss is read)
    evaluate: bool  # a validation loss (the final one follows the loop)
    checkpoint: bool
    last: bool  # the budget is spent


def due(step, args, total_steps):
    """What is due after `step`, from the run's flags; a checkpoint after the last step is written only with
    --keep-checkpoints (a finished run keeps its final weights instead)."""
    last = step == total_steps
    ckpt = args.keep_checkpoints if last else bool(args.ckpt_every and step % args.ckpt_every == 0)
    return Due(log=step % args.log_every == 0 or last, evaluate=step % args.eval_every == 0 and not last,
               checkpoint=ckpt, last=last)


TRAINING_BYTES_PER_PARAM = 16  # fp32 weights, gradients and AdamW's two moments (activations come on top)


def parameter_count(n_layer, n_embd, seq_len, vocab_size):
    """GPT-2's parameters for this shape (training/model.py; the vocabulary padded to 64): per block 12 C^2 + 13 C
    (attention 4 C^2, MLP 8 C^2, biases, two LayerNorms), embeddings of tokens and positions, the last LayerNorm."""
    padded = (vocab_size + 63) // 64 * 64
    return (padded + seq_len) * n_embd + n_layer * (12 * n_embd**2 + 13 * n_embd) + 2 * n_embd


def check_model_fits(args, vocab_size, device):
    """Before any data is read: the model's weights, gradients and optimizer state fit the memory there is
    (a GPU's free memory, a CPU's available memory); a shape that cannot is one line, not an allocation
    failure after minutes of tokenising."""
    need = TRAINING_BYTES_PER_PARAM * parameter_count(args.n_layer, args.n_embd, args.seq_len, vocab_size)
    have = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_memory()
    if have is not None and need > have:
        raise UserError(f"a model of --n-layer {args.n_layer} --n-embd {args.n_embd} --seq-len {args.seq_len} needs "
                        f"~{need / 2**30:,.1f} GiB for its weights, gradients and AdamW alone; "
                        f"{device.type} has {have / 2**30:,.1f} GiB available")


def available_memory():
    """The memory the kernel says a new allocation can have (MemAvailable), or None where it cannot say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def plan_budget(tokens, global_batch, micro_batch, world, seq_len, unit=None):
    """The Budget of `tokens` in whole micro-batches of `unit` (the run's first micro-batch; default
    `micro_batch`), counted in micro-batches of `micro_batch`: a resume with another micro-batch takes
    the same sequences, so the same steps and learning-rate schedule."""
    if global_batch % (micro_batch * world):
        raise UserError(f"--global-batch {global_batch} is not a multiple of micro-batch {micro_batch} x "
                        f"{world} processes")
    unit = unit or micro_batch
    sequences = math.ceil(tokens / (unit * world * seq_len)) * unit  # per process
    return Budget(micro_batch, world, global_batch // (micro_batch * world), seq_len,
                  math.ceil(sequences / micro_batch), unit if unit != micro_batch else 0)


def choose_micro_batch(flag, model, accelerator, precision, global_batch, preset_micro, resumed_micro=None):
    """(micro-batch, where it came from). The flag wins, on a resume too (the same global batch is the
    same run: a run that ran out of memory resumes with a smaller one); auto keeps a resume's, on a GPU
    probes, on CPU takes the preset's; at most this process's share."""
    world = accelerator.num_processes
    if flag != "auto":
        if resumed_micro and flag != resumed_micro:
            return flag, f"flag; the checkpoint had {resumed_micro}: same global batch"
        return flag, "flag"
    if resumed_micro:
        return resumed_micro, "as the checkpoint"
    if accelerator.device.type != "cuda":
        return fit_micro_batch(global_batch, world, preset_micro), "preset"
    micro, source = probe_micro_batch(model, precision, accelerator.device, global_batch // world, world)
    return agree_on_micro_batch(accelerator, micro), source


def fit_micro_batch(global_batch, world, limit):
    """The largest micro-batch <= limit that divides this process's share of the global batch."""
    if global_batch % world:
        raise UserError(f"--global-batch {global_batch} cannot be split over {world} processes")
    share = global_batch // world
    return max(m for m in range(1, min(limit, share) + 1) if share % m == 0)


def agree_on_micro_batch(accelerator, micro):
    """The smallest micro-batch any process found: the GPUs of one job may differ in free memory, and
    processes accumulating different numbers of micro-batches would wait on each other for ever."""
    return int(accelerator.gather(torch.tensor([micro], device=accelerator.device)).min())


def find_micro_batch(try_step, share):
    """The largest divisor of `share` for which try_step(m) runs without running out of memory:
    share, share/2, ... (divisors, largest first); out-of-memory errors are caught and freed."""
    for m in sorted((d for d in range(1, share + 1) if share % d == 0), reverse=True):
        try:
            try_step(m)
            return m
        except torch.cuda.OutOfMemoryError:  # torch.OutOfMemoryError only exists from torch 2.5
            pass
        except RuntimeError as e:  # cuBLAS's workspace is not the caching allocator's: a plain RuntimeError
            if not out_of_memory(e):
                raise
        # freed here, not inside the except: there its traceback still holds the failed try's tensors
        gc.collect()
        torch.cuda.empty_cache()
    raise UserError("not even a micro-batch of 1 sequence fits on this GPU")


def out_of_memory(error):
    """A RuntimeError that is a failed allocation (cuBLAS's handle or workspace), not a bug to hide."""
    return any(s in str(error) for s in ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED"))


def probe_micro_batch(model, precision, device, share, world=1):
    """--micro-batch auto on a GPU: a real forward + backward per candidate, with a ballast for what
    training allocates later (probe_ballast). Remembered per GPU name, shape, loss (a chunked loss fits
    more than the plain one), process count (DDP's buckets) and this process's share of the global batch
    in ~/.cache/lab5/micro_batch.json; delete an entry (or the file) to probe again."""
    cfg = model.cfg
    key = (f"{torch.cuda.get_device_name(device)}|{cfg.n_layer}x{cfg.n_embd}|seq {cfg.n_positions}|vocab "
           f"{cfg.vocab_size}|{precision}|{model.attention}|loss {model.loss}|world {world}|share {share}")
    cache = CACHE_HOME / "micro_batch.json"
    known = read_probe_cache(cache)
    if key in known:
        return fit_micro_batch(share, 1, known[key]), "remembered"
    ballast_size = probe_ballast(sum(p.numel() for p in model.parameters()), world)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def try_step(m):
        ballast = torch.empty(ballast_size, dtype=torch.float32, device=device)
        batch = torch.zeros(m, cfg.n_positions + 1, dtype=torch.long, device=device)  # no RNG: training unchanged
        try:
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                model(batch[:, :-1], batch[:, 1:]).backward()
        finally:  # a failed backward's partial gradients too: the next try starts from none
            model.zero_grad(set_to_none=True)
            del ballast, batch

    found = find_micro_batch(try_step, share)
    torch.cuda.reset_peak_memory_stats(device)  # TensorBoard's peak memory: training's, not the failed tries'
    known[key] = found
    try:
        files.write_json(cache, known)
    except files.OutputError as e:  # a read-only home: probe again next time
        print(f"warning: the probed micro-batch is not remembered: {e}", file=sys.stderr)
    return found, "probed"


def probe_ballast(n_params, world):
    """fp32 elements held beside the probe's own weights and gradients: AdamW's two moments and one
    more params' worth for the optimizer step's temporaries (3x); under DDP one more for its gradient
    buckets and the compression hook's copies (4x)."""
    return (4 if world > 1 else 3) * n_params


def read_probe_cache(path):
    """{key: micro-batch} from micro_batch.json; a missing or damaged file is an empty one (probe again)."""
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):  # missing, unreadable, not JSON, not UTF-8
        return {}
    if not isinstance(known, dict):
        return {}
    return {k: v for k, v in known.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
