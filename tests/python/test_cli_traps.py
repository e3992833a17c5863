"""The CLI against files made to trap it (spec/forensics.md §6, §7): special files (a FIFO named
`*.safetensors` used to block `report`, `validate` and `inspect` forever; they are now listed as
not regular files, never read), symbolic link loops under a walked directory, and control
characters in file names and `__metadata__` values (escaped in human output, exact in JSON).

Every run has a timeout, so a hang fails the test instead of stopping the suite."""
import json
import os
import socket
import subprocess

import numpy as np
from safetensors.numpy import save_file
from test_forensics import on_terminal

TIMEOUT = 60
ESC = "\x1b"


def run(rust_tools, *args, tty=False):
    cmd = [str(rust_tools / "safetensors-spark"), *map(str, args)]
    if not tty:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    proc, out = on_terminal(cmd, timeout=TIMEOUT)
    # The terminal turns "\n" into "\r\n"; any other "\r" came from the program.
    return proc, out.replace("\r\n", "\n")


def good(path, metadata=None):
    save_file({"w": np.zeros((2, 2), np.float32)}, str(path), metadata=metadata)


def test_special_files_are_listed_not_read(rust_tools, tmp_path):
    lake = tmp_path / "lake"
    lake.mkdir()
    good(lake / "a.safetensors")
    os.mkfifo(lake / "fifo.safetensors")
    os.mkfifo(lake / "fifo.safetensors.index.json")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(lake / "sock.safetensors"))
    (lake / "loop").symlink_to(".")  # a directory linking to itself
    (lake / "l1.safetensors").symlink_to("l2.safetensors")  # two links pointing at each other
    (lake / "l2.safetensors").symlink_to("l1.safetensors")
    try:
        for args in [[lake], [lake, f"{lake}/**/*.safetensors", f"{lake}/./"]]:
            p = run(rust_tools, "report", "--json", "--no-hash", *args)
            assert p.returncode == 2, p.stderr
            docs = [json.loads(line) for line in p.stdout.splitlines()]
            by_name = {os.path.basename(d["path"]): d for d in docs}
            # Each file once, whatever the number of names the walk and the glob found it by.
            assert len(docs) == len(by_name) == 6, [d["path"] for d in docs]
            assert by_name["a.safetensors"]["verdict"] == "clean"
            for name, kind in [("fifo.safetensors", "FIFO"), ("sock.safetensors", "socket")]:
                [flag] = by_name[name]["flags"]
                assert flag["code"] == "unreadable" and f"not a regular file ({kind})" in flag["message"]
            [flag] = by_name["fifo.safetensors.index.json"]["flags"]
            assert flag["code"] == "index_invalid" and "not a regular file (FIFO)" in flag["message"]
            for name in ["l1.safetensors", "l2.safetensors"]:
                assert by_name[name]["flags"][0]["code"] == "unreadable"
        p = run(rust_tools, "report", "--json", lake / "fifo.safetensors")
        assert p.returncode == 2 and "not a regular file (FIFO)" in p.stdout
        for cmd in ["validate", "inspect"]:
            p = run(rust_tools, cmd, lake / "fifo.safetensors", lake / "a.safetensors")
            assert p.returncode == 1
            assert "not a regular file (FIFO)" in p.stdout + p.stderr
    finally:
        sock.close()


EVIL = "x\x1b[31m\rforged: ok\n\u202e.safetensors"
SHOWN = "x\\u{001B}[31m\\u{000D}forged: ok\\u{000A}\\u{202E}.safetensors"  # EVIL, escaped
META = {"ss_output_name": "red\x1b[31m\x1b]0;pwned\x07", "note": "line\rover\nwrite"}


def assert_escaped(text):
    assert ESC not in text and "\r" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\u{001B}" in text


def test_control_characters_are_escaped_on_the_terminal(rust_tools, tmp_path):
    path = tmp_path / EVIL
    good(path, META)
    bad = tmp_path / "bad\x1b[2J.safetensors"
    header = b'{"w\\u001b[2J":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}'  # JSON's escape
    bad.write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))

    proc, table = run(rust_tools, "report", path, bad, tty=True)
    assert proc.returncode == 2
    assert_escaped(table)
    assert "VERDICT" in table and "name=red\\u{001B}[31m" in table
    assert "/" + SHOWN in table and "w\\u{001B}[2J" in table

    p = run(rust_tools, "validate", path, bad)
    assert p.returncode == 1
    assert_escaped(p.stdout)
    lines = p.stdout.splitlines()
    assert len(lines) == 2  # no line forged by the name's "\n"
    assert lines[0].startswith(f"{tmp_path}/{SHOWN}: ok (1 tensors, ")

    p = run(rust_tools, "inspect", bad)
    assert p.returncode == 1
    assert_escaped(p.stderr)
    assert "w\\u{001B}[2J" in p.stderr


def test_json_output_stays_exact(rust_tools, tmp_path):
    path = tmp_path / EVIL
    good(path, META)
    p = run(rust_tools, "report", "--json", path)
    assert p.returncode == 1, p.stderr  # metadata_unlisted_keys: `note`
    assert ESC not in p.stdout and "\r" not in p.stdout
    [doc] = [json.loads(line) for line in p.stdout.splitlines()]
    assert doc["path"] == str(path) and doc["metadata"] == META
    p = run(rust_tools, "inspect", path)
    assert p.returncode == 0 and ESC not in p.stdout
    assert json.loads(p.stdout)["metadata"] == META


def test_walks_follow_links_once_and_end_loops(rust_tools, tmp_path):
    """The walk rule of spec/reading.md §1, as the Spark reader applies it: links are followed,
    each directory entered once and each file reported once, by its real path."""
    lake = tmp_path / "lake"
    (lake / "a").mkdir(parents=True)
    good(lake / "a" / "x.safetensors")
    (lake / "a" / "up").symlink_to("..")  # a loop through the parent
    (lake / "alias").symlink_to("a")  # a directory by a second name
    (lake / "y.safetensors").symlink_to("a/x.safetensors")  # a file by a second name
    outside = tmp_path / "outside"
    outside.mkdir()
    good(outside / "z.safetensors")
    (lake / "ext").symlink_to(outside)  # a directory reachable only through a link
    # a glob's ** under the same rule: with two links (a loop and a second name of a directory)
    # the glob crate's own ** followed every link, exponentially, and never ended
    for args in [[lake], [lake, lake / "alias", lake / "a" / "up" / "a"], [f"{lake}/**/*.safetensors"]]:
        p = run(rust_tools, "report", "--json", "--no-hash", *args)
        assert p.returncode == 0, p.stderr
        paths = [json.loads(line)["path"] for line in p.stdout.splitlines()]
        assert sorted(map(os.path.realpath, paths)) == [
            str((lake / "a" / "x.safetensors").resolve()), str((outside / "z.safetensors").resolve())
        ], paths
