"""benchmarks/gpt_bench.py: the ladder's rows (vocabulary, candidates, labels, references), verdicts from paired
ratios that a busy machine does not flip, the matmul fraction at most 1, each row's own peak memory, --like,
failed rows recorded, rows written as they finish."""
import json
import random
import subprocess
import sys
import types

import pytest
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import gpt_bench


def rows_by_name(cuda, capability, **kw):
    return dict(gpt_bench.ladder(cuda, capability, **kw))


@pytest.mark.parametrize("cuda, capability", [(False, (0, 0)), (True, (9, 0)), (True, (7, 5))])
def test_the_vocabulary_row_and_the_chunked_loss_candidate_extend_the_default(cuda, capability):
    rows = gpt_bench.ladder(cuda, capability)
    default = [s for name, s in rows if not name.startswith(" ")][-1]
    vocab = [s for name, s in rows if "GPT-2's vocabulary (50,304 instead of 16,384)" in name]
    chunked = [s for name, s in rows if name.startswith("  candidate: chunked loss")]
    assert vocab == [{**default, "vocab_size": 50304}] and chunked == [{**default, "loss": "chunked"}]
    assert not any("GPT-2's vocabulary" in name for name in rows_by_name(cuda, capability, vocab_size=50304))


@pytest.mark.parametrize("cuda, capability", [(False, (0, 0)), (True, (9, 0))])
def test_every_sdpa_backend_has_a_forced_row_and_compiles_come_last(cuda, capability):
    rows = gpt_bench.ladder(cuda, capability)
    forced = [s["sdpa_backend"] for _, s in rows if s["sdpa_backend"]]
    assert forced == ["flash", "efficient", "cudnn", "math"]
    order = gpt_bench.unmeasured_first(rows)
    assert sorted(order) == list(range(1, len(rows) + 1))
    # what the report's conclusions rest on is measured first: the naive row, the default, the default
    # without each acceleration; then the rungs between, the SDPA backends (cuDNN's among them), the candidates
    rungs = [name for name, _ in rows if not name.startswith(" ")]
    leave_one_out = [name for name, _ in rows if name.startswith("  default without")]
    names = [rows[i - 1][0] for i in order]
    compiled = [i for i, (_, s) in enumerate(rows, 1) if s["compile"] != "off"]
    first, second = names[:len(leave_one_out) + 2], names[len(leave_one_out) + 2:len(rows) - len(compiled)]
    assert first == [rungs[0], rungs[-1], *leave_one_out] and rungs[-1].endswith("(= gpt_train.py default)")
    assert len(leave_one_out) == len(rungs) - 2  # every acceleration but dropout (the own module has none)
    assert "  default without fused AdamW" in first and "  default, SDPA forced to its cudnn backend" in second
    assert "  default without bf16 autocast" in first or not cuda
    assert second[:len(rungs) - 2] == rungs[1:-1]
    assert not any("compile" in name for name in first + second)
    assert (order[-2:] == compiled and len(compiled) == 2) if cuda else not compiled


@pytest.mark.parametrize("cuda, capability", [(False, (0, 0)), (True, (9, 0))])
def test_each_row_is_judged_against_the_rung_before_or_the_default(cuda, capability):
    rows = gpt_bench.ladder(cuda, capability)
    rungs = len([name for name, _ in rows if not name.startswith(" ")])
    assert gpt_bench.reference(rows, 1) is None
    assert [gpt_bench.reference(rows, i) for i in range(2, rungs + 1)] == list(range(1, rungs))
    assert {gpt_bench.reference(rows, i) for i in range(rungs + 1, len(rows) + 1)} == {rungs}


