"""A student's report (report/student.md): built from the runs and result files they name and nothing else, none
of the repository's own measurements or attributions in it, their ladder tabled whole, every string of their files
literal text, and what their files do not answer a visible gap naming the command that fills it."""
import html
import importlib
import json
import re
import shutil
import sys

import pytest

import gpt_train
import lenet5
from conftest import REPO, tiny_args, write_tiny_mnist
from report import browser, facts, figures, make_report

COMMITTED = REPO / "report" / "results"
FORBIDDEN = ("H200", "f52a456", "2026-11-30", "课程助教组", "参考实现")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
# a gpt_bench.py JSON as it writes one: rungs, an indented leave-one-out row, candidates (one failed), peak memory
LADDER = {"device_name": "Test CPU, CPU (3 threads)", "micro_batch": 3, "seq_len": 48, "vocab_size": 300,
          "repeats": 3, "warmup": 1, "steps": 2, "rungs": [
              {"name": "naive: GPT2LMHeadModel, fp32", "tokens_per_second": 101.0,
               "tokens_per_second_range": [96.0, 104.0], "peak_memory_gib": 1.53},
              {"name": "+ dropout 0 (no masks)", "tokens_per_second": 183.0,
               "tokens_per_second_range": [171.0, 191.0], "peak_memory_gib": 1.47,
               "verdict": {"against": "naive: GPT2LMHeadModel, fp32", "ratio": 1.8, "low": 1.7, "high": 1.9,
                           "pairs": 3, "word": "faster"}},
              {"name": "+ fused AdamW (= gpt_train.py default)", "tokens_per_second": 187.0,
               "tokens_per_second_range": [176.0, 203.0], "peak_memory_gib": None,
               "verdict": {"against": "+ dropout 0 (no masks)", "ratio": 1.02, "low": 0.97, "high": 1.08,
                           "pairs": 3, "word": "within noise"}},
              {"name": "  default without dropout 0", "tokens_per_second": 113.0,
               "tokens_per_second_range": [103.0, 119.0], "peak_memory_gib": 1.52},
              {"name": "  candidate: activation checkpointing (--act-ckpt)", "tokens_per_second": 151.0,
               "tokens_per_second_range": [141.0, 166.0], "peak_memory_gib": 0.91},
              {"name": "  candidate: chunked loss (--loss chunked)", "error": "out of memory"}]}


@pytest.fixture(scope="module")
def mine(tmp_path_factory, corpus):
    """A student's tiny CPU runs (LeNet-5, 1 epoch; GPT on a corpus the tests write) and a ladder JSON of theirs."""
    root = tmp_path_factory.mktemp("student")
    mnist = write_tiny_mnist(root / "mnist", n_train=200, n_test=100)
    lenet5.main(["--data-dir", str(mnist), "--no-download", "--epochs", "1", "--batch-size", "50", "--log-every",
                 "2", "--device", "cpu", "--out-dir", str(root / "runs" / "lenet5" / "a")])
    gpt_train.main(tiny_args(corpus, root / "runs" / "gpt" / "b", "--tokens", str(20 * 8 * 32)))
    (root / "gpt_bench_mine.json").write_text(json.dumps(LADDER))
    return root


def build(out, *named):
    make_report.main([*map(str, named), "--out", str(out), "--no-screenshots"])
    return (out / "report_filled.md").read_text(), (out / "results.md").read_text()


def numbers(text):
    """The numbers a text holds with three digits or more ('147', '1.03', '12,058,624' as '12058624')."""
    return {n.replace(",", "") for n in NUMBER.findall(text) if sum(c.isdigit() for c in n) >= 3}


def own_numbers(files, ladder=None):
    """Every number the files hold, as a report may print it: as written, rounded to 0-4 decimals, as a
    percentage, without thousands separators; and a ladder's ratios between its rows."""
    values, text = [], ""
    for path in files:
        text += path.read_text()
        stack = [json.loads(path.read_text())]
        while stack:
            v = stack.pop()
            stack += v.values() if isinstance(v, dict) else v if isinstance(v, list) else []
            values += [v] if isinstance(v, (int, float)) and not isinstance(v, bool) else []
    speeds = [r["tokens_per_second"] for r in (ladder or {"rungs": []})["rungs"] if "tokens_per_second" in r]
    values += [a / b for a in speeds for b in speeds]
    shown = {f"{x * scale:.{d}f}" for x in values for scale in (1, 100) for d in range(5)}
    return numbers(text) | {n.replace(",", "") for n in shown} | {str(round(x)) for x in values}


