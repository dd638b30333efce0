"""The training step, built in one place (build()) for gpt_train.py and every ladder row, so the ladder
measures the step that trains. Why each acceleration (where `auto` decides: training/device.py):
  precision      16-bit matmuls on tensor cores, half the bytes; fp16 needs loss scaling (GradScaler)
  TF32           what stays fp32 runs on tensor cores too, with a 10-bit mantissa (sm80+)
  SDPA           attention in one fused kernel, no T x T matrix in memory (the metrics name the kernel)
  torch.compile  fuses the elementwise work around the matmuls; off by default: 12M tokens do not repay it
  accumulation   micro-batches as large as fit, gradients all-reduced once per optimizer step (no_sync)
  optimizer, fused AdamW, chunked loss: flags of their own, each declared once (with its why) in Accelerations.

To add an acceleration, declare it in Accelerations:
`name: type = declare(default, label, why, ...)` (see Acceleration);
its --name flag, the model's change, metrics.json, the probe's key,
a resume's identity, final/ and the ladder's rows follow.
A change to the model, e.g. RMSNorm in place of LayerNorm:

    norm: str = declare("layernorm", "RMSNorm", "one statistic fewer",
                        choices=("layernorm", "rms"), model=use_norm,
                        gpt2_values=("layernorm",))

(use_norm(net, value) swaps the modules). final/ records it; sampling
and a resume rebuild it; with "rms" final/ holds no transformers model
(GPT-2's config cannot describe it) and the run says so.
An optimizer, e.g. Lion, is one more entry of OPTIMIZERS, with its own
defaults:

    "lion": Optimizer(make_lion, lr=1e-4, weight_decay=1.0,
                      settings={"betas": (0.9, 0.99)}),

--optimizer lion builds it, --lr and --weight-decay default to its
values, metrics.json names it with its settings.

A declaration changes the numbers (a resume must keep it) unless it
says changes_numbers=False. `python benchmarks/gpt_bench.py --list`
numbers the ladder's rows, `--only 1,N --metrics-out mine.json`
measures them; name mine.json to report/make_report.py.
A worked example: benchmarks/README.md."""
import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace

import torch

from training import device
from training.metrics import scope

SCALER_INIT = 2.0**12  # fp16's first loss scale: GradScaler's own 2^16 overflows in the first steps
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}  # torch.nn.attention.SDPBackend's members, by the ladder's short names


@dataclass(frozen=True)
class Acceleration:
    """An acceleration with a flag of its own: a field of Accelerations made by declare()."""
    label: str  # the ladder's name for it: "+ label", "default without label", "candidate: label, why"
    why: str  # one line: its --help, its candidate row
    default: object  # gpt_train.py's; True/False: a flag of on/off
    choices: tuple = ()  # its values (True/False: on/off)
    naive: object = None  # the ladder's naive value: then a rung of its own and a "default without" row
    model: Callable | None = None  # model(net, value): its change to the model built (training/model.py's GPT)
    gpt2_values: tuple = ()  # the values with which the changed model is still GPT-2's (transformers loads final/)
    changes_numbers: bool = True  # a resume must keep it (training/checkpoints.py's identity); False: the same math
    name: str = ""  # the field's (declared() fills it in): metrics.json's, the ladder's rows'
    flag: str = ""  # gpt_train.py's: --name, dashes for underscores

    def values(self):  # {the flag's text: the value}
        return {"on": True, "off": False} if isinstance(self.default, bool) else {str(c): c for c in self.choices}


def declare(default, label, why, **more):
    return field(default=default, metadata={"acceleration": Acceleration(label, why, default, **more)})


@dataclass(frozen=True)
class Optimizer:
    """An optimizer --optimizer names, with its own defaults: --lr and --weight-decay default to them."""
    make: Callable  # make(param_groups, accelerations, lr=, **settings) -> a torch.optim.Optimizer
    lr: float  # the peak learning rate at the lab preset (a preset's lr_scale multiplies it)
    weight_decay: float  # of the matrices and embeddings (biases and norms: none)
    settings: dict = field(default_factory=dict)  # its other hyper-parameters: betas, eps...


