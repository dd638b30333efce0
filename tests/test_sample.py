"""What the model writes (training/sample.py: TensorBoard text, the metrics' samples, the command line)
and the chunked loss (training/model.py's chunked_cross_entropy: `gpt_train.py --loss chunked`)."""
import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import gpt_train
from conftest import REPO, tiny_args
from training import final, sample
from training.final import load_run
from training.model import chunked_cross_entropy

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
    got = loss_and_grads(lambda h, w, t: chunked_cross_entropy(h, w, t, chunk), hidden, weight, targets)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # evaluation: the loss alone, the same
        torch.testing.assert_close(chunked_cross_entropy(hidden, weight, targets, chunk), expected[0])


def test_chunked_loss_under_bf16_autocast_is_close_to_the_plain_one():
    torch.manual_seed(0)
    hidden, weight = torch.randn(2, 64, 32), torch.randn(128, 32) * 0.3
    targets = torch.randint(0, 128, (2, 64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = loss_and_grads(plain_loss, hidden, weight, targets)
        got = loss_and_grads(lambda h, w, t: chunked_cross_entropy(h, w, t, 40), hidden, weight, targets)
    assert got[0].dtype == torch.float32 and got[2].dtype == torch.float32
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-3)


def test_the_chunked_loss_traces_under_torch_compile():
    """gpt_train --compile whole traces the loss too (regional leaves it eager): the same loss and gradients."""
    torch.manual_seed(0)
    hidden, weight = torch.randn(2, 8, 16), torch.randn(64, 16)
    targets = torch.randint(0, 64, (2, 8))
    compiled = torch.compile(lambda h, w, t: chunked_cross_entropy(h, w, t, 5), backend="aot_eager",
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
    blocks = torch.tensor([[5, 6, 0, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 5, 6, 7, 0, 9]], dtype=torch.int32)
    assert final.fixed_prompts(blocks, eot=0, length=4) == [[7, 8, 9, 10], [1, 2, 3, 4]]  # 2nd: no room after eot


def generate(model, idx, new_tokens, temperature=0.0, top_k=0, generator=None, vocab_size=None):
    """(B, T) prompt ids -> (B, new_tokens) continuation ids, as training.sample's main() chooses them."""
    choose = partial(final.pick, temperature=temperature, top_k=top_k, generator=generator)
    return torch.cat(list(final.token_stream(model, idx, new_tokens, choose, vocab_size)), dim=1)


def test_greedy_generation_takes_the_most_likely_token_and_skips_padding_rows():
    class Table(torch.nn.Module):  # the next token's logits: a fixed table indexed by the last token
        cfg = type("cfg", (), {"n_positions": 4, "n_layer": 1})

        def forward(self, idx, cache=None):  # no cache kept: every call sees the whole text
            logits = torch.full((idx.size(0), 8), -1.0)
            logits[:, 7] = 9.0  # a padding row (vocabulary 6 of the model's 8): never chosen
            logits[torch.arange(idx.size(0)), (idx[:, -1] + 1) % 6] = 1.0
            return logits
    out = generate(Table(), torch.tensor([[0], [4]]), 3, vocab_size=6)
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
        assert [step for step, _ in events] == [8]  # once, at the end (not at the evaluation of step 4)
        assert all("**→**" in text for _, text in events)
    samples = metrics["samples"]
    assert samples["new_tokens"] == 12  # after the last step (metrics' steps), beside its final_val_loss
    assert len(samples["continuations"]) == 2
    for c in samples["continuations"]:
        assert c["prompt"] and c["greedy"] and c["sampled"]
        assert c["greedy"] in texts["samples/greedy/text_summary"][-1][1]
    assert json.loads((run / "metrics.json").read_text())["samples"] == samples


# ------------------------------------------------------------------ sampling a finished run

def sample_cli(*args, **kw):
    argv = [a if isinstance(a, bytes) else str(a) for a in args]  # bytes: as a shell passes them
    return subprocess.run([sys.executable, "-m", "training.sample", *argv], capture_output=True, text=True, cwd=REPO,
                          timeout=300, **kw)


def sample_here(capsys, *args):
    """sample.main in this process: (exit status, stdout, stderr) as a shell would see them."""
    try:
        sample.main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return (1, out, err + code + "\n") if isinstance(code, str) else (code, out, err)


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory):
    run = tmp_path_factory.mktemp("finished") / "run"
    gpt_train.main(tiny_args(corpus, run, "--tokens", str(30 * 8 * 32), "--sample-tokens", "0"))
    return run


@pytest.fixture(scope="module")
def other_tokenizer(corpus, tmp_path_factory):
    """A tokenizer of the run's size (512) learned from other documents: another vocabulary."""
    import tokenizer_train
    from conftest import generated_docs
    path = tmp_path_factory.mktemp("other") / "other.json"
    tokenizer_train.save_atomic(tokenizer_train.train_bpe(generated_docs(300, seed=7), vocab_size=512), path)
    return path


@pytest.fixture
def run_copy(finished_run, tmp_path):
    import shutil
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


@pytest.mark.slow
def test_sampling_a_finished_run_continues_the_prompt_deterministically(finished_run, capsys):
    first = sample_cli(finished_run, "--prompt", "Kalo mi", "--tokens", "20", "--seed", "3")  # as a user runs it
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.startswith("Kalo mi") and len(first.stdout.strip()) > len("Kalo mi") + 10
    again = sample_here(capsys, finished_run, "--prompt", "Kalo mi", "--tokens", "20", "--seed", "3")
    assert again[1] == first.stdout  # the same seed, the same text
    other = sample_here(capsys, finished_run, "--prompt", "Kalo mi", "--tokens", "20", "--seed", "4")
    greedy = [sample_here(capsys, finished_run, "--prompt", "Kalo mi", "--tokens", "20", "--temperature", "0",
                          "--seed", s) for s in (1, 2)]
    assert other[1] != first.stdout and greedy[0][1] == greedy[1][1]


def test_the_printed_text_is_the_prompt_and_its_whole_decoded_continuation(finished_run, capsys):
    code, out, _ = sample_here(capsys, finished_run, "--prompt", "Kalo mi", "--tokens", "30", "--seed", "3")
    model, tok = load_run(finished_run, None, torch.device("cpu"))
    assert model.cfg.vocab_size == tok.padded_vocab_size == 512
    ids = torch.tensor([tok.tokenizer.encode("Kalo mi", add_special_tokens=False).ids])
    whole = generate(model, ids, 30, final.TEMPERATURE, final.TOP_K, torch.Generator().manual_seed(3),
                     tok.vocab_size)
    assert code == 0 and out == "Kalo mi" + tok.tokenizer.decode(whole[0].tolist()) + "\n"


def test_streamed_pieces_never_split_a_character(corpus):
    from data.tokenizer import open_tokenizer
    tok = open_tokenizer(corpus / "tok.json").tokenizer
    text = "kalo é 😀 mi ∑ zu"
    ids = tok.encode(text).ids
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # some characters span several tokens
    pieces = list(sample.stream_text(tok.decode, ids))
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces) and len(pieces) > 5