def test_a_students_report_holds_only_their_numbers_and_none_of_the_repositorys(mine, tmp_path):
    """Built from tiny CPU runs and a ladder of theirs: no number of report/results or of the committed report that
    their files do not also hold (no 12M tokens, 184 steps, 768 dimensions, ladder rows of ours), no attribution
    or machine of ours, their own model shape, the name line blank, and their figure beside the filled report."""
    lenet, gpt = mine / "runs" / "lenet5" / "a", mine / "runs" / "gpt" / "b"
    filled, listing = build(tmp_path / "out", lenet, gpt, mine / "gpt_bench_mine.json")
    ours = set()
    for path in COMMITTED.glob("*.json"):
        ours |= own_numbers([path]) - {str(n) for n in range(1000)}  # (small whole numbers: in any text)
    ours |= numbers((REPO / "report" / "generated" / "report_filled.md").read_text())
    theirs = own_numbers([*lenet.glob("*.json"), *gpt.glob("*.json"), mine / "gpt_bench_mine.json"], LADDER)
    for text in (filled, listing):
        leaked = (numbers(text) & ours) - theirs
        assert leaked == set(), sorted(leaked)
        for word in FORBIDDEN + ("1200 万", "184 步", "768 维", "12 层", "GPT-2 124M", "在 GPU 上训练"):
            assert word not in text, word
    assert "**姓名：**＿" in filled and "{{" not in filled
    args = json.loads((gpt / "args.json").read_text())
    assert f"{args['n_layer']} 层、{args['n_head']} 头、{args['n_embd']} 维" in filled
    assert ", CPU (" not in filled and "处理器（1 线程）" in filled  # a CPU's name as a Chinese sentence says it
    assert re.findall(r"!\[[^\]]*\]\(([^)]+)\)", filled).count("gpt_curves.png") == 1
    assert (tmp_path / "out" / "gpt_curves.png").is_file()
    numbers_ = numbers(filled)  # the ladder the student named is the ladder shown
    assert {"187", "151", "0.91"} <= numbers_ and not {"147", "811"} & numbers_


def test_their_ladder_fills_the_table_every_row_in_chinese_with_its_verdict_memory_and_spread(mine, tmp_path):
    """Every row the JSON measured (a candidate too), its peak memory (a null as a dash), a failed row with its
    error, a caption from the JSON's own hardware, shape and repeats, × computed from the rows and each paired verdict's
    word (噪声内, 更快) where gpt_bench.py judged the row, none where it did not."""
    filled, _ = build(tmp_path / "out", mine / "gpt_bench_mine.json")
    rungs = LADDER["rungs"]
    default = rungs[2]["tokens_per_second"]
    assert "| dropout 0 | 183 [171–191]（×1.81，更快） | ×1.80 [1.70–1.90]，3 对，比 朴素基线 | 1.47 |" in filled
    assert ("| fused AdamW（= 默认配置） | 187 [176–203]（×1.02，噪声内） | ×1.02 [0.97–1.08]，3 对，比 dropout 0 "
            "| — |") in filled
    assert f"| ↳ 默认配置去掉 dropout 0 | 113 [103–119]（默认的 ×{113 / default:.2f}） | — | 1.52 |" in filled
    assert (f"| ↳ 候选：activation checkpointing (--act-ckpt) | 151 [141–166]（默认的 ×{151 / default:.2f}） "
            "| — | 0.91 |") in filled
    assert "| ↳ 候选：chunked loss (--loss chunked) | 失败：out of memory | — | — |" in filled
    assert "Test CPU 处理器（3 线程）：每步 3 × 48 个 token，词表 300；每行 3 次交替重复" in filled


def test_what_their_files_do_not_answer_is_a_gap_naming_a_command_that_exists(mine, tmp_path, capsys):
    """Only a LeNet-5 run named: GPT, the ladder, GPU utilisation and the GELU measurement are visible gaps, each
    with its command; every flag those commands pass is one the script takes (its --help lists it)."""
    filled, _ = build(tmp_path / "out", mine / "runs" / "lenet5" / "a")
    assert "python benchmarks/gpt_bench.py" in filled and "python benchmarks/gelu_bench.py" in filled
    assert filled.count("**待补**") >= 6 and "{{" not in filled
    sys.path.insert(0, str(REPO / "benchmarks"))
    commands = re.findall(r"`python (\S+)\.py((?: --[\w-]+(?: [^\s`-]\S*)?)*)`",
                          (REPO / "report" / "student.md").read_text())
    assert {"benchmarks/gpt_bench", "benchmarks/gelu_bench", "gpt_train"} <= {script for script, _ in commands}
    for script, flags in commands:
        with pytest.raises(SystemExit):
            importlib.import_module(script.removeprefix("benchmarks/").replace("/", ".")).main(["--help"])
        usage = capsys.readouterr().out
        for flag in re.findall(r"--[\w-]+", flags):
            assert f"{flag} " in usage, (script, flag)


