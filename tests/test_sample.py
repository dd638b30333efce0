"""What the model writes (training/sample.py: TensorBoard text, the metrics' samples, the command line)
and the chunked loss (training/lm_loss.py: `gpt_train.py --loss chunked`)."""
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import gpt_train
from conftest import REPO, tiny_args
from training import lm_loss, sample


# ------------------------------------------------------------------ the chunked loss

def plain_loss(hidden, weight, targets):
    logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def loss_and_grads(loss_fn, hidden, weight, targets):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = loss_fn(h, w, targets)
    (loss * 3.0).backward()  # a scaled loss, as gradient accumulation and GradScaler scale it
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("chunk", [7, 64, 1000])  # uneven last chunk, several whole chunks, one chunk
def test_chunked_loss_equals_the_plain_loss_and_its_gradients(chunk):
    torch.manual_seed(0)
    hidden, weight = torch.randn(4, 16, 32) * 2, torch.randn(96, 32) * 0.5
    targets = torch.randint(0, 96, (4, 16))
    expected = loss_and_grads(plain_loss, hidden, weight, targets)
    got = loss_and_grads(lambda h, w, t: lm_loss.chunked_cross_entropy(h, w, t, chunk), hidden, weight, targets)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # evaluation: the loss alone, the same
        torch.testing.assert_close(lm_loss.chunked_cross_entropy(hidden, weight, targets, chunk), expected[0])


