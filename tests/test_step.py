"""training/step.py: the one training step gpt_train.py trains with and the acceleration ladder measures.
The ladder's default row must build exactly the step gpt_train.py builds with its defaults on the same
device: optimizer groups and hyper-parameters, scaler, clipping, precision, compile mode, attention."""
import sys
from dataclasses import asdict

import pytest
import torch

import gpt_train
from conftest import REPO
from training import device, step
from training.model import GPT, model_config

sys.path.insert(0, str(REPO / "benchmarks"))
import gpt_bench
import ladder_rows


@pytest.mark.parametrize("cuda, capability", [(False, (0, 0)), (True, (9, 0)), (True, (8, 0)), (True, (7, 5))])
def test_the_ladders_last_rung_is_gpt_trains_default_on_every_device(cuda, capability):
    rungs = [settings for name, settings in ladder_rows.ladder(cuda, capability) if not name.startswith(" ")]
    args = gpt_train.parse_args([])
    dtype = "cuda" if cuda else "cpu"
    expected = step.Accelerations(
        precision=device.resolve_precision(args.precision, dtype, capability, device.cpu_has_bf16()),
        tf32=cuda and capability >= (8, 0), attention="sdpa",
        compile=device.resolve_compile(args.compile, dtype, capability)[0],
        fused_adamw=args.fused_adamw == "on", loss=args.loss)
    assert rungs[-1] == {"model": "own", "dropout": 0.0, **asdict(expected)}
    assert rungs[0]["model"] == "hf" and rungs[0]["precision"] == "fp32" and not rungs[0]["fused_adamw"]


@pytest.mark.slow
def test_the_ladders_default_row_builds_exactly_the_step_gpt_train_builds(corpus, tmp_path, monkeypatch):
    """gpt_train.py with its defaults (the lab preset; only the budget and sequence shortened), its built
    TrainStep captured, against the ladder's default row built by gpt_bench for the same shape: equal as built."""
    built = []
    real_build = step.build

    def capture(*a, **kw):
        built.append(run := real_build(*a, **kw))
        return run
    monkeypatch.setattr(step, "build", capture)
    gpt_train.main(["--text", str(corpus / "X.txt"), "--tokenizer", str(corpus / "tok.json"), "--cache-dir",
                    str(corpus / "cache"), "--out-dir", str(tmp_path / "run"), "--seq-len", "32", "--global-batch",
                    "1", "--micro-batch", "1", "--tokens", "32", "--val-batches", "1", "--val-fraction", "0.05",
                    "--sample-tokens", "0"])
    trained = built[0].describe()
    cuda = torch.cuda.is_available()
    capability = torch.cuda.get_device_capability() if cuda else (0, 0)
    rows = dict(ladder_rows.ladder(cuda, capability))
    default = next(s for name, s in rows.items() if name.endswith("(= gpt_train.py default)"))
    _, row = gpt_bench.build(default, 512, 32, ladder_rows.default_step(cuda, capability)[1])
    assert row.describe() == trained
    assert trained["recipe"] == {"lr": 1e-3, "weight_decay": 0.1, "grad_clip": 1.0}
    assert trained["optimizer"] == "AdamW" and trained["param_groups"][0]["betas"] == (0.9, 0.95)
    assert [g["weight_decay"] for g in trained["param_groups"]] == [0.1, 0.0]  # matrices decay, the rest not


def test_describe_reads_what_was_built_not_what_was_asked():
    """A step built around another optimizer's settings reads back as such (describe() is not the request)."""
    model = GPT(model_config(64, 0, n_layer=1, n_head=2, n_embd=16, n_positions=8))
    accelerations = step.Accelerations(fused_adamw=False)
    run = step.build(model, accelerations, step.Recipe(lr=1e-3, weight_decay=0.1, grad_clip=1.0),
                     step.make_accelerator(accelerations, True))
    run.optimizer.param_groups[0]["betas"] = (0.9, 0.999)
    assert run.describe()["param_groups"][0]["betas"] == (0.9, 0.999)
    assert run.describe()["param_groups"][0]["fused"] is None and run.describe()["scaler_init"] is None


def test_a_step_accumulates_micro_batches_into_one_update():
    """A TrainStep over two micro-batches of 2 equals one micro-batch of 4 (the same gradient, one update)."""
    def one(n_micro, micro):
        torch.manual_seed(0)
        model = GPT(model_config(64, 0, n_layer=1, n_head=2, n_embd=16, n_positions=8))
        accelerations = step.Accelerations(fused_adamw=False)
        run = step.build(model, accelerations, step.Recipe(lr=1e-2, weight_decay=0.1, grad_clip=1.0),
                         step.make_accelerator(accelerations, True))
        data = torch.randint(0, 64, (4, 9))
        losses = []
        run(iter(data.split(micro)), n_micro, 1e-2, losses.append)
        return [p.detach().clone() for p in model.parameters()], sum(losses)
    (a, la), (b, lb) = one(2, 2), one(1, 4)
    assert torch.allclose(la, lb, atol=1e-6)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b))


def test_a_forced_sdpa_backend_this_torch_lacks_is_the_rows_error():
    with pytest.raises(RuntimeError, match="has no SDPBackend"), \
            pytest.MonkeyPatch.context() as m:
        m.setitem(step.SDPA_BACKENDS, "nonexistent", "NO_SUCH_BACKEND")
        step.sdpa_context("nonexistent")


def test_the_ladder_runs_the_same_step_function_as_gpt_train():
    """Both go through TrainStep.__call__: the ladder's timed step is gpt_train's loop step, not a copy."""
    calls = []
    real = step.TrainStep.__call__

    def spy(self, *a, **kw):
        calls.append(self.accelerations)
        return real(self, *a, **kw)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(step.TrainStep, "__call__", spy)
        settings = dict(ladder_rows.ladder(False, (0, 0)))
        row = next(s for name, s in settings.items() if name.startswith("naive"))
        args = type("A", (), {"micro_batch": 1, "seq_len": 8, "warmup": 1, "vocab_size": 64, "shape": {},
                              "device": torch.device("cpu"), "recipe": step.Recipe(lr=1e-3, weight_decay=0.1,
                                                                                   grad_clip=1.0)})
        gpt_bench.Row({"settings": row}, args)  # built and warmed up: one step
    assert calls == [ladder_rows.accelerations(row)]
