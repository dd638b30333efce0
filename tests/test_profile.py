"""benchmarks/step_profile.py: one training step under torch.profiler, its time grouped by what the hardware did;
`gpt_bench.py --profile` and the ladder's naive and default rows carry it."""
import sys

import pytest
import torch

from conftest import REPO
from training import metrics

sys.path.insert(0, str(REPO / "benchmarks"))
import gpt_bench
import step_profile


@pytest.mark.parametrize("name, group", [
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::bmm", "attention"), ("BmmBackward0", "attention"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"), ("aten::_softmax", "attention"),
    ("aten::cross_entropy_loss", "loss"), ("aten::_log_softmax_backward_data", "loss"), ("aten::nll_loss_nd", "loss"),
    ("autograd::engine::evaluate_function: LogSoftmaxBackward0", "loss"), ("NllLossBackward0", "loss"),
    ("aten::native_layer_norm", "elementwise"), ("aten::gelu", "elementwise"), ("aten::add_", "elementwise"),
])
def test_an_operator_goes_to_its_group_by_name(name, group):
    assert step_profile.group_of(name) == group


def test_a_profiled_step_splits_its_wall_time_into_the_groups():
    """training/step.py's scopes (training.metrics.scope) mark the data and optimizer parts under any profiler."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))

    def step():
        with metrics.scope("data"):
            batch = x.clone()
        loss = torch.nn.functional.cross_entropy(model(batch), y)
        loss.backward()
        with metrics.scope("optimizer"):
            optimizer.step()
            optimizer.zero_grad()
        return loss
    step()  # warm-up
    loss, got = step_profile.profiled(step, torch.device("cpu"))
    groups = got["groups"]
    assert set(groups) == set(step_profile.GROUPS) and loss.item() > 0
    assert sum(groups.values()) == pytest.approx(got["step_seconds"], rel=1e-3, abs=1e-5)  # groups rounded to 1 µs
    assert groups["matmul"] > 0 and groups["optimizer"] > 0 and groups["loss"] > 0 and groups["data"] > 0
    assert groups["attention"] == 0
    assert metrics.scope("data").__class__.__name__ == "nullcontext"  # free outside a profile


@pytest.mark.slow
def test_gpt_bench_profile_records_one_steady_step_of_the_default_row(tmp_path):
    out = gpt_bench.main(["--profile", "--preset", "tiny", "--seq-len", "16", "--micro-batch", "2", "--vocab-size",
                          "64", "--repeats", "1", "--steps", "1", "--metrics-out", str(tmp_path / "p.json")])
    (row,) = out["rungs"]
    got = row["profile"]
    assert row["name"].endswith("(= gpt_train.py default)") and out["rows_planned"] == 1
    assert sum(got["groups"].values()) == pytest.approx(got["step_seconds"], rel=1e-3, abs=1e-5)
    assert got["groups"]["matmul"] > 0 and got["groups"]["attention"] > 0 and got["groups"]["optimizer"] > 0
    assert got["groups"]["data"] > 0  # the step's own scope, seen by this profiler
