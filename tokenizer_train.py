"""Train an own byte-level BPE tokenizer on the Web of Science abstracts (WOS46985/X.txt).

    python tokenizer_train.py                                   # data/WebOfScience/WOS46985/X.txt
    python tokenizer_train.py --force                           # again: replaces the data/tokenizer/tokenizer.json
    python tokenizer_train.py --text ../shared/data/wos-standin/X.txt --metrics-out tok.json
    python tokenizer_train.py --compare ../shared/data/gpt2-tokenizer   # GPT-2's tokenizer: a folder, a file, or "gpt2"
    python gpt_train.py --tokenizer data/tokenizer/tokenizer.json   # then use it (the default when present)

Trained on the training split; bytes per token and decode(encode(text)) == text checked on the validation split."""
from training import lifecycle  # first, before the slow imports: the standard library only

lifecycle.start(__name__)  # a Ctrl-C while torch imports is one line, not a traceback

import os
import statistics
import sys
import time
from pathlib import Path

import tokenizers
import torch

from data import files, wos
from data.blocks import Packing, token_blocks
from data.tokenizer import (
    EOT,
    OWN_TOKENIZER,
    TokenizerError,
    byte_level,
    looks_like_a_path,
    open_tokenizer,
    tokenizer_sha256,
)
from training import device, rundir
from training.errors import UserError
from training.flags import Parser, add_output_flags, number, path_flag, path_or_name_flag, seed_flag


def train_bpe(docs, vocab_size):
    """Byte-level BPE, GPT-2 style: any byte sequence encodes, nothing is ever unknown."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tokenizer = byte_level(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=sys.stderr.isatty())  # in a file: only blank lines
    tokenizer.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tokenizer


def load_comparison(spec):
    """--compare's tokenizer, or None: a hub name not to be had offline is a note, a bad path a one-line error."""
    try:
        return None if spec == "none" else open_tokenizer(spec)
    except TokenizerError as e:
        if Path(spec).exists() or looks_like_a_path(spec):
            raise UserError(f"--compare: {e}") from None
        print(f"note: no comparison: {e}", file=sys.stderr)
        return None


def measures(tokenizer, docs, spec="none", other=None):
    """Bytes per token on `docs`, round-trip failures; with `other`, its bytes per token and the per-document ratio
    (None without)."""
    own = [e.ids for e in tokenizer.encode_batch(docs, add_special_tokens=False)]
    decoded = tokenizer.decode_batch(own, skip_special_tokens=False)
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    theirs = [e.ids for e in other.tokenizer.encode_batch(docs, add_special_tokens=False)] if other else own
    ratios = sorted(len(a) / len(b) for a, b in zip(own, theirs))
    return {"val_bytes_per_token": n_bytes / sum(map(len, own)),
            "val_round_trip_failures": sum(d != t for d, t in zip(decoded, docs)), "compare": spec,
            "compare_source": other and other.source, "compare_sha256": other and other.sha256,
            "compare_vocab_size": other and other.vocab_size,
            "gpt2_val_bytes_per_token": other and n_bytes / sum(map(len, theirs)),
            "val_docs_own_fewer_tokens": other and sum(r < 1 for r in ratios),
            "val_token_ratio_per_doc": other and {"median": statistics.median(ratios), "min": ratios[0],
                                                  "max": ratios[-1]}}


def token_cache(corpus, tokenizer, args, tokenizer_hash):
    """The blocks gpt_train.py --seq-len reads, cached; a failure is a warning (gpt_train.py makes them itself)."""
    t0 = time.perf_counter()
    packing = Packing(wos.tokens_per_block(args.seq_len), args.val_fraction, args.seed, args.cache_dir)
    try:
        _, stats = token_blocks(corpus, tokenizer, packing, tokenizer_hash)
        if "unwritten" in stats:
            raise UserError(f"it was not written ({stats['unwritten']})")
    except UserError as e:
        print(f"warning: no token cache: {e}; the tokenizer is saved in {args.out} (gpt_train.py tokenises the "
              f"corpus itself)", file=sys.stderr)
        return dict.fromkeys(["tokenize_seconds", "num_train_tokens", "num_val_tokens", "tokenize_from_cache"]) | {
            "token_cache_problem": str(e)}
    seconds, (train, val) = time.perf_counter() - t0, (stats["train"], stats["validation"])
    print(f"{'loaded' if train['from_cache'] else 'tokenised'} {train['tokens'] + val['tokens']:,} tokens in "
          f"{seconds:.1f} s")
    return {"tokenize_seconds": round(seconds, 3), "num_train_tokens": train["tokens"], "num_val_tokens": val["tokens"],
            "tokenize_from_cache": train["from_cache"]}


def save_atomic(tokenizer, path):
    """tokenizer.json as Tokenizer.save writes it, but atomically."""
    files.write_atomic(path, tokenizer.to_str(pretty=True).encode("utf-8"))


