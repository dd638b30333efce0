"""An acceleration declared once (a field of training/step.py's Accelerations, made by declare()) reaches
everything with no other file edited: gpt_train.py's flag, the step's model, the ladder's rows (its rung and
its "default without" row, or its candidate row), `gpt_bench.py --list`, a measured ladder's JSON, the
micro-batch probe's key, a resume's identity, a run's metrics.json and the student's report table. The worked
example of the recipe in training/step.py's docstring: a dummy acceleration declared the way a student declares
theirs."""
import json
import re
import shutil
import sys
from dataclasses import dataclass

import pytest
import torch

import gpt_train
from conftest import REPO, tiny_args
from training import budget, checkpoints, device, sample, step
from training.errors import UserError
from training.final import load_run
from training.model import GPT, GPTConfig

sys.path.insert(0, str(REPO / "benchmarks"))
import gpt_bench
import ladder_rows
from report import make_report

CHANGED = []  # (the model's class, the value) for each model the dummy changed


def mark(net, on):
    """The dummy's change to the model: it marks it (a real one would wrap its blocks, swap a module...)."""
    net.dummy_boost = on
    CHANGED.append((type(net).__name__, on))


@dataclass(frozen=True)
class WithRung(step.Accelerations):
    dummy_boost: bool = step.declare(True, "dummy boost", "a stand-in that marks the model", naive=False,
                                     model=mark, changes_numbers=True)


@dataclass(frozen=True)
class WithCandidate(step.Accelerations):
    dummy_boost: bool = step.declare(False, "dummy boost", "a stand-in that marks the model", model=mark)


def sgd(groups, accelerations, **settings):
    return torch.optim.SGD(groups, **settings)


def use_norm(net, norm):
    """A model change GPT-2's config cannot describe: RMSNorm (no bias) in place of each LayerNorm."""
    if norm == "rms":
        for block in net.h:
            block.ln_1, block.ln_2 = torch.nn.RMSNorm(net.cfg.n_embd), torch.nn.RMSNorm(net.cfg.n_embd)
        net.ln_f = torch.nn.RMSNorm(net.cfg.n_embd)


@dataclass(frozen=True)
class WithNormAndOptimizer(step.Accelerations):
    optimizer: str = step.declare("sgd", "optimizer", "the update rule", choices=("adamw", "sgd"))
    norm: str = step.declare("rms", "RMSNorm", "a stand-in", choices=("layernorm", "rms"), model=use_norm,
                             gpt2_values=("layernorm",))


@pytest.fixture(params=[WithRung])
def declared(request, monkeypatch):
    """Accelerations with the dummy declared in it, as a student's edit of training/step.py would make it."""
    monkeypatch.setattr(step, "Accelerations", request.param)
    monkeypatch.setitem(step.OPTIMIZERS, "sgd", step.Optimizer(sgd, lr=0.05, weight_decay=0.0,
                                                               settings={"momentum": 0.9}))
    CHANGED.clear()
    return request.param


def rows_named(rows):
    return {name: settings for name, settings in rows}


def tiny_ladder_json(out, *names):
    """gpt_bench.py's JSON of the tiny preset on a CPU, one repeat of one step, for the rows of these names."""
    rows = ladder_rows.ladder(False, (0, 0), vocab_size=256)
    numbers = [i for i, (name, _) in enumerate(rows, 1) if name in names]
    assert len(numbers) == len(names), f"not in the ladder: {set(names) - {n for n, _ in rows}}"
    gpt_bench.main(["--preset", "tiny", "--seq-len", "16", "--micro-batch", "2", "--vocab-size", "256", "--repeats",
                    "1", "--max-pairs", "1", "--steps", "1", "--warmup", "0", "--only", ",".join(map(str, numbers)),
                    "--metrics-out", str(out)])
    return json.loads(out.read_text())


def test_a_declared_acceleration_is_a_flag_of_gpt_train(declared, capsys):
    with pytest.raises(SystemExit):
        gpt_train.parse_args(["--help"])
    assert "--dummy-boost {on,off}" in capsys.readouterr().out
    args = gpt_train.parse_args(["--dummy-boost", "off"])
    decisions = device.decisions_for("cpu", (0, 0), "fp32", "off")
    assert step.resolve(args, decisions)[0].dummy_boost is False
    assert step.resolve(gpt_train.parse_args([]), decisions)[0].dummy_boost is True  # its declared default