def adamw(groups, accelerations, **settings):
    return torch.optim.AdamW(groups, **settings, fused=accelerations.fused_adamw or None)  # None: foreach


OPTIMIZERS = {  # --optimizer's choices
    "adamw": Optimizer(adamw, lr=1e-3, weight_decay=0.1, settings={"betas": (0.9, 0.95), "eps": 1e-8}),
}


@dataclass(frozen=True)
class Accelerations:
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 with a GradScaler)
    tf32: bool = False  # fp32 matmuls on TF32 tensor cores (GPUs only)
    attention: str = "sdpa"  # sdpa | eager (the model's attention: training/model.py)
    sdpa_backend: str | None = None  # a forced SDPA kernel (SDPA_BACKENDS; the ladder's rows); None: torch's choice
    compile: str = "off"  # off | regional | whole
    # with a flag of their own: declare(default, label, why, ...), see Acceleration; the ladder's rungs in this order
    optimizer: str = declare("adamw", "optimizer", "the update rule (OPTIMIZERS)", choices=tuple(OPTIMIZERS))
    fused_adamw: bool = declare(True, "fused AdamW", "the whole AdamW update in one kernel reading each parameter "
                                "once (foreach makes several passes)", naive=False, changes_numbers=False)
    loss: str = declare("plain", "chunked loss", "no full fp32 logits", choices=("plain", "chunked"),
                        model=lambda net, loss: setattr(net, "loss", loss), gpt2_values=("plain", "chunked"),
                        changes_numbers=False)  # training/model.py's chunked_cross_entropy: the same math


def declared():
    """The accelerations made by declare(), named: gpt_train.py's flags, the ladder's rows, the model's changes."""
    return [replace(f.metadata["acceleration"], name=f.name, flag="--" + f.name.replace("_", "-"))
            for f in fields(Accelerations) if "acceleration" in f.metadata]


def not_gpt2(changes):
    """The flags of those `changes` (a model's, change_model's record) that GPT-2's config cannot describe."""
    return [f"{a.flag} {text}" for a in declared() if a.name in changes for text, value in a.values().items()
            if value == changes[a.name] and value not in a.gpt2_values]


@dataclass(frozen=True)
class Recipe:
    """The schedule's peak and the clip: they change the numbers, so every ladder row uses gpt_train's."""
    lr: float
    weight_decay: float
    grad_clip: float


def resolve(args, decisions):
    """(Accelerations, Recipe) of gpt_train.py's flags, as training/device.py decided precision, TF32, compile."""
    accelerations = Accelerations(precision=decisions.precision, tf32=decisions.tf32, compile=decisions.compile_mode,
                                  **{a.name: a.values()[getattr(args, a.name)] for a in declared()})
    return accelerations, Recipe(lr=args.lr, weight_decay=args.weight_decay, grad_clip=args.grad_clip)


def change_model(net, accelerations):
    """`net` with each declared acceleration's change, before the micro-batch probe and the optimizer see it;
    net.changes records them (final/ keeps them: training/final.py rebuilds the same model)."""
    net.changes = {a.name: getattr(accelerations, a.name) for a in declared() if a.model}
    for a in filter(lambda a: a.model, declared()):
        a.model(net, net.changes[a.name])
    return net