@pytest.mark.slow  # a process started and stopped: over 10 s beside other work
def test_ctrl_c_keeps_what_was_printed_and_ends_without_a_traceback(finished_run, tmp_path):
    import signal

    from conftest import wait_for
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:  # 100,000 tokens: minutes; the text must appear long before the end
        proc = subprocess.Popen([sys.executable, "-m", "training.sample", str(finished_run), "--prompt", "Kalo mi",
                                 "--tokens", "100000"], stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=REPO)
        streamed = wait_for(lambda: len(out.read_text()) > 40, timeout=90, proc=proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert streamed, err[-2000:]
    assert proc.returncode == 130 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-2000:]
    text = out.read_text()
    assert text.startswith("Kalo mi") and len(text) > 40


def test_a_tiny_temperature_samples_greedily(finished_run, capsys):
    tiny = sample_here(capsys, finished_run, "--prompt", "Kalo", "--temperature", "1e-40")
    greedy = sample_here(capsys, finished_run, "--prompt", "Kalo", "--temperature", "0")
    assert tiny[0] == 0 and tiny[1] == greedy[1] and len(tiny[1]) > len("Kalo\n")


def test_a_finished_run_needs_nothing_but_final(run_copy, finished_run, capsys):
    """final/ holds the shape and the tokenizer: an edited args.json changes nothing."""
    run_args = json.loads((run_copy / "args.json").read_text())
    (run_copy / "args.json").write_text(json.dumps({**run_args, "n_layer": 7, "n_embd": "x", "tokenizer": "/gone"}))
    edited = sample_here(capsys, run_copy, "--prompt", "Kalo mi", "--seed", "3")
    assert edited[0] == 0 and edited[1] == sample_here(capsys, finished_run, "--prompt", "Kalo mi", "--seed", "3")[1]


