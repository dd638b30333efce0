"""The loop's batches (sharded by accelerate, their position two integers) and evaluate(): the validation loss."""
import torch
from accelerate.data_loader import prepare_data_loader, skip_first_batches

from data.blocks import epoch_loader
from training.device import eager_mode
from training.errors import UserError


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
        raise UserError(f"{len(blocks)} training blocks are fewer than one global batch ({global_batch} sequences): "
                        f"give a larger --text, or a smaller --global-batch or --seq-len")


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
