"""The fsspec file system (ringfs://): what pandas, pyarrow, Dask and zarr rely on."""

import datetime
import io

import pytest

fsspec = pytest.importorskip("fsspec")

from ringfs.fsspec import RingFileSystem  # noqa: E402


def test_the_protocol_is_registered_through_the_entry_point(cluster):
    assert isinstance(fsspec.filesystem("ringfs"), RingFileSystem)
    fs, path = fsspec.core.url_to_fs("ringfs:///some/dir/file.bin")
    assert isinstance(fs, RingFileSystem) and path == "/some/dir/file.bin"


def test_paths_with_and_without_protocol_are_one_file(fs, root):
    fs.pipe_file(f"ringfs://{root}/a", b"x")
    assert fs.cat_file(f"ringfs://{root.lstrip('/')}/a") == b"x"
    assert fs.cat_file(f"{root}/a") == b"x"
    assert fs.unstrip_protocol(f"{root}/a") == f"ringfs://{root}/a"


def test_ls_with_details_and_info(fs, root):
    fs.pipe_file(f"{root}/f", b"12345")
    fs.mkdir(f"{root}/d")
    listing = fs.ls(root, detail=True)
    assert [(entry["name"], entry["type"]) for entry in listing] == [(f"{root}/d", "directory"), (f"{root}/f", "file")]
    assert listing[1]["size"] == 5
    assert fs.ls(root, detail=False) == [f"{root}/d", f"{root}/f"]
    info = fs.info(f"{root}/f")
    assert info["type"] == "file" and info["size"] == 5 and info["name"] == f"{root}/f"
    assert fs.ls(f"{root}/f", detail=False) == [f"{root}/f"]
    with pytest.raises(FileNotFoundError):
        fs.info(f"{root}/missing")
    assert not fs.exists(f"{root}/missing") and fs.isdir(f"{root}/d") and fs.isfile(f"{root}/f")


def test_open_binary_read_write_append_and_text(fs, root):
    with fs.open(f"{root}/b", "wb") as f:
        f.write(b"hello ")
    with fs.open(f"{root}/b", "ab") as f:
        f.write(b"world")
    with fs.open(f"{root}/b", "rb") as f:
        assert f.read() == b"hello world"
        f.seek(6)
        assert f.read(3) == b"wor"
    with fs.open(f"{root}/t.txt", "w") as f:
        f.write("line 1\nline 2\n")
    with fs.open(f"{root}/t.txt", "r") as f:
        assert isinstance(f, io.TextIOBase)
        assert f.read().splitlines() == ["line 1", "line 2"]
    with fsspec.open(f"ringfs://{root}/t.txt", "rt") as f:
        assert f.readline() == "line 1\n"


def test_large_files_are_read_ahead_by_whole_chunks(fs, root):
    data = bytes(range(251)) * 20_000
    fs.pipe_file(f"{root}/large", data)
    with fs.open(f"{root}/large", "rb") as f:
        assert isinstance(f, io.BufferedReader)
        assert f.raw.chunk_size == fs.info(f"{root}/large")["chunk_size"]
        assert f.read(10) == data[:10]
        assert len(f.peek()) >= f.raw.chunk_size - 10  # the buffer holds the rest of the chunk
        assert f.read() == data[10:]


def test_cat_file_and_pipe_file_with_ranges(fs, root):
    fs.pipe_file(f"{root}/r", b"0123456789")
    assert fs.cat_file(f"{root}/r", start=2, end=5) == b"234"
    assert fs.cat_file(f"{root}/r", start=-3) == b"789"
    assert fs.cat_file(f"{root}/r", start=8, end=100) == b"89"
    assert fs.cat_file(f"{root}/r", start=5, end=2) == b""
    assert fs.cat_ranges([f"{root}/r", f"{root}/r"], [0, 4], [2, 6]) == [b"01", b"45"]
    assert fs.cat([f"{root}/r"]) == {f"{root}/r": b"0123456789"}
    fs.pipe({f"{root}/p1": b"one", f"{root}/p2": b"two"})
    assert fs.cat_file(f"{root}/p2") == b"two"