def test_chunked_loss_under_bf16_autocast_is_close_to_the_plain_one():
    torch.manual_seed(0)
    hidden, weight = torch.randn(2, 64, 32), torch.randn(128, 32) * 0.3
    targets = torch.randint(0, 128, (2, 64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = loss_and_grads(plain_loss, hidden, weight, targets)
        got = loss_and_grads(lambda h, w, t: lm_loss.chunked_cross_entropy(h, w, t, 40), hidden, weight, targets)
    assert got[0].dtype == torch.float32 and got[2].dtype == torch.float32
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-3)


def test_the_chunked_loss_traces_under_torch_compile():
    """gpt_train --compile whole traces the loss too (regional leaves it eager): the same loss and gradients."""
    torch.manual_seed(0)
    hidden, weight = torch.randn(2, 8, 16), torch.randn(64, 16)
    targets = torch.randint(0, 64, (2, 8))
    compiled = torch.compile(lambda h, w, t: lm_loss.chunked_cross_entropy(h, w, t, 5), backend="aot_eager",
                             fullgraph=True)
    expected = loss_and_grads(plain_loss, hidden, weight, targets)
    for g, e in zip(loss_and_grads(compiled, hidden, weight, targets), expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_a_chunked_loss_run_follows_the_plain_one(corpus, tmp_path):
    common = ["--tokens", str(10 * 8 * 32), "--sample-tokens", "0"]
    plain = gpt_train.main(tiny_args(corpus, tmp_path / "plain", *common))
    chunked = gpt_train.main(tiny_args(corpus, tmp_path / "chunked", *common, "--loss", "chunked"))
    for (s1, l1), (s2, l2) in zip(plain["loss_curve"], chunked["loss_curve"]):
        assert s1 == s2 and l2 == pytest.approx(l1, rel=1e-4)
    assert chunked["final_val_loss"] == pytest.approx(plain["final_val_loss"], rel=1e-4)


# ------------------------------------------------------------------ samples during training

def test_fixed_prompts_start_after_an_end_of_text_and_have_one_length():
    blocks = [{"input_ids": [5, 6, 0, 7, 8, 9, 10, 11, 12]}, {"input_ids": [1, 2, 3, 4, 5, 6, 7, 0, 9]}]
    assert sample.fixed_prompts(blocks, eot=0, length=4) == [[7, 8, 9, 10], [1, 2, 3, 4]]  # 2nd: no room after eot


def test_greedy_generation_takes_the_most_likely_token_and_skips_padding_rows():
    class Table(torch.nn.Module):  # the next token's logits: a fixed table indexed by the last token
        cfg = type("cfg", (), {"n_positions": 4})

        def forward(self, idx):
            logits = torch.full((idx.size(0), 8), -1.0)
            logits[:, 7] = 9.0  # a padding row (vocabulary 6 of the model's 8): never chosen
            logits[torch.arange(idx.size(0)), (idx[:, -1] + 1) % 6] = 1.0
            return logits
    out = sample.generate(Table(), torch.tensor([[0], [4]]), 3, vocab_size=6)
    assert out.tolist() == [[1, 2, 3], [5, 0, 1]]


def text_events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0}).Reload()
    return {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"] if tag.startswith("samples/")}


def test_a_tiny_run_writes_samples_to_tensorboard_and_its_metrics(corpus, tmp_path):
    run = tmp_path / "run"
    metrics = gpt_train.main(tiny_args(corpus, run, "--tokens", str(8 * 8 * 32), "--eval-every", "4",
                                       "--sample-tokens", "12"))
    texts = text_events(run)
    assert set(texts) == {"samples/greedy/text_summary", "samples/sampled/text_summary"}
    for tag, events in texts.items():
        assert [step for step, _ in events] == [4, 8]  # each evaluation and the end (step 8: the end's kept)
        assert all("**→**" in text for _, text in events)
    samples = metrics["samples"]
    assert samples["step"] == 8 and samples["val_loss"] == metrics["final_val_loss"] and samples["new_tokens"] == 12
    assert len(samples["continuations"]) == 2
    for c in samples["continuations"]:
        assert c["prompt"] and c["greedy"] and c["sampled"] and c["greedy"] in texts["samples/greedy/text_summary"][-1][1]
    assert json.loads((run / "metrics.json").read_text())["samples"] == samples


# ------------------------------------------------------------------ sampling a finished run

def sample_cli(*args):
    return subprocess.run([sys.executable, "-m", "training.sample", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory):
    run = tmp_path_factory.mktemp("finished") / "run"
    gpt_train.main(tiny_args(corpus, run, "--tokens", str(30 * 8 * 32), "--sample-tokens", "0"))
    return run


def test_sampling_a_finished_run_continues_the_prompt_deterministically(finished_run):
    first = sample_cli(finished_run, "--prompt", "Kalo mi", "--tokens", "20", "--seed", "3")
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.startswith("Kalo mi") and len(first.stdout.strip()) > len("Kalo mi") + 10
    again = sample_cli(finished_run, "--prompt", "Kalo mi", "--tokens", "20", "--seed", "3")
    assert again.stdout == first.stdout  # the same seed, the same text
    other = sample_cli(finished_run, "--prompt", "Kalo mi", "--tokens", "20", "--seed", "4")
    greedy = [sample_cli(finished_run, "--prompt", "Kalo mi", "--tokens", "20", "--temperature", "0", "--seed", s)
              for s in (1, 2)]
    assert other.stdout != first.stdout and greedy[0].stdout == greedy[1].stdout


def test_sampling_reads_the_final_weights_or_else_the_newest_checkpoint(finished_run, tmp_path):
    assert sample.weights_file(finished_run).is_file()
    model, tok = sample.load_run(finished_run, None, torch.device("cpu"))
    assert tok.padded_vocab_size == model.cfg.vocab_size == 512


@pytest.mark.parametrize("case, message", [
    ("missing", "no such run directory"),
    ("no args", "no readable args.json"),
    ("no weights", "no weights"),
    ("tokenizer moved", "no such file or folder"),
])
def test_sampling_errors_are_one_line(finished_run, tmp_path, case, message):
    import shutil
    run = tmp_path / "run"
    if case == "tokenizer moved":
        shutil.copytree(finished_run, run)
        run_args = json.loads((run / "args.json").read_text())
        (run / "args.json").write_text(json.dumps({**run_args, "tokenizer": str(tmp_path / "gone.json")}))
    elif case != "missing":
        run.mkdir()
    if case == "no weights":
        (run / "args.json").write_text((finished_run / "args.json").read_text())
    result = sample_cli(run, "--prompt", "x")
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    assert result.stderr.startswith("error: ") and message in result.stderr