def make_accelerator(accelerations, fresh=False):
    """accelerate's Accelerator: autocast, fp16's GradScaler, DDP's hooks, TF32. fresh: one per ladder row."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import GradScalerKwargs
    if fresh:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    precision = accelerations.precision
    handlers = [GradScalerKwargs(init_scale=SCALER_INIT)] if precision == "fp16" else []
    cuda = torch.cuda.is_available()
    # cpu=True where there is no GPU: only then does accelerate turn torchrun's processes into gloo ranks
    accelerator = Accelerator(mixed_precision={"fp32": "no"}.get(precision, precision), cpu=not cuda,
                              kwargs_handlers=handlers + device.ddp_handlers(precision))
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = accelerations.tf32 and cuda
    return accelerator


def build(model, accelerations, recipe, accelerator):
    """The TrainStep for `model` (on the accelerator's device): the optimizer, accelerate's prepare (DDP), compile."""
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings; biases and norms do not
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    declared_one = OPTIMIZERS[accelerations.optimizer]
    optimizer = declared_one.make([{"params": decay, "weight_decay": recipe.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], accelerations, lr=recipe.lr,
                                  **declared_one.settings)
    model, optimizer = accelerator.prepare(model, optimizer)
    compiled = device.compile_model(model, accelerations.compile)
    return TrainStep(accelerator, model, compiled, optimizer, accelerations, recipe)


@dataclass
class TrainStep:
    accelerator: object
    model: torch.nn.Module  # DDP-wrapped with several processes: checkpoints and evaluation use it
    train_model: torch.nn.Module  # the same module, compiled: the training steps call it
    optimizer: torch.optim.Optimizer
    accelerations: Accelerations
    recipe: Recipe

    def __call__(self, batches, n_micro, lr, add_loss):
        """One optimizer step over `n_micro` micro-batches -> the gradient norm (reading it: a sync point)."""
        accelerator, model = self.accelerator, self.model
        for i in range(n_micro):  # gradients accumulate; DDP all-reduces them after the last one only
            with scope("data"):
                batch = next(batches)
            with contextlib.nullcontext() if i == n_micro - 1 else accelerator.no_sync(model), \
                    sdpa_context(self.accelerations.sdpa_backend):
                loss = self.train_model(batch[:, :-1], batch[:, 1:])
                accelerator.backward(loss / n_micro)  # fp16: the loss is scaled here (GradScaler)
            add_loss(loss.detach() / n_micro)
        with scope("optimizer"):
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), self.recipe.grad_clip)  # fp16: unscaled first
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()  # fp16: skipped when the gradients overflowed
            self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def optimizer_settings(self):
        """{"name": its class, the decaying group's settings as built, "lr": the peak}: metrics.json's optimizer."""
        opt = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate's AcceleratedOptimizer holds it
        group = {k: v for k, v in opt.param_groups[0].items() if k != "params" and not torch.is_tensor(v)}
        return {"name": type(opt).__name__, **group, "lr": self.recipe.lr}

    def describe(self):
        """What was built, read back from the objects themselves (not what was asked for)."""
        opt = getattr(self.optimizer, "optimizer", self.optimizer)
        keys = ("lr", "betas", "eps", "weight_decay", "fused", "foreach", "amsgrad", "maximize")
        scaler = self.accelerator.scaler
        return {**asdict(self.accelerations), "recipe": asdict(self.recipe), "optimizer": type(opt).__name__,
                "param_groups": [{**{k: g.get(k) for k in keys}, "params": sum(p.numel() for p in g["params"])}
                                 for g in opt.param_groups],
                "scaler_init": scaler.get_scale() if scaler else None,
                "mixed_precision": self.accelerator.mixed_precision,
                "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
                "compiled": self.train_model is not self.model or self.accelerations.compile == "regional",
                "attention_kernel": attention_kernel(self.accelerator.unwrap_model(self.model), self.accelerations)}


def attention_kernel(net, accelerations):
    """The attention kernel the step runs: the forced SDPA backend, torch's own choice, or eager attention."""
    if net.attention != "sdpa":
        return "eager (no SDPA)"
    if accelerations.sdpa_backend:  # in training.device.sdpa_backend's names: SDPBackend's member, lower case
        return SDPA_BACKENDS[accelerations.sdpa_backend].lower() + " (forced)"
    return device.sdpa_backend(net.cfg, accelerations.precision, next(net.parameters()).device)


def sdpa_context(forced):
    """SDPA restricted to the `forced` backend (the ladder's rows); one this torch lacks fails that row only."""
    if not forced:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if (member := getattr(SDPBackend, SDPA_BACKENDS[forced], None)) is None:
        raise RuntimeError(f"torch {torch.__version__} has no SDPBackend.{SDPA_BACKENDS[forced]}")
    return sdpa_kernel([member])