def test_an_unfinished_run_samples_from_its_newest_checkpoint_with_its_tokenizer(corpus, tmp_path, capsys,
                                                                               other_tokenizer):
    import shutil
    run = tmp_path / "run"
    gpt_train.main(tiny_args(corpus, run, "--tokens", str(10 * 8 * 32), "--sample-tokens", "0", "--keep-checkpoints"))
    capsys.readouterr()  # the run's own lines
    from_final = sample_here(capsys, run, "--prompt", "Kalo mi", "--seed", "3")
    shutil.rmtree(run / "final")  # what an unfinished run has: checkpoints only
    assert sample_here(capsys, run, "--prompt", "Kalo mi", "--seed", "3")[:2] == from_final[:2]
    code, _, err = sample_here(capsys, run, "--prompt", "x", "--tokenizer", other_tokenizer)
    assert code == 1 and "is not the one the run trained with" in err and len(err.splitlines()) == 1


def rewrite_weights(final, change):
    from safetensors.torch import load_file, save_file
    tensors = load_file(final / "model.safetensors")
    change(tensors)
    save_file(tensors, final / "model.safetensors", metadata={"format": "pt"})


def edit_config(final, **changes):
    (final / "config.json").write_text(json.dumps({**json.loads((final / "config.json").read_text()), **changes}))


DAMAGE = {  # what a damaged, edited or foreign final/ can hold
    "weights truncated": lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:5000]),
    "weights garbage": lambda f: (f / "model.safetensors").write_bytes(bytes(range(256)) * 40),
    "weights of another shape": lambda f: rewrite_weights(
        f, lambda t: t.update({"transformer.wpe.weight": t["transformer.wpe.weight"][:16].clone()})),
    "NaN weights": lambda f: rewrite_weights(f, lambda t: t["transformer.h.1.mlp.c_fc.weight"].view(-1)[3:5].fill_(
        float("nan"))),
    "config with more layers": lambda f: edit_config(f, n_layer=3),
    "config with other heads": lambda f: edit_config(f, n_head=4),  # a shape the weights cannot reveal
    "config of an impossible shape": lambda f: edit_config(f, n_head=5),
    "config not JSON": lambda f: (f / "config.json").write_text("{"),
    "config a list": lambda f: (f / "config.json").write_text("[1, 2]"),
    "config a FIFO": lambda f: ((f / "config.json").unlink(), os.mkfifo(f / "config.json")),  # was read for ever
    "model.pt, not model.safetensors": lambda f: (f / "model.safetensors").rename(f / "model.pt"),  # not read
}


