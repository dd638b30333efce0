"""Every script's outputs and flags under the shared rules of training/rundir.py: bookkeeping
written through no planted link, no output on another run, path flags in one line, no abbreviated flags."""
import contextlib
import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch

import gpt_train
import lenet5
import tokenizer_train
from conftest import REPO, run_script, tiny_args
from data import files
from training import errors, rundir, sample

# ------------------------------------------------------------------ 36.1: bookkeeping through a planted link


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


def lenet_args(mnist, out_dir, *extra):
    return ["--data-dir", str(mnist), "--no-download", "--device", "cpu", "--epochs", "1", "--out-dir", str(out_dir),
            *map(str, extra)]


@pytest.mark.parametrize("script, name", [("lenet5", "run.owner"), ("gpt_train", "run.lock")])
def test_a_folder_holding_only_a_planted_bookkeeping_link_is_not_empty(tiny_mnist, corpus, tmp_path, victim, script,
                                                                       name):
    """A run folder holding only a symlinked run.owner (lenet5) or run.lock (gpt_train) counted as empty, and the
    link's target was overwritten (write_text) or truncated (RunLock's "a+")."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / name).symlink_to(victim)
    argv = lenet_args(tiny_mnist, folder) if script == "lenet5" else tiny_args(corpus, folder)
    with pytest.raises(SystemExit) as stop:
        (lenet5 if script == "lenet5" else gpt_train).main(argv)
    assert str(stop.value.code).startswith(f"error: --out-dir {folder} is not empty")
    assert victim.read_text() == "precious\n" and [p.name for p in folder.iterdir()] == [name]


@pytest.mark.parametrize("plant", ["symlink", "hard link", "fifo"])
def test_a_run_lock_that_is_not_a_plain_file_of_one_name_is_refused_and_its_target_kept(tmp_path, victim, plant):
    """In a run folder of this program's (a resume), run.lock is the one bookkeeping file a start opens."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / rundir.OWNER_FILE).write_text("gpt_train.py\n")
    (folder / "ckpt-0000004").mkdir()
    {"symlink": lambda p: p.symlink_to(victim), "hard link": lambda p: os.link(victim, p),
     "fifo": lambda p: os.mkfifo(p)}[plant](folder / "run.lock")
    with contextlib.ExitStack() as stack, pytest.raises(errors.OutputError, match="is not a run lock"):
        rundir.claim_run_dir(folder, "gpt_train.py", stack)
    assert victim.read_text() == "precious\n"


def test_the_owner_file_is_replaced_not_written_through(tmp_path, victim):
    """claim_run_dir's owner mark goes through write_atomic: a link at run.owner is replaced, never followed."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "notes").mkdir()  # not empty: only a folder this program owns is reused
    (folder / rundir.OWNER_FILE).write_text("gpt_train.py\n")
    with contextlib.ExitStack() as stack:
        rundir.claim_run_dir(folder, "gpt_train.py", stack)
        (folder / rundir.OWNER_FILE).unlink()
        (folder / rundir.OWNER_FILE).symlink_to(victim)
        assert rundir.read_owner(folder) is None  # a link is no owner
    with contextlib.ExitStack() as stack, pytest.raises(errors.OutputError, match="not empty"):
        rundir.claim_run_dir(folder, "gpt_train.py", stack)
    assert victim.read_text() == "precious\n"


def test_the_tokenizer_is_saved_through_no_planted_temporary_name(small_tokenizer, tmp_path, victim):
    """save_atomic wrote a fixed tokenizer.json.tmp: a link there redirected the write (and became the output)."""
    out = tmp_path / "t.json"
    (tmp_path / "t.json.tmp").symlink_to(victim)
    tokenizer_train.save_atomic(small_tokenizer, out)
    assert victim.read_text() == "precious\n" and not out.is_symlink()
    assert json.loads(out.read_text())["model"]["type"] == "BPE"


# ------------------------------------------------------------------ 36.4: outputs landing on another run

@pytest.fixture
def gpt_run(tmp_path):
    """A finished GPT run's folder: its metrics and weights are its only record."""
    run = tmp_path / "gpt-run"
    (run / "final").mkdir(parents=True)
    (run / rundir.OWNER_FILE).write_text("gpt_train.py\n")
    (run / "metrics.json").write_text('{"final_loss": 5.62}\n')
    (run / "final" / "model.safetensors").write_bytes(b"the only weights" * 64)
    return run


def contents(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("flag, target", [("--metrics-out", "metrics.json"), ("--save", "final/model.safetensors"),
                                          ("--metrics-out", "final/new.json")])
def test_lenet5_outputs_never_land_in_another_run(tiny_mnist, tmp_path, gpt_run, flag, target):
    before = contents(gpt_run)
    with pytest.raises(SystemExit) as stop:
        lenet5.main(lenet_args(tiny_mnist, tmp_path / "lenet", flag, gpt_run / target))
    assert str(stop.value.code) == (f"error: {flag} {gpt_run / target} is inside {gpt_run}, the folder of another run "
                                    f"(run.owner): its files are that run's only record; give a path outside it "
                                    f"(nothing was written)")
    assert contents(gpt_run) == before and not (tmp_path / "lenet").exists()


def test_gpt_train_metrics_never_land_in_another_run(corpus, tmp_path, gpt_run):
    before = contents(gpt_run)
    with pytest.raises(SystemExit, match=f"^error: --metrics-out {gpt_run / 'metrics.json'} is inside {gpt_run}"):
        gpt_train.main(tiny_args(corpus, tmp_path / "run", "--metrics-out", str(gpt_run / "metrics.json")))
    assert contents(gpt_run) == before and not (tmp_path / "run").exists()


def test_lenet5_replaces_its_own_outputs_and_no_other_file(tiny_mnist, tmp_path):
    """A second run with the same --metrics-out and --save is refused before any work, and replaces them with
    --force; a file of another kind than lenet5.py writes (a user's notes) is refused even with --force."""
    outputs = ["--metrics-out", tmp_path / "m.json", "--save", tmp_path / "w.pt"]
    lenet5.main(lenet_args(tiny_mnist, tmp_path / "a", *outputs))
    first = (tmp_path / "m.json").read_text()
    with pytest.raises(SystemExit, match="exists; pass --force"):
        lenet5.main(lenet_args(tiny_mnist, tmp_path / "b", *outputs))
    assert (tmp_path / "m.json").read_text() == first and not (tmp_path / "b").exists()
    second = lenet5.main(lenet_args(tiny_mnist, tmp_path / "b", *outputs, "--force"))
    assert json.loads((tmp_path / "m.json").read_text())["out_dir"] == second["out_dir"]
    notes = tmp_path / "notes.txt"
    notes.write_text("my thesis notes\n")
    with pytest.raises(SystemExit) as stop:
        lenet5.main(lenet_args(tiny_mnist, tmp_path / "c", "--metrics-out", notes, "--force"))
    assert str(stop.value.code).startswith(f"error: --metrics-out {notes} exists and is not a JSON object")
    assert str(stop.value.code).endswith("give a new file name, or move it away first (it was left as it is)")
    assert notes.read_text() == "my thesis notes\n" and not (tmp_path / "c").exists()


def test_tokenizer_train_force_never_replaces_a_file_it_did_not_write(text_file, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my thesis notes\n")
    with pytest.raises(SystemExit) as stop:
        tokenizer_train.main(["--text", str(text_file), "--out", str(notes), "--force", "--compare", "none",
                              "--seq-len", "0", "--vocab-size", "512"])
    assert str(stop.value.code).startswith(f"error: --out {notes} exists and is not a JSON object")
    assert notes.read_text() == "my thesis notes\n"


@pytest.mark.parametrize("kind, planted", [("JSON", b'["a list"]'), ("JSON", b"not json"), ("JSON", b"PK\x03\x04zip"),
                                           ("torch.save", b'{"a": 1}'), ("torch.save", b"notes")])
def test_force_replaces_only_a_file_of_the_kind_the_output_is(tmp_path, kind, planted):
    path = tmp_path / "out"
    path.write_bytes(planted)
    with pytest.raises(errors.OutputError, match="exists and is not a"):
        rundir.check_output(path, "--metrics-out", force=True, kind=kind)
    assert path.read_bytes() == planted


def test_an_existing_output_is_replaced_only_with_force(tmp_path):
    path = tmp_path / "m.json"
    rundir.check_output(path, "--metrics-out")  # new: fine
    files.write_json(path, {"accuracy": 0.99})
    with pytest.raises(errors.OutputError, match=f"^--metrics-out {path} exists; pass --force to replace it"):
        rundir.check_output(path, "--metrics-out")
    rundir.check_output(path, "--metrics-out", force=True)
    torch_file = tmp_path / "w.pt"
    torch.save({"w": torch.zeros(2)}, torch_file)
    rundir.check_output(torch_file, "--save", force=True, kind="torch.save")
    (tmp_path / "link.json").symlink_to(path)  # a link is never replaced: the file it names may be anyone's
    with pytest.raises(errors.OutputError, match="exists and is a symbolic link, not a file this program writes"):
        rundir.check_output(tmp_path / "link.json", "--metrics-out", force=True)
    assert json.loads(path.read_text()) == {"accuracy": 0.99}


@pytest.mark.parametrize("name", sorted(rundir.BOOKKEEPING))
def test_an_output_named_like_a_runs_bookkeeping_is_refused(tiny_mnist, tmp_path, name):
    """A new surface of the rule above: `--out-dir R --metrics-out R/run.owner` (R new, so no run above it yet)
    would have replaced the run's own owner file or lock with the metrics."""
    with pytest.raises(SystemExit) as stop:
        lenet5.main(lenet_args(tiny_mnist, tmp_path / "run", "--metrics-out", tmp_path / "run" / name))
    assert str(stop.value.code) == (f"error: --metrics-out {tmp_path / 'run' / name}: {name} is a run folder's "
                                    f"bookkeeping file; give another name")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ 36.14, 36.21: path flags in one line

LONG = "x" * 300  # over the 255 bytes a file name may have


def long_name(tmp_path):
    return str(tmp_path / "missing" / LONG)  # a missing folder above it: stat says "not found", the write fails


PARSERS = {"gpt_train": gpt_train.parse_args, "lenet5": lenet5.parse_args,
           "tokenizer_train": tokenizer_train.parse_args, "sample": lambda argv: sample.build_parser().parse_args(argv)}
PATH_FLAGS = [("gpt_train", f) for f in ("--text", "--out-dir", "--metrics-out", "--cache-dir", "--compile-cache",
                                         "--tokenizer")] + \
             [("lenet5", f) for f in ("--data-dir", "--out-dir", "--save", "--metrics-out")] + \
             [("tokenizer_train", f) for f in ("--text", "--out", "--metrics-out", "--cache-dir", "--compare")] + \
             [("sample", "run_dir"), ("sample", "--tokenizer")]


def parse_error(capsys, script, argv):
    with pytest.raises(SystemExit) as stop:
        PARSERS[script](argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err  # no usage block
    return err.strip()


@pytest.mark.parametrize("script, flag", PATH_FLAGS)
def test_a_name_over_the_file_name_limit_is_one_line_naming_the_flag(tmp_path, capsys, script, flag):
    """A name over the file-name limit is one line naming the flag, not OSError: [Errno 36] File name too long."""
    path = long_name(tmp_path)
    argv = [path] if flag == "run_dir" else (["run"] if script == "sample" else []) + [flag, path]
    line = parse_error(capsys, script, argv)
    named = f"argument {flag}" if flag != "run_dir" else "argument run_dir"
    assert line.endswith(f"error: {named}: {path}: a name of 300 bytes ({LONG[:16]}...); a file name has at most 255")


@pytest.mark.parametrize("script", ["gpt_train", "lenet5"])
@pytest.mark.parametrize("link", ["dangling", "looping"])
def test_a_dangling_or_looping_out_dir_link_is_said_as_such(tmp_path, capsys, script, link):
    """A dangling or looping link is named as such, not reported as "File exists"."""
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "nowhere" if link == "dangling" else out)
    line = parse_error(capsys, script, ["--out-dir", str(out)])
    why = (f"a symbolic link to {tmp_path / 'nowhere'}, which does not exist" if link == "dangling"
           else "Too many levels of symbolic links")
    assert line.endswith(f"error: argument --out-dir: {out}: {why}") and out.is_symlink()


def test_a_long_path_is_one_line_from_the_script_too(tmp_path):
    result = run_script("tokenizer_train.py", "--text", long_name(tmp_path), timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "a name of 300 bytes" in result.stderr


def test_a_file_name_near_the_limit_is_written_beside_a_temporary_name_that_fits(tmp_path):
    """The temporary file beside an output is named after it: cut to fit, it never makes a legal name fail."""
    path = tmp_path / ("m" * 250 + ".json")
    files.write_json(path, {"ok": True})
    assert json.loads(path.read_text()) == {"ok": True} and [p.name for p in tmp_path.iterdir()] == [path.name]


# ------------------------------------------------------------------ 36.20: no abbreviated flags, no sh

ABBREVIATED = [("gpt_train", ["--out", "x"]), ("lenet5", ["--out", "x"]), ("tokenizer_train", ["--vocab", "1024"]),
               ("sample", ["run", "--temp", "0"])]


@pytest.mark.parametrize("script, argv", ABBREVIATED)
def test_an_abbreviated_flag_is_refused(capsys, script, argv):
    """`slurm/gpt.sh --out X`: the log named the default folder, the run wrote X (argparse read --out-dir)."""
    assert parse_error(capsys, script, argv).endswith(f"error: unrecognized arguments: {' '.join(argv[-2:])}")


@pytest.mark.parametrize("module, argv", [("exit_bench", ["--hog", "2"]), ("gelu_bench", ["--repeat", "3"]),
                                          ("lenet_bench", ["--seed", "0"]), ("gpt_bench", ["--vocab", "512"])])
def test_the_benchmarks_refuse_abbreviated_flags_too(capsys, module, argv):
    import importlib
    sys.path.insert(0, str(REPO / "benchmarks"))  # as the benchmarks' own tests import them
    bench = importlib.import_module(module)
    with pytest.raises(SystemExit):  # main parses its flags first: refused before any work
        bench.main(argv)
    assert f"unrecognized arguments: {' '.join(argv)}" in capsys.readouterr().err


@pytest.mark.parametrize("launcher", ["lenet.sh", "gpt.sh", "gpt_multi.sh", "tokenizer.sh"])
def test_a_launcher_run_with_sh_says_to_use_bash(tmp_path, launcher):
    """dash used to stop at "set: Illegal option -o pipefail"."""
    result = subprocess.run(["sh", str(REPO / "slurm" / launcher), "--epochs", "1"], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"error: {REPO / 'slurm' / launcher} needs bash: run it with bash or sbatch, not sh\n"


# ------------------------------------------------------------------ 36.10: the compile cache's home

@pytest.mark.parametrize("value", ["", "relative/cache"])
def test_an_empty_or_relative_xdg_cache_home_never_puts_the_cache_under_the_current_folder(tmp_path, value):
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); import training; print(training.CACHE_HOME)"
    env = {**os.environ, "XDG_CACHE_HOME": value, "HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                            timeout=60)
    assert result.stdout.strip() == str(tmp_path / "home" / ".cache" / "lab5"), result.stderr[-500:]


# ------------------------------------------------------------------ 36.21: a damaged checkpoint's message

def test_a_damaged_checkpoint_file_is_named_without_torchs_advice_to_load_it_unsafely(tmp_path):
    from training import checkpoints
    garbage = tmp_path / "ckpt-0000004" / "random_states_0.pkl"
    garbage.parent.mkdir()
    garbage.write_bytes(b"\x80\x04garbage, not a checkpoint" * 40)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's pickle-protocol warning would be a second and third line
        message = str(checkpoints.damaged(garbage.parent, garbage))
    assert message.startswith(f"checkpoint file {garbage} is damaged (UnpicklingError: not plain tensors and numbers")
    assert "weights_only" not in message and "\n" not in message and f"delete {garbage.parent}" in message


def test_a_training_state_with_a_key_this_version_does_not_know_is_one_line(tmp_path):
    """A checkpoint written by another version of the kit (its manifest intact): one line, not a TypeError."""
    from training import checkpoints
    ckpt = tmp_path / "ckpt-0000004"
    ckpt.mkdir()
    (ckpt / checkpoints.STATE_FILE).write_text(json.dumps({"step": 4, "ema_decay": 0.99, "run": {}}))
    with pytest.raises(errors.UserError) as refused:
        checkpoints.load_state(ckpt)
    assert str(refused.value).startswith(f"{ckpt / checkpoints.STATE_FILE} is not a training state this version reads")
    assert "ema_decay" in str(refused.value) and "\n" not in str(refused.value)


# ------------------------------------------------------------------ the --force rule

def test_force_replaces_a_torch_archive_never_any_other_zip(tiny_mnist, tmp_path):
    """A .docx starts with the same zip magic as torch.save's archive: --save --force replaces only torch's own."""
    thesis = tmp_path / "thesis.docx"
    with zipfile.ZipFile(thesis, "w") as z:
        z.writestr("word/document.xml", "<w:document>my thesis</w:document>")
    before = thesis.read_bytes()
    with pytest.raises(SystemExit, match="not a torch.save archive"):
        lenet5.main(lenet_args(tiny_mnist, tmp_path / "run", "--save", thesis, "--force"))
    assert thesis.read_bytes() == before and not (tmp_path / "run").exists()
    weights = tmp_path / "w.pt"
    torch.save({"w": torch.ones(1)}, weights)
    rundir.check_output(weights, "--save", force=True, kind="torch.save")  # its own kind: replaceable


def test_a_link_or_dotdot_never_leads_an_output_into_another_run(tmp_path, gpt_run):
    (tmp_path / "deep").symlink_to(gpt_run / "final")
    for path in (tmp_path / "deep" / "x.json", tmp_path / "deep" / ".." / "y.json"):
        with pytest.raises(errors.OutputError, match="the folder of another run"):
            rundir.check_output(path, "--metrics-out")
    assert sorted(p.name for p in gpt_run.iterdir()) == ["final", "metrics.json", "run.owner"]


def test_an_output_named_like_the_runs_own_folder_or_final_is_refused_before_any_work(tiny_mnist, corpus, tmp_path):
    with pytest.raises(SystemExit, match="--metrics-out .* would overwrite --out-dir"):
        lenet5.main(lenet_args(tiny_mnist, tmp_path / "l", "--metrics-out", tmp_path / "l"))
    with pytest.raises(SystemExit, match="--metrics-out .* would overwrite --out-dir's final "):
        gpt_train.main(tiny_args(corpus, tmp_path / "g", "--metrics-out", str(tmp_path / "g" / "final")))
    assert not (tmp_path / "l").exists() and not (tmp_path / "g").exists()


def test_a_full_disk_under_save_is_one_line_and_leaves_no_part_file(tmp_path, monkeypatch):
    """torch.save's writer says a full disk as a RuntimeError, not an OSError."""
    def full(obj, f):
        f.write(b"PK\x03\x04partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 12160 vs 12112")
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(errors.OutputError, match="cannot write .*w.pt: .enforce fail"):
        files.write_atomic(tmp_path / "w.pt", lambda f: torch.save({}, f))
    assert list(tmp_path.iterdir()) == []