def test_strings_of_a_crafted_metrics_json_stay_literal_text(mine, tmp_path):
    """An <iframe> reading a local file, an image link and a fake bold result, put in the strings of a run's
    metrics.json (a sentence's and a code span's), are text in the filled report and in the page Chromium prints."""
    run = tmp_path / "crafted"
    shutil.copytree(mine / "runs" / "lenet5" / "a", run)
    payload = "<iframe src=file:///etc/passwd></iframe> ![](/abs/x.png) 训练损失 **2.01** 达到目标"
    metrics = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps(metrics | {"device_name": payload, "command": payload}))
    filled, _ = build(tmp_path / "out", run)
    for raw in ("<iframe", "![](/abs", "**2.01**"):
        assert raw not in filled, raw
    page = browser.report_html(filled)
    assert "<iframe" not in page and "<strong>2.01</strong>" not in page
    assert not any("/abs/x.png" in image for image in re.findall(r"<img[^>]*>", page))
    words = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert "<iframe src=file:///etc/passwd></iframe> ![](/abs/x.png) 训练损失 **2.01** 达到目标" in words


def test_a_string_in_a_code_span_keeps_its_text_and_outside_one_is_escaped():
    sources = {"x": ({"s": "a_b <i> `c` *d*"}, "x.json")}
    text, problems, _ = facts.fill("`{{ x.s|code }}` and {{ x.s }}", sources)
    assert problems == [] and text == "`a_b &lt;i&gt; 'c' *d*` and a\\_b &lt;i&gt; \\`c\\` \\*d\\*"


def test_device_names_are_said_as_chinese_text_says_them():
    assert figures.device_words("AMD EPYC, CPU (1 thread)") == "AMD EPYC 处理器（1 线程）"
    assert figures.device_words("AMD EPYC, CPU (2 threads)") == "AMD EPYC 处理器（2 线程）"
    assert figures.device_words("NVIDIA H200") == "NVIDIA H200"


@pytest.mark.parametrize("tokens", [200_000, 12_058_624])
def test_figure_4_tick_labels_do_not_overlap_and_its_title_is_inside_the_figure(tmp_path, monkeypatch, tokens):
    """The GPT curves of a 200K- and a 12M-token run: token counts on the x axes readable side by side, and a long
    title (a server CPU's name) whole, not cut at the figure's edges."""
    steps = 50
    m = {"tokens_seen": tokens, "steps": steps, "params": 1_152_768, "preset": "tiny", "world_size": 1,
         "device_name": "AMD EPYC 7763 64-Core Processor, CPU (16 threads)", "precision": "bf16",
         "corpus": {"name": "stand-in"},
         "loss_curve": [[i, 9 - i * 0.08] for i in range(1, steps + 1)], "val_curve": [[25, 7.5], [50, 5.5]],
         "throughput_curve": [[i, 150_000 + i * 100] for i in range(1, steps + 1)]}
    save, checked = figures.save, []

    def check(fig, path):
        fig.tight_layout()  # laid out as save lays it out, drawn, measured; then saved
        fig.canvas.draw()
        renderer, width = fig.canvas.get_renderer(), fig.bbox.width
        for ax in fig.axes:
            boxes = sorted((t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()),
                           key=lambda b: b.x0)
            assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), [t.get_text() for t in ax.get_xticklabels()]
        title = fig._suptitle.get_window_extent(renderer)
        assert 0 <= title.x0 and title.x1 <= width
        checked.append(path)
        save(fig, path)
    monkeypatch.setattr(figures, "save", check)
    figures.gpt_curves(m, tmp_path / "gpt_curves.png")
    assert checked and (tmp_path / "gpt_curves.png").read_bytes().startswith(b"\x89PNG")


