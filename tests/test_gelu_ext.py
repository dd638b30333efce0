"""gelu_ext against F.gelu(approximate="tanh"): values, gradients, dtypes, shapes, registration."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import gelu_ext
import lenet5
from conftest import REPO

built = pytest.mark.skipif(not gelu_ext.is_built(), reason=gelu_ext.BUILD_HINT)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SHAPES = [(), (0,), (0, 3), (1,), (7,), (3, 5, 7), (1_000_003,)]  # 0-d, empty, ragged, > 2^20 (parallel)
IMPLS = {"cpp": gelu_ext.gelu, "python": gelu_ext.gelu_python}


def reference(x):
    return F.gelu(x, approximate="tanh")


def tolerance(dtype):
    # Against ATen in the same dtype. float32: ATen's own error is up to ~4e-6 (1 + tanh(u) cancels
    # for x < 0), so 1e-5; the 1e-6 accuracy is checked against float64 in test_float32_accuracy.
    # half/bfloat16: two roundings of a float32 result apart at most.
    return {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12),
            torch.float16: dict(rtol=2**-9, atol=2**-9), torch.bfloat16: dict(rtol=2**-6, atol=2**-6)}[dtype]


def sample(shape, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(device=device, dtype=dtype)


def check_against_reference(impl, x, loose=False, view=lambda t: t):
    """impl(view(x)) against ATen, values and gradients. The op is called on the view itself (a
    misaligned or strided view of a leaf), not on a copy, so its view paths are what runs."""
    leaves = [x.detach().clone().requires_grad_() for _ in range(2)]
    x1, x2 = view(leaves[0]), view(leaves[1])
    y1, y2 = impl(x1), reference(x2)
    assert y1.shape == x2.shape and y1.dtype == x.dtype and y1.device == x.device
    tol = tolerance(x.dtype)
    if loose and x.dtype == torch.float32:  # the literal formula: 1 - t^2 cancels for |x| ~ 4..6
        tol = dict(rtol=1e-5, atol=5e-5)
    assert_close(y1, y2, **tol)
    grad = sample(x2.shape, x.dtype, x.device, seed=1)
    y1.backward(grad)
    y2.backward(grad)
    assert_close(leaves[0].grad, leaves[1].grad, **tol)


@pytest.mark.parametrize("impl", [pytest.param("cpp", marks=built), "python"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_aten_forward_and_backward(impl, dtype, shape):
    check_against_reference(IMPLS[impl], sample(shape, dtype), loose=impl == "python")


@pytest.mark.parametrize("impl", [pytest.param("cpp", marks=built), "python"])
def test_non_contiguous_inputs(impl):
    base = sample((64, 48), torch.float32)
    views = (lambda t: t.t(), lambda t: t[::2, 1::3], lambda t: t[:, 5], lambda t: t.unsqueeze(0).expand(3, 64, 48))
    for view in views:
        assert not view(base).is_contiguous()
        check_against_reference(IMPLS[impl], base, loose=impl == "python", view=view)


def forward_backward(impl, x, grad):
    x = x.detach().clone().requires_grad_()
    y = impl(x)
    y.backward(grad)
    return y.detach(), x.grad


@built
def test_float32_accuracy_against_float64():
    """Within 1e-6 of the exact (float64) values on a million inputs, and no worse than ATen's float32."""
    x, grad = sample((1_000_000,), torch.float64), sample((1_000_000,), torch.float64, seed=1)
    y_true, dx_true = forward_backward(reference, x, grad)
    y, dx = forward_backward(gelu_ext.gelu, x.float(), grad.float())
    assert_close(y.double(), y_true, rtol=1e-6, atol=1e-6)
    assert_close(dx.double(), dx_true, rtol=1e-6, atol=1e-6)
    y_aten, dx_aten = forward_backward(reference, x.float(), grad.float())
    assert (dx.double() - dx_true).abs().max() <= (dx_aten.double() - dx_true).abs().max()


@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inf_and_nan_propagate_like_aten(dtype):
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1.0, -30.0], dtype=dtype)
    check = dict(rtol=0, atol=0, equal_nan=True)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = gelu_ext.gelu(xa), reference(xb)
    assert_close(ya, yb, **check)
    ya.sum().backward()
    yb.sum().backward()
    assert_close(xa.grad, xb.grad, **check)


@pytest.mark.parametrize("impl", [pytest.param("cpp", marks=built), "python"])
def test_gradcheck_and_gradgradcheck_float64(impl):
    fn = gelu_ext.gelu if impl == "cpp" else gelu_ext.gelu_python
    x = (sample((4, 5), torch.float64) * 3).requires_grad_()  # the curvature changes sign near |x| ~ 1.5
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.parametrize("impl", [pytest.param("cpp", marks=built), "python"])
def test_gradient_penalty_matches_aten(impl):
    """A second derivative in practice: d/dx of |dy/dx|^2, against ATen's own double backward."""
    import warnings
    fn = gelu_ext.gelu if impl == "cpp" else gelu_ext.gelu_python
    grads = []
    for f in (fn, reference):
        x = sample((1000,), torch.float64).mul(3).requires_grad_()
        (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "autograd kernel was not registered" would be a wrong gradient
            g.pow(2).sum().backward()
        grads.append(x.grad)
    assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)


@built
def test_autograd_is_registered_through_torch_library_only():
    """The backward comes from ops.py's register_autograd: the op called directly is differentiable, and
    no C++ source reaches into torch's internals (torch/csrc) for it."""
    x = sample((100,), torch.float64).requires_grad_()
    (dx,) = torch.autograd.grad(torch.ops.gelu_ext.gelu_forward.default(x).sum(), x)
    assert_close(dx, torch.func.grad(lambda v: reference(v).sum())(x.detach()), rtol=1e-12, atol=1e-12)
    sources = [p for p in (REPO / "gelu_ext" / "csrc").rglob("*") if p.is_file()]
    assert sources and not [p.name for p in sources if "torch/csrc" in p.read_text()]


@built
def test_forward_mode_ad_is_refused_not_a_zero_tangent():
    """torch.library registers no jvp for a custom op: gelu() says so instead of a silent zero tangent."""
    x, t = sample((8,), torch.float64), torch.ones(8, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="no forward-mode AD.*F.gelu"):
        torch.func.jvp(gelu_ext.gelu, (x,), (t,))
    with torch.autograd.forward_ad.dual_level(), pytest.raises(NotImplementedError, match="forward-mode"):
        gelu_ext.gelu(torch.autograd.forward_ad.make_dual(x, t))


@built
def test_gradcheck_both_ops_with_batched_gradients():
    """gelu_backward's own backward (what second derivatives use) and vmap over the backward pass."""
    x = (sample((4, 5), torch.float64) * 3).requires_grad_()
    assert torch.autograd.gradcheck(gelu_ext.gelu, (x,), check_batched_grad=True)
    assert torch.autograd.gradgradcheck(gelu_ext.gelu, (x,), check_batched_grad=True)
    grad = sample((4, 5), torch.float64, seed=1).requires_grad_()
    assert torch.autograd.gradcheck(torch.ops.gelu_ext.gelu_backward.default, (grad, x), check_batched_grad=True)


@built
def test_vmap_matches_aten():
    x = sample((6, 33), torch.float32)
    assert_close(torch.vmap(gelu_ext.gelu)(x), reference(x))
    assert_close(torch.vmap(gelu_ext.gelu, in_dims=1, out_dims=1)(x), reference(x))


@built
def test_module_is_scriptable():
    scripted = torch.jit.script(gelu_ext.GELU())
    x = sample((3, 7), torch.float32)
    check_against_reference(scripted, x)


@built
def test_build_info_says_whether_the_cuda_kernel_is_in():
    info = gelu_ext.build_info()
    assert ("CPU + CUDA kernels" in info) == gelu_ext.built_with_cuda() and torch.__version__ in info


@built
def test_labs_own_check_gradient_mse_is_zero():
    """The handout's check: MSE between the gradients of the custom op and of PyTorch's GELU."""
    x = torch.randn(10_000, requires_grad=True)
    gelu_ext.gelu(x).sum().backward()
    ours = x.grad.clone()
    x.grad = None
    reference(x).sum().backward()
    assert F.mse_loss(ours, x.grad).item() < 1e-12


@built
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(dtype):
    for shape in [(3, 4), (0,), ()]:
        x = sample(shape, dtype).requires_grad_()
        torch.library.opcheck(torch.ops.gelu_ext.gelu_forward.default, (x,))
        torch.library.opcheck(torch.ops.gelu_ext.gelu_backward.default, (sample(shape, dtype, seed=1), x.detach()))


@built
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_torch_compile_fullgraph(device):
    """No graph break, and AOTAutograd traces forward and backward through the fake kernels and the
    registered autograd. aot_eager, not inductor: inductor would add only its own code generation around
    the op (a cold C++ compile of ~55 s on the GPU check's machine, for nothing about the op)."""
    def f(x):
        return gelu_ext.gelu(x * 2 + 1).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    x = sample((256,), torch.float32, device).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    out = compiled(x)
    out.backward()
    reference(x_ref * 2 + 1).sum().backward()
    assert_close(out, reference(x_ref.detach() * 2 + 1).sum())
    assert_close(x.grad, x_ref.grad, **tolerance(torch.float32))


@pytest.mark.parametrize("impl", [pytest.param("cpp", marks=built), "python"])
def test_rejects_integer_tensors_with_one_message(impl):
    fn = gelu_ext.gelu if impl == "cpp" else gelu_ext.gelu_python
    with pytest.raises(RuntimeError, match="^gelu_ext.gelu: expected a floating-point tensor, got Long$"):
        fn(torch.arange(5))


@built
def test_cuda_kernel_registered_when_built_with_nvcc():
    has_cuda_kernel = torch._C._dispatch_has_kernel_for_dispatch_key("gelu_ext::gelu_forward", "CUDA")
    assert has_cuda_kernel == gelu_ext.built_with_cuda()
    assert torch._C._dispatch_has_kernel_for_dispatch_key("gelu_ext::gelu_backward", "CUDA") == has_cuda_kernel
    if os.environ.get("GELU_EXT_EXPECT_CUDA") == "1":  # CI builds with nvcc: the kernel must be there
        assert has_cuda_kernel, "the build found no nvcc; set CUDA_HOME"


@built
@cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(2**20 + 3,)])
def test_cuda_matches_aten(dtype, shape):
    check_against_reference(gelu_ext.gelu, sample(shape, dtype, "cuda"))


@built
@cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [1, 2, 4])
def test_cuda_misaligned_and_strided_views(dtype, offset):
    """x[offset:] starts off the 16-byte boundary: the kernel must take its narrower loads (down to
    one element at a time) on the view itself; odd lengths leave a partial last block."""
    x = sample((2**16 + 7,), dtype, "cuda")
    check_against_reference(gelu_ext.gelu, x, view=lambda t: t[offset:])
    check_against_reference(gelu_ext.gelu, x, view=lambda t: t[offset::3])


# ------------------------------------------------------------------ benchmarks/gelu_bench.py

def gelu_bench():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gelu_bench
    return gelu_bench


@built
def test_gelu_bench_writes_its_table(tmp_path):
    out = tmp_path / "bench.json"
    result = gelu_bench().main(["--device", "cpu", "--log2", "8", "11", "--repeats", "2", "--metrics-out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["ext_measured"] is True and [r["n"] for r in saved["rows"]] == [256, 2048]
    row = saved["rows"][0]
    assert row["calls"] == 1000 and row["ext_vs_aten"] == row["aten_ms"] / row["ext_ms"]
    assert row["ext_vs_aten_per_round"][0] <= row["ext_vs_aten_per_round"][1] <= row["ext_vs_aten_per_round"][2]
    assert result["float32_max_backward_error"]["ext"] < 1e-6


def test_gelu_bench_measures_the_others_without_the_op(tmp_path, monkeypatch, capsys):
    """Not built (or, on a GPU, built without its CUDA kernel): ATen and the rest are still measured."""
    bench = gelu_bench()
    monkeypatch.setattr(gelu_ext.ops, "_C", None)
    monkeypatch.setattr(gelu_ext.ops, "_IMPORT_ERROR", ImportError("simulated"), raising=False)
    out = tmp_path / "bench.json"
    bench.main(["--device", "cpu", "--log2", "8", "--repeats", "1", "--metrics-out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["ext_measured"] is False and "not built" in saved["ext_missing_reason"]
    assert saved["rows"][0]["aten_ms"] > 0 and "ext_ms" not in saved["rows"][0]
    assert capsys.readouterr().out.startswith("note: the ext op is not measured: ")


def test_gelu_bench_ends_the_table_at_a_size_without_memory(tmp_path, monkeypatch):
    """A 2080Ti (11 GiB) cannot hold the composites' temporaries at 2^28: the sizes before stay."""
    bench = gelu_bench()
    measure = bench.measure_size

    def measure_or_oom(n, *rest):
        if n > 2**9:
            raise torch.cuda.OutOfMemoryError("simulated")
        return measure(n, *rest)
    monkeypatch.setattr(bench, "measure_size", measure_or_oom)
    out = tmp_path / "bench.json"
    bench.main(["--device", "cpu", "--log2", "8", "9", "10", "--repeats", "1", "--metrics-out", str(out)])
    saved = json.loads(out.read_text())
    assert [r["n"] for r in saved["rows"]] == [256, 512] and saved["stopped"].startswith("2^10: out of GPU memory")


def test_gelu_bench_knows_a_build_without_the_cuda_kernel(monkeypatch):
    bench = gelu_bench()
    monkeypatch.setattr(gelu_ext.ops, "_C", type("C", (), {"with_cuda": 0}))
    assert "without its CUDA kernel" in bench.ext_missing_reason(torch.device("cuda"))
    assert bench.ext_missing_reason(torch.device("cpu")) is None


# ------------------------------------------------------------------ used to train LeNet-5

@pytest.mark.parametrize("act", [pytest.param("cpp", marks=built), "python"])
def test_lenet5_trains_with_own_gelu(act, tiny_mnist, tmp_path):
    metrics = lenet5.main(["--data-dir", str(tiny_mnist), "--no-download", "--epochs", "2", "--batch-size", "32",
                           "--act", act, "--device", "cpu", "--out-dir", str(tmp_path / "run")])
    assert metrics["act"] == act and metrics["test_accuracy"] > 0.8


def test_lenet5_says_how_to_build_when_extension_missing(tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.setattr(gelu_ext.ops, "_C", None)
    monkeypatch.setattr(gelu_ext.ops, "_IMPORT_ERROR", ImportError("simulated"), raising=False)
    with pytest.raises(SystemExit, match="pip install --no-build-isolation -e ./gelu_ext"):
        lenet5.main(["--data-dir", str(tiny_mnist), "--no-download", "--act", "cpp", "--out-dir", str(tmp_path / "r")])


# ------------------------------------------------------------------ the build: nvcc against torch's CUDA

def fake_cuda_home(root, release):
    """A CUDA_HOME whose bin/nvcc reports `release` (and the header setup.py looks for): no compiler."""
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    return root


def run_setup(tmp_path, release, **env):
    """gelu_ext/setup.py --name (reads the configuration, builds nothing) with a fake nvcc; from tmp_path,
    so nothing is written beside the sources."""
    home = fake_cuda_home(tmp_path / "cuda", release)
    env = {**{k: v for k, v in os.environ.items() if k != "GELU_EXT_CPU_ONLY"}, "CUDA_HOME": str(home),
           "PATH": f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}", **env}
    return subprocess.run([sys.executable, str(REPO / "gelu_ext" / "setup.py"), "--name"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def other_major():
    return f"{int(torch.version.cuda.split('.')[0]) + 1}.0"


torch_cuda = pytest.mark.skipif(torch.version.cuda is None, reason="a CPU build of torch: no CUDA major to differ from")


@torch_cuda
def test_build_with_nvcc_of_another_cuda_major_stops_in_one_line_naming_the_ways_out(tmp_path):
    done = run_setup(tmp_path, other_major())
    assert done.returncode != 0 and "Traceback" not in done.stderr
    # the last line, and the only one of ours (on a machine without a GPU, torch's cpp_extension logs
    # "No CUDA runtime is found" on import, before it)
    line = done.stderr.strip().splitlines()[-1]
    assert [text for text in done.stderr.splitlines() if "gelu_ext" in text] == [line]
    assert f"is CUDA {other_major()} but torch {torch.__version__} was built with CUDA {torch.version.cuda}" in line
    assert f"module load cuda/{torch.version.cuda}" in line
    assert "GELU_EXT_CPU_ONLY=1 pip install --no-build-isolation -e ./gelu_ext" in line


@pytest.mark.slow
@torch_cuda
def test_build_with_nvcc_of_torchs_cuda_major_or_cpu_only_goes_on(tmp_path):
    same = run_setup(tmp_path / "same", f"{torch.version.cuda.split('.')[0]}.9")  # a minor difference is fine
    assert same.returncode == 0 and "building CPU + CUDA kernels" in same.stdout, same.stderr
    cpu = run_setup(tmp_path / "cpu", other_major(), GELU_EXT_CPU_ONLY="1")
    assert cpu.returncode == 0 and "building CPU-only kernels" in cpu.stdout, cpu.stderr