@pytest.mark.parametrize("case, message", [
    ("weights truncated", "is damaged or not a weights file"),
    ("weights garbage", "is damaged or not a weights file"),
    ("weights of another shape", "does not fit its config (wpe.weight"),
    ("NaN weights", "holds NaN"),
    ("config with more layers", "config.json was changed after the run wrote it"),
    ("config with other heads", "config.json was changed after the run wrote it"),
    ("config of an impossible shape", "not a GPT-2 shape"),
    ("config not JSON", "not a readable GPT-2 config"),
    ("config a list", "not a readable GPT-2 config"),
    ("config a FIFO", "is not a plain file"),
    ("model.pt, not model.safetensors", "no weights (neither final/ nor a complete checkpoint)"),
])
def test_a_damaged_final_folder_is_one_line(run_copy, capsys, case, message):
    DAMAGE[case](run_copy / "final")
    code, out, err = sample_here(capsys, run_copy, "--prompt", "Kalo")
    assert code == 1 and out == "" and len(err.splitlines()) == 1, err[-2000:]
    assert err.startswith("error: ") and message in err and "weights_only" not in err


def test_final_keeps_its_own_tokenizer_and_refuses_another(run_copy, capsys, other_tokenizer):
    from data.tokenizer import open_tokenizer
    ours, other = open_tokenizer(run_copy / "final"), open_tokenizer(other_tokenizer)
    assert ours.vocab_size == other.vocab_size and ours.sha256 != other.sha256  # only the hash tells them apart
    code, _, err = sample_here(capsys, run_copy, "--prompt", "Kalo", "--tokenizer", other_tokenizer)
    assert code == 1 and "is not the run's" in err and len(err.splitlines()) == 1
    assert other.sha256[:16] in err and ours.sha256[:16] in err  # both named
    (run_copy / "final" / "tokenizer.json").write_text(other.tokenizer.to_str())  # swapped inside final/
    code, _, err = sample_here(capsys, run_copy, "--prompt", "Kalo")
    assert code == 1 and "is not the tokenizer the model learned" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("spec, message", [
    ("/no/such/tok.json", "no such file or folder"),
    ("no such name!", "not a hub name"),
    ("runs/gone/tokenizer.json", "no such file or folder"),
])
def test_a_mistyped_tokenizer_is_one_line(finished_run, capsys, spec, message):
    code, out, err = sample_here(capsys, finished_run, "--tokenizer", spec)
    assert code == 1 and out == "" and len(err.splitlines()) == 1 and message in err, err[-2000:]


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "nan"], "--temperature: expected a finite number"),
    (["--temperature", "inf"], "--temperature: expected a finite number"),
    (["--temperature", "-0.5"], "--temperature: must be >= 0"),
    (["--tokens", "100001"], "--tokens: must be in [1, 100000]"),
    (["--tokens", "0"], "--tokens: must be in [1, 100000]"),
    (["--seed", "-1"], "--seed: must be in [0, 18446744073709551616)"),
    (["--device", "tpu"], "--device: not a device name: 'tpu'"),
    (["--device", "cuda:99"], "--device: cuda:99 not available here"),
    (["--prompt", "caf\udce9"], "--prompt: not UTF-8 text"),  # what Python makes of the byte 0xe9 in argv
])
def test_unusable_flags_are_one_line_before_any_work(finished_run, capsys, flags, message):
    code, out, err = sample_here(capsys, finished_run, *flags)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and message in err, err[-2000:]


@pytest.mark.parametrize("case, message", [
    ("missing", "no such run directory"),
    ("no weights", "no weights"),
    ("non-UTF-8 prompt", "--prompt: not UTF-8 text"),
    ("no such device", "--device: not a device name: 'tpu'"),
])
@pytest.mark.slow
def test_sampling_errors_are_one_line(finished_run, tmp_path, case, message):
    run, extra = tmp_path / "run", []
    if case == "no weights":
        run.mkdir()
        (run / "args.json").write_text((finished_run / "args.json").read_text())
    elif case != "missing":
        run = finished_run
        extra = ["--prompt", b"caf\xe9"] if case == "non-UTF-8 prompt" else ["--device", "tpu"]
    result = sample_cli(run, *extra)
    assert result.returncode in (1, 2) and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr
