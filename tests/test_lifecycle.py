"""training/lifecycle.py: what every script's main() and `__main__` block rely on (the scripts' own tests run
them end to end: Ctrl-C during the imports, USR1 during start-up, exit codes, phases)."""
import threading

import pytest

from training import lifecycle
from training.errors import OutputError


def test_a_user_error_is_one_line_and_exit_1():
    with pytest.raises(SystemExit) as stop, lifecycle.one_line_errors(lambda: "never said"):
        raise OutputError("--metrics-out x: a folder")
    assert stop.value.code == "error: --metrics-out x: a folder"  # sys.exit prints it, status 1


def test_ctrl_c_is_one_line_saying_what_is_kept_and_exit_130(capsys):
    with pytest.raises(SystemExit) as stop, lifecycle.one_line_errors(lambda: "nothing half-made is left"):
        raise KeyboardInterrupt
    assert stop.value.code == 130
    assert capsys.readouterr().err.strip() == "interrupted (Ctrl-C): nothing half-made is left"


def test_a_ctrl_c_that_python_wrapped_is_still_one_line_and_exit_130(capsys):
    """SIGINT inside a class body being created (torch imports lazily, e.g. while jit traces LeNet-5's graph for
    TensorBoard) reaches us as RuntimeError('Error calling __set_name__ ...') caused by the KeyboardInterrupt."""
    class Interrupted:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop, lifecycle.one_line_errors(lambda: "nothing half-made is left"):
        type("Lazy", (), {"field": Interrupted()})
    assert stop.value.code == 130
    assert capsys.readouterr().err.strip() == "interrupted (Ctrl-C): nothing half-made is left"
    with pytest.raises(RuntimeError), lifecycle.one_line_errors(lambda: "x"):  # a RuntimeError of its own stays
        raise RuntimeError("a bug")


def test_without_a_line_ctrl_c_is_the_scripts_own_and_other_errors_pass():
    with pytest.raises(KeyboardInterrupt), lifecycle.one_line_errors():  # gpt_train: the StopFlag's second Ctrl-C
        raise KeyboardInterrupt
    with pytest.raises(ValueError), lifecycle.one_line_errors(lambda: "x"):  # a bug keeps its traceback
        raise ValueError("a bug")


def test_tensorboards_failed_write_is_not_reported_twice_and_the_hook_is_put_back(monkeypatch):
    """The writer thread's OSError is the main thread's one line; any other thread's error still goes on."""
    reported = []
    monkeypatch.setattr(threading, "excepthook", lambda info: reported.append(type(info.exc_value).__name__))
    before = threading.excepthook

    class _AsyncWriterThread(threading.Thread):  # TensorBoard's writer thread, by its class name
        def run(self):
            raise OSError(28, "No space left on device")

    with lifecycle.one_line_errors():
        for thread in (_AsyncWriterThread(), threading.Thread(target=lambda: 1 / 0)):
            thread.start()
            thread.join()
    assert reported == ["ZeroDivisionError"] and threading.excepthook is before


def test_phases_count_from_the_first_scripts_imports():
    lifecycle.start("a_script")  # imported, not run: the clock only (kept if a script started it already)
    phases = lifecycle.phases()
    spent, now = phases.record()
    assert list(spent)[:2] == ["startup", "imports"] and abs(sum(spent.values()) - now) < 0.01
    assert phases.stamp({"a": 1}).keys() == {"a", "process_seconds", "phases"}