@pytest.mark.slow
def test_an_unavailable_sdpa_backend_is_a_row_that_says_so():
    """On a CPU the cuDNN kernel does not exist: that row says so, the others measure."""
    rows = gpt_bench.ladder(False, (0, 0))
    pick = [i for i, (_, s) in enumerate(rows, 1) if s.get("sdpa_backend") in ("math", "cudnn")]
    out = gpt_bench.main(["--only", ",".join(map(str, pick)), "--repeats", "1", "--max-pairs", "1", "--steps", "1",
                          "--warmup", "0", "--seq-len", "16", "--micro-batch", "1", "--vocab-size", "64",
                          "--preset", "tiny"])
    default, cudnn, math_row = out["rungs"]  # the default: their reference
    assert cudnn == {"name": rows[pick[0] - 1][0], "error": cudnn["error"]}
    assert cudnn["error"].startswith("SDPA's cudnn backend not available here")
    assert math_row["built"]["attention_kernel"] == "math (forced)" and math_row["tokens_per_second"] > 0
    assert math_row["verdict"]["against"] == default["name"] and math_row["verdict"]["pairs"] == 1


def test_the_row_without_the_own_module_is_plain_transformers():
    rows = [name for name, s in gpt_bench.ladder(True, (9, 0)) if "without own GPT module" in name]
    assert rows == ["  default without own GPT module from the same GPT2Config"]


