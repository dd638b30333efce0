"""data/files.py: what the scripts share about files."""
import json
import threading

from data import files


def test_concurrent_writers_of_one_json_file_never_fail_or_leave_half_a_file(tmp_path):
    """Every process of a multi-GPU job may write the same small file at once (the micro-batch memory)."""
    path, errors = tmp_path / "shared.json", []

    def writer(n):
        try:
            for i in range(200):
                files.write_json(path, {"writer": n, "i": i, "pad": "x" * 4096})
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert json.loads(path.read_text())["i"] == 199 and [p.name for p in tmp_path.iterdir()] == ["shared.json"]