def test_mkdir_makedirs_rm_and_rmdir(fs, root):
    fs.makedirs(f"{root}/x/y/z")
    fs.makedirs(f"{root}/x/y/z", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{root}/x/y/z")
    fs.pipe_file(f"{root}/x/y/z/f", b"1")
    with pytest.raises(IsADirectoryError):
        fs.rm(f"{root}/x")
    fs.rm(f"{root}/x", recursive=True)
    assert not fs.exists(f"{root}/x")
    fs.mkdir(f"{root}/empty", create_parents=False)
    fs.rmdir(f"{root}/empty")
    fs.pipe({f"{root}/g1.csv": b"", f"{root}/g2.csv": b"", f"{root}/keep.txt": b""})
    fs.rm(f"{root}/g*.csv")
    assert fs.ls(root, detail=False) == [f"{root}/keep.txt"]


def test_mv_renames_files_and_trees(fs, root):
    fs.pipe({f"{root}/tree/a": b"a", f"{root}/tree/sub/b": b"b"})
    fs.mv(f"{root}/tree", f"{root}/moved", recursive=True)
    assert fs.cat_file(f"{root}/moved/sub/b") == b"b" and not fs.exists(f"{root}/tree")
    fs.mv(f"{root}/moved/a", f"{root}/a2")
    assert fs.cat_file(f"{root}/a2") == b"a"


def test_find_glob_du_walk(fs, root):
    fs.pipe({f"{root}/d/one.csv": b"1", f"{root}/d/two.csv": b"22", f"{root}/d/sub/three.csv": b"333", f"{root}/d/x.txt": b"4444"})
    assert fs.find(f"{root}/d") == sorted(f"{root}/d/{name}" for name in ("one.csv", "two.csv", "sub/three.csv", "x.txt"))
    assert fs.glob(f"{root}/d/*.csv") == [f"{root}/d/one.csv", f"{root}/d/two.csv"]
    assert fs.glob(f"{root}/d/**/*.csv") == sorted(f"{root}/d/{name}" for name in ("one.csv", "two.csv", "sub/three.csv"))
    assert fs.du(f"{root}/d") == 10
    assert [path for path, _, _ in fs.walk(f"{root}/d")] == [f"{root}/d", f"{root}/d/sub"]


def test_copies_and_put_get_of_trees(fs, root, tmp_path):
    local = tmp_path / "local"
    (local / "sub").mkdir(parents=True)
    (local / "a.bin").write_bytes(b"a" * 3_000_000)
    (local / "sub" / "b.txt").write_text("b")
    fs.put(str(local), f"{root}/up", recursive=True)
    assert fs.cat_file(f"{root}/up/sub/b.txt") == b"b"
    fs.copy(f"{root}/up", f"{root}/copy", recursive=True)
    assert fs.cat_file(f"{root}/copy/a.bin") == b"a" * 3_000_000
    fs.get(f"{root}/copy", str(tmp_path / "down"), recursive=True)
    assert (tmp_path / "down" / "sub" / "b.txt").read_text() == "b"
    assert (tmp_path / "down" / "a.bin").read_bytes() == b"a" * 3_000_000


def test_modified_created_checksum_and_touch(fs, root):
    fs.touch(f"{root}/t")
    modified = fs.modified(f"{root}/t")
    assert isinstance(modified, datetime.datetime) and modified.tzinfo is not None
    assert abs((datetime.datetime.now(datetime.timezone.utc) - modified).total_seconds()) < 60
    assert isinstance(fs.created(f"{root}/t"), datetime.datetime)
    before = fs.checksum(f"{root}/t")
    assert fs.checksum(f"{root}/t") == before
    fs.pipe_file(f"{root}/t", b"changed")
    assert fs.checksum(f"{root}/t") != before
    assert fs.size(f"{root}/t") == 7


def test_the_file_system_pickles_for_dask_workers(fs, root):
    import pickle

    fs.pipe_file(f"{root}/p", b"pickled")
    again = pickle.loads(pickle.dumps(fs))
    assert again.cat_file(f"{root}/p") == b"pickled"


def test_touch_makes_missing_parents_with_auto_mkdir_as_every_other_write(fs, root, client):
    fs.touch(f"{root}/a/b/c")
    assert fs.isfile(f"{root}/a/b/c") and fs.isdir(f"{root}/a/b")
    strict = RingFileSystem(client=client, auto_mkdir=False)
    with pytest.raises(FileNotFoundError):
        strict.touch(f"{root}/x/y")
    assert not fs.exists(f"{root}/x")
