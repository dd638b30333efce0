"""lenet5.py --engine lightning (the handout's bonus): the same model, batches, optimizer, schedule and
test pass as lenet5.py's plain loop, driven by lightning.Trainer, which runs the loop, steps optimizer
and scheduler, runs the test pass and the callbacks. The data already lives on the device, so it moves
nothing. lightning is imported on first use: the import takes ~4 s the plain loop need not pay."""
import logging
import time
import warnings

import torch
import torch.nn.functional as F

from training import UserError
from training.lenet import add_graph, count_correct, epoch_done, log_point, warmup_cosine


def need_lightning():
    """lightning, or one line saying how to get it (checked before the run folder is made)."""
    try:
        import lightning
    except ImportError as e:
        raise UserError(f"--engine lightning needs the lightning package ({e}): "
                        "pip install -r requirements.txt") from None
    return lightning


def fit_lightning(run):
    """Train `run` (training.lenet.LeNetRun) as lenet5.fit_plain does, filling it in the same way."""
    L = need_lightning()
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)  # "TPU available: ..."
    warnings.filterwarnings("ignore", message=".*(srun. command is available|LeafSpec)")  # hints not for us
    args = run.args
    run.phases.switch("logging")
    logger = L.pytorch.loggers.TensorBoardLogger(run.out_dir, name="", version="", default_hp_metric=False)
    add_graph(logger.experiment, run.model, run.digits)
    lit = lightning_module(L)(run, args.epochs * len(run.train_loader))
    trainer = L.Trainer(accelerator=run.device.type, devices=1, max_epochs=args.epochs, logger=logger,
                        callbacks=[epoch_callback(L)(run)], enable_checkpointing=False, enable_progress_bar=False,
                        num_sanity_val_steps=0, log_every_n_steps=args.log_every)
    try:
        trainer.fit(lit, train_dataloaders=run.train_loader, val_dataloaders=run.test_loader)
    except SystemExit:  # Lightning's answer to Ctrl-C: its teardown, then exit(1) with nothing said
        if trainer.interrupted:
            raise KeyboardInterrupt from None  # lenet5.main's one line and 130, as the plain loop's
        raise
    run.phases.log(logger.experiment, trainer.global_step)
    logger.experiment.flush()  # raises what the writer thread could not write
    logger.experiment.close()


def lightning_module(L):
    """LeNet-5 as a LightningModule (the class is made on first use, with lightning imported)."""

    class LitLeNet5(L.LightningModule):
        def __init__(self, run, total_steps):
            super().__init__()
            self.model, self.run, self.total_steps = run.model, run, total_steps
            self.test_result = None

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.model(x)
            count_correct(self.run, logits, y)
            return F.cross_entropy(logits, y)

        def on_train_batch_end(self, outputs, batch, batch_idx):  # after the optimizer's and the LR's step
            if self.global_step % self.run.args.log_every == 0:  # as the plain loop: a sync point
                log_point(self.run, self.logger.experiment, self.global_step, outputs["loss"],
                          self.lr_schedulers().get_last_lr()[0])

        def on_validation_epoch_start(self):
            self.sums = torch.zeros(2, device=self.device)  # summed loss, correct predictions

        def validation_step(self, batch, batch_idx):  # the test set, after every epoch (as the plain loop)
            x, y = batch
            logits = self.model(x)
            self.sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum()])

        def on_validation_epoch_end(self):
            n = len(self.trainer.val_dataloaders.dataset)
            loss_sum, correct = self.sums.tolist()
            self.test_result = (loss_sum / n, correct / n)

        def configure_optimizers(self):
            args = self.run.args
            optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=1e-4)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(self.total_steps))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return LitLeNet5


def epoch_callback(L):
    """A Callback that times the training part of each epoch (the plain loop's train_seconds) and then
    does what the plain loop does after an epoch (training.lenet.epoch_done)."""

    class EpochEnd(L.Callback):
        def __init__(self, run):
            self.run = run

        def on_train_epoch_start(self, trainer, lit):
            self.run.phases.switch("loop")
            self.t0 = time.perf_counter()

        def on_validation_epoch_start(self, trainer, lit):  # the epoch's training batches are done
            if self.run.device.type == "cuda":
                torch.cuda.synchronize()
            self.run.train_seconds += time.perf_counter() - self.t0
            self.run.phases.switch("evaluation")

        def on_validation_end(self, trainer, lit):  # after the module's on_validation_epoch_end
            self.run.phases.switch("logging")
            test_loss, test_acc = lit.test_result
            epoch_done(self.run, trainer.logger.experiment, trainer.current_epoch + 1, trainer.global_step,
                       test_loss, test_acc)

    return EpochEnd
