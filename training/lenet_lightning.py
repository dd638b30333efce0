"""lenet5.py --engine lightning: the plain loop's model, data, schedule and logging (training/lenet.py), driven
by lightning.Trainer. Imported only for it: lightning's import takes ~4 s."""
import logging
import warnings

import torch.nn.functional as F

from training.errors import UserError
from training.lenet import end_epoch, log_point, optimizer_and_schedule, start_epoch

try:
    import lightning as L
except ImportError as e:  # checked before the run folder is made
    raise UserError(f"--engine lightning needs the lightning package ({e}): pip install -r requirements.txt") from None


def fit_lightning(run):
    """Train `run` (training.lenet.LeNetRun) as lenet5.train does."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)  # "TPU available: ..."
    warnings.filterwarnings("ignore", message=".*(srun. command is available|LeafSpec)")  # hints not for us
    trainer = L.Trainer(accelerator=run.device.type, devices=1, max_epochs=run.args.epochs, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, default_root_dir=run.out_dir)
    try:
        trainer.fit(LitLeNet5(run), train_dataloaders=run.train_loader)
    except SystemExit:  # Lightning's answer to Ctrl-C: its teardown, then exit(1) with nothing said
        if trainer.interrupted:
            raise KeyboardInterrupt from None  # lenet5.main's one line and 130, as the plain loop's
        raise


class LitLeNet5(L.LightningModule):
    def __init__(self, run):
        super().__init__()
        self.model, self.run = run.model, run

    def configure_optimizers(self):
        optimizer, scheduler = optimizer_and_schedule(self.run)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_train_epoch_start(self):
        start_epoch(self.run)

    def training_step(self, batch, batch_idx):
        logits = self.model(batch[0])
        return {"loss": F.cross_entropy(logits, batch[1]), "logits": logits.detach()}

    def on_train_batch_end(self, outputs, batch, batch_idx):  # after the optimizer's and the LR's step
        log_point(self.run, self.global_step, outputs["logits"], batch[1], outputs["loss"],
                  self.lr_schedulers().get_last_lr()[0])

    def on_train_epoch_end(self):
        end_epoch(self.run, self.current_epoch + 1, self.global_step)
