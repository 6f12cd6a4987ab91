"""What every run's data.json records beside its rows (``bench/provenance.py``)."""
import json
import subprocess
import sys


def test_a_run_records_how_long_its_process_ran(tmp_path):
    """process_seconds: the writing process's age at the write (what plans a lent machine's 10-minute calls)."""
    code = ("import time; time.sleep(1.5); from dmacoll_lab.bench import provenance; "
            f"provenance.write_sidecar(__import__('pathlib').Path({str(tmp_path / 'data.csv')!r}), "
            "provenance.collect({'x': 1}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    prov = json.loads((tmp_path / "data.json").read_text())
    assert 1.5 <= prov["process_seconds"] < 60, prov["process_seconds"]
    assert prov["config"] == {"x": 1} and prov["created_utc"]