def test_a_declared_rung_has_its_row_and_its_default_without_row(declared, capsys):
    """Declared with a naive value: the ladder adds it as the last rung (now gpt_train.py's default) and leaves it
    out of the default once; the rows the report rests on (group 0) include that leave-one-out row."""
    rows = ladder_rows.ladder(False, (0, 0))
    by_name = rows_named(rows)
    rungs = [name for name, _ in rows if not name.startswith(" ")]
    assert rungs[-2:] == ["+ fused AdamW", "+ dummy boost (= gpt_train.py default)"]
    assert not by_name[rungs[0]]["dummy_boost"] and by_name[rungs[-2]]["dummy_boost"] is False
    assert by_name[rungs[-1]] == {**by_name[rungs[-2]], "dummy_boost": True}
    assert by_name["  default without dummy boost"] == {**by_name[rungs[-1]], "dummy_boost": False}
    assert by_name["  default without fused AdamW"]["dummy_boost"] is True
    order = [rows[i - 1][0] for i in ladder_rows.unmeasured_first(rows)]
    assert order.index("  default without dummy boost") < order.index(rungs[1])
    listed = gpt_bench.main(["--list"])
    printed = capsys.readouterr().out.splitlines()
    number = next(i for i, (name, _) in enumerate(listed, 1) if name == "  default without dummy boost")
    assert f"{number:2d}   default without dummy boost" in printed and listed == rows


@pytest.mark.parametrize("declared", [WithCandidate], indirect=True)
def test_a_declared_candidate_has_its_row_on_top_of_the_default(declared):
    """Declared without a naive value and off by default: one candidate row, the default with it on."""
    by_name = rows_named(ladder_rows.ladder(False, (0, 0)))
    default = next(s for name, s in by_name.items() if name.endswith("(= gpt_train.py default)"))
    candidate = "  candidate: dummy boost, a stand-in that marks the model (--dummy-boost on)"
    assert by_name[candidate] == {**default, "dummy_boost": True} and default["dummy_boost"] is False
    assert "  default without dummy boost" not in by_name


def test_a_measured_ladder_holds_the_declared_rows_and_their_peak_memory(declared, tmp_path, monkeypatch):
    """The dummy's rows measured by gpt_bench.py (tiny preset): built as declared, each with its peak memory (here
    in this process: a fresh one would not see the patched declaration)."""
    monkeypatch.setattr(gpt_bench, "cpu_peak", gpt_bench.fresh_process_peak)
    out = tiny_ladder_json(tmp_path / "ladder.json", "+ dummy boost (= gpt_train.py default)",
                           "  default without dummy boost")
    _, on, off = out["rungs"]  # the rung before the default: its reference
    assert (on["settings"]["dummy_boost"], off["settings"]["dummy_boost"]) == (True, False)
    assert on["built"]["dummy_boost"] is True and off["built"]["dummy_boost"] is False
    assert set(CHANGED) == {("GPT", True), ("GPT", False)}  # each row's model, changed by the declaration
    assert on["tokens_per_second"] > 0 and (out["n_layer"], out["n_embd"]) == (2, 64)
    assert 0 < on["peak_memory_gib"] < 64 and off["verdict"]["against"] == on["name"]
    make_report.main([str(tmp_path / "ladder.json"), "--out", str(tmp_path / "report"), "--no-screenshots"])
    table = [line for line in (tmp_path / "report" / "report_filled.md").read_text().splitlines()
             if "dummy boost" in line and line.startswith("| ")]  # the student's report: the ladder tabled whole
    assert len(table) == 2 and table[0].startswith("| ") and "默认配置去掉 + dummy boost" in table[1], table