@pytest.mark.parametrize("capability, tf32", [((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_tf32_is_decided_on_only_where_the_gpu_has_tf32_tensor_cores(capability, tf32):
    """A 2080 Ti (sm75) has none: its start-up line says tf32 off, its ladder has no TF32 rung or row."""
    import training.device
    decisions = training.device.decisions_for("cuda", capability, "auto", "auto", "NVIDIA GeForce RTX 2080 Ti")
    assert decisions.tf32 is tf32 and gpt_bench.default_step(True, capability)[0].tf32 is tf32
    assert any("TF32" in name for name, _ in gpt_bench.ladder(True, capability)) is tf32
    assert not training.device.decisions_for("cpu", (0, 0), "auto", "auto").tf32


@pytest.mark.parametrize("flags, message", [(["--only", "99"], "--only takes row numbers 1.."),
                                            (["--only", "x"], "--only takes row numbers"),
                                            (["--steps", "0"], "must be > 0")])
def test_bad_flags_are_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        gpt_bench.main(flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1


def test_list_prints_the_numbered_rows_and_measures_nothing(monkeypatch, capsys):
    """`--list`: the numbers `--only` takes, each beside its row's name, and no row measured."""
    monkeypatch.setattr(gpt_bench, "measure", lambda *a, **kw: pytest.fail("--list measured a row"))
    rows = gpt_bench.main(["--list", "--vocab-size", "50304"])
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"{i:2d} {name}" for i, (name, _) in enumerate(rows, 1)]
    assert rows == gpt_bench.ladder(False, (0, 0), vocab_size=50304) and printed[0].startswith(" 1 naive: ")
    assert "15   candidate: chunked loss, no full fp32 logits (--loss chunked)" in printed




def test_the_verdict_needs_nine_pairs_and_an_interval_outside_or_inside_the_noise_band():
    """Sign test at 99.5%: under 9 pairs no interval exists (undecided); from 9 the j-th smallest and largest."""
    assert gpt_bench.verdict([3.0] * 8, "ref")["word"] == "undecided"
    assert gpt_bench.verdict([3.0] * 9, "ref") == {"against": "ref", "ratio": 3.0, "low": 3.0, "high": 3.0,
                                                   "pairs": 9, "word": "faster"}
    assert gpt_bench.verdict([0.5, 0.6, 0.55, 0.5, 0.7, 0.9, 0.5, 0.6, 0.6], "ref")["word"] == "slower"
    assert gpt_bench.verdict([1.01, 0.99, 1.02, 0.98, 1.0, 1.03, 1, 1, 1], "ref")["word"] == "within noise"
    assert gpt_bench.verdict([1.01, 0.99, 1.02, 0.98, 1.0, 1.2, 1, 1, 1], "ref")["word"] == "undecided"  # 1.2
    more = gpt_bench.verdict([0.5, 1.1, 1.2, 1.3, 1.4, 1.5, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 9.0], "ref")  # 13: 2nd
    assert (more["low"], more["high"], more["ratio"], more["word"]) == (1.1, 2.0, 1.5, "faster")


class NoisyRow:
    """A row on a shared machine: tokens/s = speed x a slow drift x lognormal noise, 1 sample in 6 starved
    (it got half the CPUs: half the speed)."""

    def __init__(self, name, speed, rng, noise):
        self.record, self.speed, self.rng, self.noise, self.t = {"name": name, "repeats": []}, speed, rng, noise, 0

    def sample(self):
        self.t += 1
        starved = self.rng.random() < 1 / 6
        drift = 1 + 0.5 * (self.t % 40 < 20)  # the machine's load changes slowly: twice as busy half the time
        tps = self.speed * drift * self.rng.lognormvariate(0, self.noise) * (0.5 if starved else 1)
        return {"tokens_per_second": tps, "starved": starved}


@pytest.mark.parametrize("effect, noise, words", [(3.0, 0.3, {"faster"}), (0.4, 0.3, {"slower"}),
                                                  (1.0, 0.01, {"within noise"}), (1.3, 0.05, {"faster"}),
                                                  (1.0, 0.5, {"undecided"})])
def test_the_same_comparison_repeated_on_a_busy_machine_gives_the_same_verdict(effect, noise, words):
    """200 runs of one comparison, each with its own noise, drift and starved samples: one verdict for every run
    (x3 is never called noise, nor x1 a gain); a pair with a starved sample is measured again."""
    got = set()
    for seed in range(200):
        rng = random.Random(seed)
        row, ref = NoisyRow("row", 1000 * effect, rng, noise), NoisyRow("ref", 1000, rng, noise)
        verdict = gpt_bench.compare(row, ref, repeats=9, max_pairs=20)
        got.add(verdict["word"])
        assert 9 <= verdict["pairs"] == len(row.record["repeats"]) == len(ref.record["repeats"]) <= 20
        assert verdict["low"] <= verdict["ratio"] <= verdict["high"]
    assert got == words


def test_starved_pairs_are_measured_again_and_counted():
    rng = random.Random(0)
    row, ref = NoisyRow("row", 3000, rng, 0.1), NoisyRow("ref", 1000, rng, 0.1)
    gpt_bench.compare(row, ref, repeats=6, max_pairs=6)
    kept = row.record["repeats"] + ref.record["repeats"]
    assert row.record["pairs_measured_again"] > 0 and not any(s["starved"] for s in kept)


class FakeRow:
    """Row's interface without a model: tokens/s by the row's settings (GPT-2's vocabulary: half the default's)."""

    def __init__(self, record, args):
        if record["settings"].get("loss") == "chunked":
            raise RuntimeError("kernel failed\nsecond line")
        record.update(flops_per_token=1e6, vocab_size=record["settings"].get("vocab_size", args.vocab_size),
                      matmul_kind="fp32", first_step_seconds=0.1, peak_flops=None, loss=9.0)
        self.record, self.speed = record, 500.0 if "vocab_size" in record["settings"] else 1000.0
        self.run = types.SimpleNamespace(accelerator=types.SimpleNamespace(free_memory=lambda: None))
        self.step = lambda: 0.01

    def sample(self):
        fraction = 1e6 * self.speed / 4e8  # the matmul: 4e8 FLOP/s, slower than the row (a CPU's bf16, say)
        return {"tokens_per_second": self.speed, "fraction_of_matmul_rate": min(fraction, 1.0),
                "above_matmul": fraction > 1, "starved": False}


def test_a_failing_row_is_recorded_and_the_others_written_as_they_finish(tmp_path, monkeypatch, capsys):
    written = []
    monkeypatch.setattr(gpt_bench, "Row", FakeRow)
    monkeypatch.setattr(gpt_bench, "cpu_peak", lambda settings, args: 1.5 if "vocab_size" in settings else 1.0)
    monkeypatch.setattr(gpt_bench.common, "write", lambda args, out: written.append(json.loads(json.dumps(out))))
    rows = gpt_bench.ladder(False, (0, 0), vocab_size=16384)
    numbers = [i for i, (name, _) in enumerate(rows, 1) if "vocabulary" in name or "chunked" in name]
    gpt_bench.main(["--only", ",".join(map(str, numbers))])
    default, chunked, vocab = written[-1]["rungs"]  # the ladder's order; the default measured as their reference
    assert [len(w["rungs"]) for w in written] == [1, 3]  # after each row: the failed one, then the pair
    assert chunked == {"name": rows[numbers[0] - 1][0], "error": "RuntimeError: kernel failed"}
    assert vocab["verdict"] == {"against": default["name"], "ratio": 0.5, "low": 0.5, "high": 0.5, "pairs": 9,
                                "word": "slower"} and "verdict" not in default
    assert vocab["fraction_of_matmul_rate"] == 1.0 and vocab["above_matmul"]  # 125%: capped, and said so
    assert (vocab["peak_memory_gib"], default["peak_memory_gib"]) == (1.5, 1.0)
    assert "slower" in capsys.readouterr().out


def finished_run(folder, **metrics):
    folder.mkdir()
    (folder / "args.json").write_text(json.dumps({"preset": "tiny", "n_layer": 2, "n_head": 2, "n_embd": 32,
                                                  "seq_len": 32, "micro_batch": None}))
    (folder / "metrics.json").write_text(json.dumps({"preset": "tiny", "vocab_size": 512, "seq_len": 32,
                                                     "micro_batch": 4, **metrics}))
    return folder


def test_like_measures_the_runs_own_model(tmp_path):
    args, rows = gpt_bench.parse_args(["--like", str(finished_run(tmp_path / "run"))])
    assert (args.preset, args.vocab_size, args.seq_len, args.micro_batch) == ("tiny", 512, 32, 4)
    assert args.shape == {"n_layer": 2, "n_head": 2, "n_embd": 32}
    assert any("GPT-2's vocabulary (50,304 instead of 512)" in name for name, _ in rows)


@pytest.mark.parametrize("make", [lambda p: p, lambda p: (p.mkdir(), p)[1], lambda p: (finished_run(p),
                                  (p / "metrics.json").unlink(), p)[2]])
def test_like_a_folder_that_is_no_finished_run_is_one_line(tmp_path, make, capsys):
    with pytest.raises(SystemExit) as e:
        gpt_bench.main(["--like", str(make(tmp_path / "run")), "--list"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "is not a finished gpt_train.py run" in err and err.count("\n") == 1


def test_the_matmul_rate_is_a_plausible_flop_rate():
    rate = gpt_bench.matmul_rate("fp32", 64, 64, torch.device("cpu"))
    assert 1e6 < rate < 1e14


@pytest.mark.slow
def test_a_row_that_holds_more_memory_shows_more_in_its_own_process(tmp_path):
    """A fresh process per row: the row with GPT-2's vocabulary (its logits and embedding) peaks higher than the
    default at vocabulary 64, whatever ran before in this process."""
    args, rows = gpt_bench.parse_args(["--preset", "tiny", "--seq-len", "128", "--micro-batch", "16", "--vocab-size",
                                       "64", "--warmup", "1"])
    default, vocab = (s for name, s in rows if "(= gpt_train.py default)" in name or "GPT-2's vocabulary" in name)
    small, large = gpt_bench.cpu_peak(default, args), gpt_bench.cpu_peak(vocab, args)
    assert large > small + 0.3  # 50,304 logits x 16 x 128 tokens in fp32: 0.4 GiB, its gradient as much (a margin
    # far above what a busy machine adds to a process's peak: malloc's arenas grow with contention)


@pytest.mark.slow
def test_a_tiny_ladder_run_twice_beside_a_cpu_hog_gives_the_same_verdicts(tmp_path):
    """The default against GPT-2's vocabulary (at width 64 it costs several times the FLOPs), measured twice while
    another process takes a core: the same verdict both times."""
    rows = gpt_bench.ladder(False, (0, 0), vocab_size=64)
    vocab = [i for i, (name, _) in enumerate(rows, 1) if "GPT-2's vocabulary" in name]
    flags = ["--preset", "tiny", "--seq-len", "32", "--micro-batch", "4", "--vocab-size", "64", "--warmup", "1",
             "--steps", "1", "--only", str(vocab[0])]
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        runs = [gpt_bench.main(flags) for _ in range(2)]
    finally:
        hog.kill()
        hog.wait()
    words = [{r["name"]: r["verdict"]["word"] for r in run["rungs"] if "verdict" in r} for run in runs]
    assert words[0] == words[1] and words[0][rows[vocab[0] - 1][0]] == "slower"
