"""A finished run's final/ as transformers opens it (training/final.py's write_final, which
training/final.save_final calls): AutoModelForCausalLM and AutoTokenizer offline, the project's
loss, generation that never picks the vocabulary's padding rows, and pipeline("text-generation")."""
import json
import os
import shutil
import subprocess
import sys
from functools import partial

import pytest
import torch

import gpt_train
from conftest import REPO, generated_docs, tiny_args
from training import final, sample
from training.final import load_run

VOCAB = 500  # not a multiple of 64: the model has 12 padding rows (512)


@pytest.fixture(scope="module")
def padded_run(corpus, tmp_path_factory):
    """A tiny finished run whose tokenizer leaves padding rows in the model."""
    import tokenizer_train
    root = tmp_path_factory.mktemp("padded")
    tokenizer_train.save_atomic(tokenizer_train.train_bpe(generated_docs(300), vocab_size=VOCAB), root / "tok.json")
    run = root / "run"
    gpt_train.main(tiny_args(corpus, run, "--tokenizer", str(root / "tok.json"), "--tokens", str(30 * 8 * 32),
                             "--sample-tokens", "0"))
    return run


def open_in_transformers(final):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return (AutoModelForCausalLM.from_pretrained(final, local_files_only=True).eval(),
            AutoTokenizer.from_pretrained(final, local_files_only=True))


def test_final_is_one_copy_of_the_weights_beside_the_run_tokenizer(padded_run):
    final = padded_run / "final"
    assert sorted(p.name for p in final.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                        "tokenizer.json", "tokenizer_config.json"]
    ours, tok = load_run(padded_run, None, torch.device("cpu"))
    assert tok.vocab_size == VOCAB and ours.cfg.vocab_size == 512
    weight_bytes = 4 * sum(p.numel() for p in ours.parameters())  # the tied wte/lm_head counted once
    assert weight_bytes < (final / "model.safetensors").stat().st_size < weight_bytes + 16_384  # + the header
    umask = os.umask(0o022)
    os.umask(umask)
    assert (final / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask  # the group may read it too
    config = json.loads((final / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["tokenizer_sha256"] == tok.sha256
    assert config["eos_token_id"] == config["bos_token_id"] == tok.eot


def test_transformers_opens_final_offline_and_computes_the_projects_loss(padded_run):
    model, hf_tok = open_in_transformers(padded_run / "final")
    ours, tok = load_run(padded_run, None, torch.device("cpu"))
    assert type(model).__name__ == "GPT2LMHeadModel" and hf_tok.eos_token_id == tok.eot
    docs = generated_docs(3, seed=11)
    assert [hf_tok(d)["input_ids"] for d in docs] == [e.ids for e in tok.tokenizer.encode_batch(docs)]
    ids = torch.tensor([hf_tok(d)["input_ids"][:32] for d in docs])  # (3, 32): n_positions
    with torch.no_grad():
        theirs = model(ids, labels=ids).loss  # transformers shifts the labels itself
        mine = ours(ids[:, :-1], ids[:, 1:])
    torch.testing.assert_close(theirs, mine, rtol=1e-5, atol=1e-5)
    prompt = ids[:1, :8]
    with torch.no_grad():  # greedy: the same next tokens as training.sample's
        hf = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=12)
    greedy = partial(final.pick, temperature=0.0, top_k=0, generator=None)
    ours_ids = torch.cat(list(final.token_stream(ours, prompt, 12, greedy, VOCAB)), dim=1)
    assert hf[0, 8:].tolist() == ours_ids[0, :hf.size(1) - 8].tolist()


def near_uniform_samples(final):
    """1,200 tokens sampled at temperature 1000 (every row about equally likely): a padding row
    (12 of 512) would come up about 28 times."""
    model, _ = open_in_transformers(final)
    torch.manual_seed(0)
    start = torch.full((40, 1), model.generation_config.bos_token_id or 0)
    with torch.no_grad():
        return model.generate(start, attention_mask=torch.ones_like(start), do_sample=True, temperature=1000.0,
                              top_k=0, max_new_tokens=30, eos_token_id=None, pad_token_id=0)[:, 1:]


def test_transformers_generation_never_picks_a_padding_row(padded_run, tmp_path):
    assert json.loads((padded_run / "final" / "generation_config.json").read_text())["suppress_tokens"] == \
        list(range(VOCAB, 512))
    assert near_uniform_samples(padded_run / "final").max() < VOCAB
    bare = shutil.copytree(padded_run / "final", tmp_path / "bare")
    (bare / "generation_config.json").unlink()
    assert near_uniform_samples(bare).max() >= VOCAB  # what the generation config prevents


@pytest.mark.slow  # a fresh process importing transformers' pipelines: over 10 s here
def test_a_text_generation_pipeline_opens_final_offline(padded_run):
    code = ("import sys; from transformers import pipeline; "
            "out = pipeline('text-generation', model=sys.argv[1])('Kalo mi', max_new_tokens=12, do_sample=False); "
            "print(out[0]['generated_text'])")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code, str(padded_run / "final")], capture_output=True, text=True,
                            cwd=REPO, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout.strip().splitlines()[-1]
    expected = sample.main([str(padded_run), "--prompt", "Kalo mi", "--tokens", "12", "--temperature", "0"])
    assert text.startswith("Kalo mi") and len(text) > len("Kalo mi") + 5
    assert text == "Kalo mi" + expected[:len(text) - len("Kalo mi")]  # greedy: training.sample's text