def test_the_probe_key_and_a_resumes_identity_hold_the_declared_acceleration(declared, tmp_path, monkeypatch):
    """Another value of the dummy is probed again (never another step's remembered micro-batch) and, as it changes
    the numbers, a resume with another value is refused naming its flag."""
    monkeypatch.setattr(budget, "CACHE_HOME", tmp_path / "lab5")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    cfg = GPTConfig(vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2)

    def probe(on):
        accelerations = declared(dummy_boost=on)
        return budget.probe_micro_batch(step.change_model(GPT(cfg), accelerations), accelerations, "cpu", share=4)
    assert [probe(True), probe(False), probe(True)] == [(4, "probed"), (4, "probed"), (4, "remembered")]
    keys = list(json.loads((tmp_path / "lab5" / "micro_batch.json").read_text()))
    assert len(keys) == 2 and ["'dummy_boost': True" in k for k in keys] == [True, False]
    assert checkpoints.identity_flags()["dummy_boost"] == "--dummy-boost"
    with pytest.raises(UserError, match=r"dummy_boost = on; this run has dummy_boost = off \(--dummy-boost\)"):
        checkpoints.check_same_run({"dummy_boost": "on"}, {"dummy_boost": "off"})


def test_a_runs_metrics_record_the_declared_acceleration(declared, corpus, tmp_path):
    """A tiny gpt_train.py run with --dummy-boost off: its model changed as declared, its metrics.json says so."""
    metrics = gpt_train.main(tiny_args(corpus, tmp_path / "run", "--tokens", "512", "--dummy-boost", "off"))
    assert CHANGED == [("GPT", False)]
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["accelerations"]["dummy_boost"] is False and saved["accelerations"] == metrics["accelerations"]
    assert saved["accelerations"]["fused_adamw"] is True and saved["accelerations"]["loss"] == "plain"
    assert saved["optimizer"] == "AdamW" and saved["optimizer_settings"]["betas"] == [0.9, 0.95]


@pytest.mark.parametrize("declared", [WithNormAndOptimizer], indirect=True)
def test_a_declared_model_change_and_optimizer_reach_final_sampling_and_a_resume(declared, corpus, tmp_path, capsys):
    """A model GPT-2's config cannot describe (RMSNorm) trained by a declared optimizer (SGD, its own lr):
    metrics.json names the optimizer as built; final/ records the change and, holding no config.json, transformers
    refuses it; sampling rebuilds the model from final/ and from a checkpoint; a resume with another value or
    another optimizer is refused in one line."""
    run = tmp_path / "run"
    common = ["--tokens", "1024", "--ckpt-every", "2", "--keep-checkpoints", "--sample-tokens", "4"]
    metrics = gpt_train.main(tiny_args(corpus, run, *common))
    assert metrics["optimizer"] == "SGD" and metrics["optimizer_settings"]["momentum"] == 0.9
    assert metrics["optimizer_settings"]["lr"] == pytest.approx(0.05 * 3)  # its own lr, x the tiny preset's scale
    assert metrics["accelerations"]["fused_adamw"] is None and metrics["accelerations"]["norm"] == "rms"
    assert "final/ is no transformers model: GPT-2's config cannot describe --norm rms" in capsys.readouterr().out
    final = run / "final"
    assert not (final / "config.json").exists() and not (final / "model.safetensors").exists()
    own = json.loads((final / "lab5.json").read_text())
    assert own["lab5"] == {"norm": "rms", "loss": "plain"} and own["transformers"].startswith("declined")
    from transformers import GPT2LMHeadModel
    with pytest.raises(OSError, match="model.safetensors"):
        GPT2LMHeadModel.from_pretrained(final, local_files_only=True)
    model, _ = load_run(run, None, torch.device("cpu"))
    assert isinstance(model.ln_f, torch.nn.RMSNorm) and model.changes["norm"] == "rms"
    assert sample.main([str(run), "--prompt", "The", "--tokens", "3", "--temperature", "0"])
    (run / "metrics.json").unlink()  # unfinished: resumed from its checkpoint, sampled from it
    shutil.rmtree(final)
    assert isinstance(load_run(run, None, torch.device("cpu"))[0].ln_f, torch.nn.RMSNorm)
    for change, message in [(["--norm", "layernorm"], "norm = rms; this run has norm = layernorm (--norm)"),
                            (["--optimizer", "adamw"], "this run has lr = 0.003, weight_decay = 0.1, optimizer = "
                                                       "adamw (--lr, --weight-decay, --optimizer)")]:
        with pytest.raises(SystemExit, match=re.escape(message)):
            gpt_train.main(tiny_args(corpus, run, *common, *change))