def parse_args(argv):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--text", type=path_flag, default=None,
                   help="X.txt, one document per line (default: $LAB5_DATA or data/ + WebOfScience/WOS46985/X.txt, "
                        "downloaded if missing)")
    # 2^20 at most: the trainer's memory grows with vocab_size (near 2^31 it aborts); the largest in use: ~256K
    p.add_argument("--vocab-size", type=number(int, 512, 2**20, multiple=64), default=16384,
                   help="a multiple of 64; see README for the choice (default: %(default)s)")
    p.add_argument("--out", type=path_flag, default=OWN_TOKENIZER, help="tokenizer.json (default: %(default)s)")
    p.add_argument("--val-fraction", type=number(float, 0, 0.5, "()"), default=0.005,
                   help="held-out documents (default: %(default)s)")
    p.add_argument("--seed", type=seed_flag, default=0, help="of the train/validation split (default: %(default)s)")
    p.add_argument("--seq-len", type=number(int, 0), default=1024,
                   help="gpt_train.py's --seq-len: also tokenise the corpus into the blocks of seq_len + 1 tokens it "
                        "reads from the cache; 0 = skip (default: %(default)s)")
    p.add_argument("--cache-dir", type=path_flag, default=None,
                   help="the token cache (default: the repository's data/cache, LAB5_DATA or not)")
    p.add_argument("--compare", type=path_or_name_flag, default="gpt2",
                   help="tokenizer to compare with: a tokenizer.json, a folder, a hub name found locally (the HF "
                        "cache or $LAB5_DATA or data/ + <name>-tokenizer/), or 'none' (default: %(default)s)")
    p.add_argument("--no-download", action="store_true", help="never try to download the WOS archive")
    p.add_argument("--accept-invalid-utf8", action="store_true", help="train on a text whose lines are mostly not "
                   "UTF-8 (their bad bytes as U+FFFD) instead of refusing it")
    add_output_flags(p)  # --metrics-out, and --force: also for --out
    return p.parse_args(argv)


def check_outputs(args):
    """Before any work: the outputs and the cache folder may be written, and none is an input."""
    outputs = {"--out": args.out, "--metrics-out": args.metrics_out}
    compare = Path(args.compare) if Path(args.compare).exists() else None
    rundir.check_outputs_not_inputs({**outputs, "--cache-dir": args.cache_dir},
                                      {"--text": args.text or wos.default_text(), "--compare": compare})
    for flag, path in outputs.items():
        if path:
            rundir.check_output(path, flag, args.force)
    files.check_folder(args.cache_dir or wos.default_cache(), "--cache-dir")


def main(argv=None):
    phases = lifecycle.phases()
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    with lifecycle.one_line_errors(lambda: f"{args.out} is written when training ends (the token cache after it): "
                                   f"run the command again, with --force if {args.out} exists"):
        check_outputs(args)
        text = wos.resolve_text(args.text, download=not args.no_download)
        other = load_comparison(args.compare)  # before the work: a mistyped path is one line now
        phases.switch("data")
        corpus = wos.read_corpus(text, args.accept_invalid_utf8)  # read once: the documents and the cache's key
        splits = wos.load_splits(corpus, args.val_fraction, args.seed)
        train_docs, val_docs = splits["train"], splits["validation"]
        print(f"{text}: {len(train_docs):,} training / {len(val_docs):,} validation documents")
        phases.switch("loop")
        t0 = time.perf_counter()
        tokenizer = train_bpe(train_docs, args.vocab_size)
        train_seconds = time.perf_counter() - t0
        phases.switch("evaluation")
        metrics = {"vocab_size": tokenizer.get_vocab_size(), "tokenizer_sha256": tokenizer_sha256(tokenizer),
                   "train_seconds": round(train_seconds, 3), "num_train_docs": len(train_docs),
                   "num_val_docs": len(val_docs), "text": str(text), "corpus": corpus.identity, "out": str(args.out),
                   "cpu": device.cpu_name(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                   "tokenizers": tokenizers.__version__, "command": "python tokenizer_train.py " + " ".join(args.argv)}
        metrics.update(measures(tokenizer, val_docs, args.compare, other))
        phases.switch("final_save")
        save_atomic(tokenizer, args.out)  # the product, kept whatever the optional token cache below does
        print(f"vocabulary {metrics['vocab_size']:,} trained in {train_seconds:.1f} s -> {args.out}")
        print(f"validation: {metrics['val_bytes_per_token']:.3f} bytes/token"
              + (f" ({args.compare}: {metrics['gpt2_val_bytes_per_token']:.3f})" if metrics["compare_sha256"] else "")
              + f", round trip {'exact' if not metrics['val_round_trip_failures'] else 'FAILED'}")
        if args.seq_len:
            phases.switch("cache")
            metrics.update(token_cache(corpus, tokenizer, args, metrics["tokenizer_sha256"]))
        phases.switch("teardown")
        metrics = phases.stamp(metrics)  # just before the last output is written
        if args.metrics_out:
            files.write_json(args.metrics_out, metrics)
        cache = wos.corpus_cache(args.cache_dir or wos.default_cache(), corpus.identity["sha256"])
        print(f"wrote {args.out}" + (f" and the token cache for --seq-len {args.seq_len} in {cache}"
                                     if metrics.get("num_train_tokens") is not None else ""))
        return metrics


if __name__ == "__main__":
    lifecycle.run(main)
