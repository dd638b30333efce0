"""The Markdown tables: results.md's of the runs shown (a missing or mistyped field raises: the caller names the
file in one problem line), and the two the report's text shows."""
from report.inputs import NUMBER, corpus_name, rel


def corpus_label(m):
    """The warning a table carries when its numbers are not WOS's."""
    name = corpus_name(m)
    return {"WOS46985": "", "stand-in": " — **stand-in corpus, not WOS**"}.get(name, f" — **corpus '{name}', not WOS**")


def fmt(value, spec=".4g"):
    """A number as `spec`, a missing one as a dash, anything else as it is."""
    return "—" if value is None else format(value, spec) if isinstance(value, NUMBER) else str(value)


def lenet_table(m):
    return ["| test accuracy | test loss | epochs | training s | device | act | parameters |",
            "|---|---|---|---|---|---|---|",
            f"| {m['test_accuracy']:.2%} | {m['test_loss']:.4f} | {m['epochs']} | {m['train_seconds']:.1f} | "
            f"{m.get('device_name', m['device'])} | {m['act']} | {m['params']:,} |"]


def gpt_table(m):
    process = m.get("process_seconds")  # end to end; an older run's in-process total_seconds is not that
    return ["| tokens | steps | final train loss | val loss | val bits/byte | < 7 | loop s | process s (end to end) | "
            "tokens/s | MFU | precision | processes | device |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            f"| {m['tokens_seen']:,} | {m['steps']} | {m['final_train_loss']:.3f} | {m['final_val_loss']:.3f} | "
            f"{m['val_bits_per_byte']:.3f} | {'yes' if m['success'] else 'no'} | {m['train_seconds']:.1f} | "
            f"{fmt(process, '.1f') if isinstance(process, (int, float)) else 'not recorded'} | "
            f"{m['tokens_per_second']:,.0f} | {fmt(m['mfu'], '.1%')} | {m['precision']} | "
            f"{m['world_size']} | {m['device_name']} |",
            "", f"Text: `{rel(m.get('text'))}`{corpus_label(m)}; tokenizer: `{rel(m.get('tokenizer'))}`, "
                f"vocabulary {m['vocab_size']:,}, {m['params']:,} parameters, preset `{m.get('preset')}`."]


# ----------------------------------------------------------------------------- tables the report's text shows

def gpu_runs_table(runs, headline):
    """A GPU folder's GPT runs [(stem, metrics, seconds, how)], the headline bold, rounded as the text quotes."""
    rows = ["| 运行 | 词表 | 编译 | 进程时间 | 训练循环（其中编译） | token/s | MFU | 训练 / 验证损失 | bits/byte |",
            "|---|---|---|---|---|---|---|---|---|"]
    for stem, m, seconds, how in runs:
        tag = stem.split("_")[2] if stem.count("_") >= 2 else stem
        cache = "，冷缓存" if "cold" in tag else "，热缓存" if "warm" in tag else ""
        compiling = m.get("compile", "off")
        loop = f"{m['train_seconds']:.1f} s" + (f"（{m['compile_seconds']:.1f} s）" if compiling != "off"
                                                 and isinstance(m.get("compile_seconds"), NUMBER) else "")
        process = "—" if seconds is None else f"{seconds:.0f} s"  # a step log's whole seconds: page 1's box says so
        name = f"**`{tag}`**" if stem == headline else f"`{tag}`"
        rows.append(f"| {name} | {m['vocab_size']:,} | {compiling}{cache} | {process} | {loop} | "
                    f"{m['tokens_per_second']:,.0f} | {fmt(m.get('mfu'), '.1%')} | {m['final_train_loss']:.2f} / "
                    f"{m['final_val_loss']:.2f} | {m['val_bits_per_byte']:.3f} |")
    return "\n".join(rows)


RUNG_NAMES = {"naive": "朴素基线", "+ dropout 0": "dropout 0",
              "+ SDPA attention": "SDPA 注意力", "+ own GPT module from the same GPT2Config": "自己的 GPT 模块",
              "+ TF32 matmuls": "TF32", "+ bf16 autocast": "**bf16 autocast**", "+ fp16 autocast + GradScaler":
              "**fp16 autocast + GradScaler**", "+ torch.compile, each block on its own": "按块 `torch.compile`",
              "+ fused AdamW": "fused AdamW（= 默认配置）"}


def rung_key(name):
    """A ladder row's name without its explanation: what the same row is called on every device."""
    return name.strip().split(" (")[0].split(":")[0]


def ladder_cells(bench):
    """{row: cell} of one ladder: tokens/s [range], × the row above (a rung) or the default (a leave-one-out row),
    噪声内 where the ranges overlap."""
    rows = [r for r in bench["rungs"] if isinstance(r.get("tokens_per_second"), NUMBER)]
    rungs = [r for r in rows if not r["name"].startswith(" ")]
    default, cells, previous = rungs[-1], {}, None
    for r in rows:
        key = rung_key(r["name"])
        if not (r in rungs or key.startswith("default without")):
            continue
        base = previous if r in rungs else default
        span = r.get("tokens_per_second_range") if bench.get("repeats", 1) > 1 else None
        cell = f"{r['tokens_per_second']:,.0f}" + (" [{:,.0f}–{:,.0f}]".format(*span) if span else "")
        if base:
            b = base.get("tokens_per_second_range") if span else None
            noisy = b and span and span[0] <= b[1] and b[0] <= span[1]
            ratio = f"{'' if r in rungs else '默认的 '}×{r['tokens_per_second'] / base['tokens_per_second']:.2f}"
            cell += f"（{ratio}{'，噪声内' if noisy else ''}）"
        cells[key], previous = cell, (r if r in rungs else previous)
    return cells


def ladder_compare(gpu, cpu, where, then=None):
    """The ladder on the GPU beside the CPU's; `then`: what older code's last rung was (its default, not today's)."""
    columns = [(f"{where}，{gpu.get('repeats', 1)} 次", ladder_cells(gpu))] if gpu else []
    if then and columns and (last := rung_key(gpu["rungs"][-1]["name"])) in columns[0][1]:
        columns[0][1][last] += f"：{then}"
    columns += [(f"CPU，{cpu.get('repeats', 1)} 次的中位数 [范围]", ladder_cells(cpu))] if cpu else []
    keys = list(dict.fromkeys(k for _, cells in columns for k in cells))
    keys.sort(key=lambda k: k.startswith("default without"))  # the rungs, then the leave-one-out rows
    rows = ["| 在上一行之上再加 | " + " | ".join(f"{head} token/s（× 上一行）" for head, _ in columns) + " |",
            "|---" * (len(columns) + 1) + "|"]
    for k in keys:
        what = RUNG_NAMES.get("+ " + k.removeprefix("default without "), k).strip("*").split("（")[0]
        name = RUNG_NAMES.get(k) or (f"默认配置去掉{' ' * what[:1].isascii()}{what}" if k.startswith("default") else k)
        rows.append(f"| {name} | " + " | ".join(cells.get(k, "—") for _, cells in columns) + " |")
    return "\n".join(rows)
