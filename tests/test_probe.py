"""training/budget.py's micro-batch probe (`--micro-batch auto` on a GPU), on a CPU: what its remembered
answer is keyed on, how it backs off from a failed allocation, and that a failed try's memory is free
before the next try. (Its search order and damaged caches: tests/test_training.py.)"""
import weakref
from dataclasses import asdict

import pytest
import torch

from training import budget, step
from training.model import GPT, GPTConfig


@pytest.fixture
def probe(monkeypatch, tmp_path):
    """probe_micro_batch on a CPU (a GPU's name, no cache to empty), counting the tries it makes."""
    monkeypatch.setattr(budget, "CACHE_HOME", tmp_path / "lab5")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    cfg = GPTConfig(vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    tries = []
    real = budget.find_micro_batch
    monkeypatch.setattr(budget, "find_micro_batch", lambda step, share: tries.append(share) or real(step, share))

    def run(loss="plain", world=1, **shape):
        accelerations = step.Accelerations(loss=loss)
        model = step.change_model(GPT(GPTConfig(**{**asdict(cfg), **shape})), accelerations)
        return budget.probe_micro_batch(model, accelerations, "cpu", share=4, world=world)
    return run, tries


def test_a_remembered_micro_batch_is_kept_per_loss_process_count_and_model_config(probe):
    """A chunked-loss probe fits more than the plain loss can train with, a 1-process probe more than
    DDP's buckets leave, a model with another config (here the initialisation only) may fit another count:
    none of these answers is reused by another run."""
    run, tries = probe
    assert run("chunked") == (4, "probed")
    assert run("plain") == (4, "probed") and run("plain", world=2) == (4, "probed")
    assert run("plain", initializer_range=0.01) == (4, "probed")
    assert [run("chunked"), run("plain"), run("plain", world=2)] == [(4, "remembered")] * 3
    assert len(tries) == 4


def test_a_cublas_allocation_failure_backs_off_like_an_out_of_memory_and_other_errors_stay():
    def try_step(m):
        if m > 2:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    assert budget.find_micro_batch(try_step, share=8) == 2
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_EXECUTION_FAILED"):
        budget.find_micro_batch(lambda m: (_ for _ in ()).throw(RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")), 4)


def test_a_failed_trys_tensors_are_gone_before_the_memory_is_freed(monkeypatch):
    """The cache is emptied after the except block: inside it, the traceback still held the failed try's
    tensors, so the memory the next try needs stayed taken."""
    class Activations:  # what a failed forward leaves in its frame
        pass
    alive = []

    def try_step(m):
        activations = Activations()
        alive.append(weakref.ref(activations))
        if m > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake)")
    freed = []
    monkeypatch.setattr(budget.gc, "collect", lambda: freed.append(alive[-1]() is None))
    assert budget.find_micro_batch(try_step, share=4) == 1
    assert freed == [True, True]
