"""lenet5.py --engine lightning (the handout's bonus): the same model, batches, optimizer, schedule and
test pass as lenet5.py's plain loop, driven by lightning.Trainer, which runs the loop, steps optimizer
and scheduler and runs the test pass (its validation loop); the hooks below fill in the LeNetRun as the
plain loop does. The data already lives on the device, so Lightning moves nothing. Imported only for
--engine lightning: lightning's import takes ~4 s the plain loop need not pay."""
import logging
import time
import warnings

import torch
import torch.nn.functional as F

from data.files import UserError
from training.lenet import add_graph, count_correct, epoch_done, log_point, warmup_cosine

try:
    import lightning as L
except ImportError as e:  # checked before the run folder is made
    raise UserError(f"--engine lightning needs the lightning package ({e}): pip install -r requirements.txt") from None


def fit_lightning(run):
    """Train `run` (training.lenet.LeNetRun) as lenet5.fit_plain does, filling it in the same way."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)  # "TPU available: ..."
    warnings.filterwarnings("ignore", message=".*(srun. command is available|LeafSpec)")  # hints not for us
    run.phases.switch("logging")
    logger = L.pytorch.loggers.TensorBoardLogger(run.out_dir, name="", version="", default_hp_metric=False)
    add_graph(logger.experiment, run.model, run.digits)
    trainer = L.Trainer(accelerator=run.device.type, devices=1, max_epochs=run.args.epochs, logger=logger,
                        enable_checkpointing=False, enable_progress_bar=False, num_sanity_val_steps=0,
                        log_every_n_steps=run.args.log_every)
    try:
        trainer.fit(LitLeNet5(run), train_dataloaders=run.train_loader, val_dataloaders=run.test_loader)
    except SystemExit:  # Lightning's answer to Ctrl-C: its teardown, then exit(1) with nothing said
        if trainer.interrupted:
            raise KeyboardInterrupt from None  # lenet5.main's one line and 130, as the plain loop's
        raise
    run.phases.log(logger.experiment, trainer.global_step)
    logger.experiment.flush()  # raises what the writer thread could not write
    logger.experiment.close()


class LitLeNet5(L.LightningModule):
    def __init__(self, run):
        super().__init__()
        self.model, self.run = run.model, run

    def configure_optimizers(self):
        args = self.run.args
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=1e-4)
        schedule = warmup_cosine(args.epochs * len(self.run.train_loader))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_train_epoch_start(self):
        self.run.phases.switch("loop")
        self.t0 = time.perf_counter()

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.model(x)
        count_correct(self.run, logits, y)
        return F.cross_entropy(logits, y)

    def on_train_batch_end(self, outputs, batch, batch_idx):  # after the optimizer's and the LR's step
        if self.global_step % self.run.args.log_every == 0:  # as the plain loop: a sync point
            log_point(self.run, self.logger.experiment, self.global_step, outputs["loss"],
                      self.lr_schedulers().get_last_lr()[0])

    def on_validation_epoch_start(self):  # the epoch's training batches are done: the test pass
        if self.run.device.type == "cuda":
            torch.cuda.synchronize()  # so the timing covers the GPU work, not just its launch
        self.run.train_seconds += time.perf_counter() - self.t0
        self.run.phases.switch("evaluation")
        self.sums = torch.zeros(2, device=self.device)  # summed loss, right predictions

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.model(x)
        self.sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum()])

    def on_validation_epoch_end(self):
        run = self.run
        (loss_sum, correct), n = self.sums.tolist(), len(run.test_loader.dataset)
        run.phases.switch("logging")
        epoch_done(run, self.logger.experiment, self.current_epoch + 1, self.global_step, loss_sum / n, correct / n)
