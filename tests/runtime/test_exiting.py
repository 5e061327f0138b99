"""``reprieve.exiting.exit_process``: the decided code, the user's code unwound, atexit handlers run, open files
flushed -- and the interpreter's teardown skipped (the restart gap it cost). Real Python processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SCRIPT = textwrap.dedent("""
    import atexit, sys
    out = sys.argv[1]
    import reprieve
    from reprieve.exiting import exit_process

    class Teardown:  # finalised only by the interpreter's teardown
        def __del__(self, _open=open, _path=out + "/teardown"):  # builtins are gone by then
            with _open(_path, "w") as f:
                f.write("ran")

    KEEP = Teardown()
    LOG = open(out + "/unclosed", "w")  # never closed: buffered until flushed
    LOG.write("buffered line\\n")
    RAW = open(out + "/unclosed-binary", "wb")  # BufferedWriter
    RAW.write(b"binary")
    BOTH = open(out + "/unclosed-random", "w+b")  # BufferedRandom
    BOTH.write(b"random")
    atexit.register(lambda: open(out + "/atexit", "w").write("ran"))
    if sys.argv[2] == "fast-settled":  # a warm process froze its heap, these files in it (prewarm.settle_heap)
        from reprieve.exiting import freeze
        freeze()
    if sys.argv[2] == "fast-frozen":  # the program's own gc.freeze(): reprieve does not know what it froze
        import gc
        gc.freeze()
    exit_fn = {"fast": exit_process, "fast-settled": exit_process, "fast-frozen": exit_process,
               "sys": sys.exit}[sys.argv[2]]
    try:
        exit_fn(42)
    finally:
        open(out + "/finally", "w").write("ran")
""")


def _run(tmp_path: Path, how: str) -> int:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path), how], check=False, timeout=60,
                          capture_output=True, text=True)
    assert not done.stderr.strip() or "Traceback" not in done.stderr, done.stderr
    return done.returncode


@pytest.mark.parametrize("how", ["fast", "fast-settled", "fast-frozen", "sys"])
def test_the_decided_code_and_the_users_cleanup_survive_either_exit(tmp_path: Path, how: str) -> None:
    assert _run(tmp_path, how) == 42
    assert (tmp_path / "finally").read_text() == "ran"  # SystemExit unwound the caller's code
    assert (tmp_path / "atexit").read_text() == "ran"  # handlers registered after `import reprieve` ran
    assert (tmp_path / "unclosed").read_text() == "buffered line\n"  # a file nobody closed lost nothing
    assert (tmp_path / "unclosed-binary").read_bytes() == b"binary"
    assert (tmp_path / "unclosed-random").read_bytes() == b"random"


def test_the_files_to_flush_are_found_by_exact_type(tmp_path: Path) -> None:
    from reprieve.exiting import open_files

    with open(tmp_path / "t", "w") as text, open(tmp_path / "b", "wb") as binary, \
            open(tmp_path / "r", "w+b") as both, open(tmp_path / "raw", "wb", buffering=0) as raw:
        objects: list[object] = [1, "x", text, raw, binary, {"f": text}, both, None]
        assert open_files(objects) == [text, binary, both]  # a raw FileIO holds no buffer: nothing to flush


def test_exit_process_skips_the_interpreters_teardown_and_sys_exit_does_not(tmp_path: Path) -> None:
    (tmp_path / "fast").mkdir()
    (tmp_path / "sys").mkdir()
    assert _run(tmp_path / "fast", "fast") == 42
    assert _run(tmp_path / "sys", "sys") == 42
    assert not (tmp_path / "fast" / "teardown").exists()  # the costly part (JAX's backend, every module) skipped
    assert (tmp_path / "sys" / "teardown").read_text() == "ran"  # the control: a normal exit tears down


def test_the_exit_finds_the_files_reprieve_froze_without_walking_the_frozen_heap(tmp_path: Path) -> None:
    import gc

    from reprieve import exiting

    before = open(tmp_path / "before", "w")  # noqa: SIM115 - frozen while open, as a warm process's log would be
    try:
        exiting.freeze()
        frozen = gc.get_freeze_count()  # nothing is freed meanwhile: the test holds what it made
        after = open(tmp_path / "after", "w")  # noqa: SIM115 - made after the freeze: walked as any young object
        found = exiting._files_to_flush()
        assert any(f is before for f in found) and any(f is after for f in found)
        assert gc.get_freeze_count() == frozen  # nothing unfrozen, so the frozen heap was not walked
        after.close()
    finally:
        gc.unfreeze()
        exiting._frozen_files.clear()
        exiting._frozen.clear()
        before.close()


def test_the_exit_walks_what_the_program_froze_itself(tmp_path: Path) -> None:
    import gc

    from reprieve import exiting

    assert not exiting._frozen  # no freeze of reprieve's in this process
    theirs = open(tmp_path / "theirs", "w")  # noqa: SIM115 - frozen while open by the program's own gc.freeze()
    try:
        gc.freeze()
        assert any(f is theirs for f in exiting._files_to_flush())
        assert gc.get_freeze_count() == 0  # unfrozen to be walked
    finally:
        gc.unfreeze()
        theirs.close()