def test_a_run_string_with_dollar_signs_is_drawn_as_text_not_math(tmp_path):
    """matplotlib reads $...$ in a title as mathtext: a device name such as `$x_$` made the curves figure fail,
    leaving the report without it."""
    m = json.loads((REPO / "report" / "results" / "gpt_run_tiny_standin_cpu.json").read_text())
    figures.gpt_curves({**m, "device_name": "$x_$ or $\\frac$"}, tmp_path / "gpt_curves.png")
    assert browser.is_png(tmp_path / "gpt_curves.png")


def copied_run(run, to, args=None, metrics=None):
    """A run folder copied with some args.json / metrics.json fields replaced, and without its events."""
    shutil.copytree(run, to, ignore=shutil.ignore_patterns("events.out.tfevents.*", "*.pt", "final"))
    for name, changes in (("args.json", args or {}), ("metrics.json", metrics or {})):
        (to / name).write_text(json.dumps(json.loads((to / name).read_text()) | changes))
    return to


def test_several_runs_are_tabled_against_the_first_named_each_change_with_its_effect(mine, tmp_path):
    """Two GPT runs and two LeNet-5 runs named: each kind tabled against its first (what the later one changed in
    args.json and metrics.json's accelerations, its tokens/s as a multiple of the baseline's, the time its loss
    first fell below 7), and one figure of every GPT run's loss against the job's clock."""
    gpt, lenet = mine / "runs" / "gpt" / "b", mine / "runs" / "lenet5" / "a"
    base = json.loads((gpt / "metrics.json").read_text())
    steps = base["steps"]
    faster = copied_run(gpt, tmp_path / "faster", {"fused_adamw": "off"}, {
        "tokens_per_second": base["tokens_per_second"] * 2, "accelerations": base["accelerations"] | {"x": 1},
        "loss_curve": [[1, 9.0], [steps, 6.5]], "phases": {"startup": 1.0, "loop": 4.0, "evaluation": 1.0},
        "train_seconds": 4.0, "process_seconds": 6.0, "process_seconds_total": 6.0})
    epochs = copied_run(lenet, tmp_path / "epochs", {"epochs": 2})
    filled, listing = build(tmp_path / "out", gpt, lenet, faster, epochs)
    table = filled.split("**基线 → 每一项改动 → 效果。**")[2]
    assert f"基线是第一个列出的运行 `{gpt}`" in table and "| `b` | （基线） |" in table
    row = next(line for line in table.splitlines() if line.startswith("| `faster` |"))
    assert "`accelerations.x`: — → 1" in row and "`fused_adamw`: on → off" in row and "（×2.00）" in row
    assert "| 5 s |" in row and "| 6 s |" in row  # 1 s before the loop + the loop's last step; the job's 6 s
    assert "| `epochs` | `epochs`: 1 → 2 |" in filled  # LeNet-5's own table, against its own first run
    assert re.findall(r"!\[[^\]]*\]\(([^)]+)\)", filled).count("gpt_compare.png") == 1
    assert browser.is_png(tmp_path / "out" / "gpt_compare.png") and "## GPT runs compared" in listing


def test_the_student_writes_principles_and_conclusions_and_lists_references(mine, tmp_path):
    """What the handout grades (principles, motivations, conclusions, the operator's design) is a 待补 prompt, not
    our prose; a references section asks for this repository and any other code; with --no-screenshots no
    TensorBoard caption describes an image that is not there."""
    filled, _ = build(tmp_path / "out", mine / "runs" / "lenet5" / "a", mine / "runs" / "gpt" / "b")
    for ours in ("张量核心", "不写出 T×T", "代价是编译的秒数", "TORCH_LIBRARY", "at::parallel_for"):
        assert ours not in filled, ours
    references = filled.split("## 8. 参考资料")[1]
    assert "**待补**" in references and "本仓库" in references and "其他代码" in references
    assert "tensorboard" not in filled.lower().split("## 4.")[0].split("## 3.")[1].replace(
        "tensorboard 截图", "")  # §3: the gaps only, no image and no caption
    assert "SCALARS 页" not in filled and not list((tmp_path / "out").glob("*tensorboard*"))


def test_a_screenshot_put_in_out_by_hand_keeps_its_caption_with_no_screenshots(mine, tmp_path):
    out = tmp_path / "out"
    build(out, mine / "runs" / "gpt" / "b")
    shutil.copy(REPO / "report" / "generated" / "gpt_tensorboard_scalars.png", out)  # taken by hand
    filled, _ = build(out, mine / "runs" / "gpt" / "b")
    assert "](gpt_tensorboard_scalars.png)" in filled and "SCALARS 页" in filled
    assert (out / "gpt_tensorboard_scalars.png").is_file()
