"""The client API: files, directories, attributes and errors, against a real cluster."""

import errno
import io
import os
import threading

import pytest

import ringfs


def test_text_round_trip_through_open(client, root):
    with client.open(f"{root}/hello.txt", "w") as f:
        assert isinstance(f, io.TextIOWrapper)
        f.write("héllo\nworld\n")
    with client.open(f"{root}/hello.txt") as f:
        assert f.readlines() == ["héllo\n", "world\n"]
    assert client.stat(f"{root}/hello.txt").st_size == len("héllo\nworld\n".encode())


def test_binary_modes_give_buffered_io_over_a_raw_io_base(client, root):
    with client.open(f"{root}/b", "wb") as f:
        assert isinstance(f, io.BufferedWriter)
        assert isinstance(f.raw, io.RawIOBase) and isinstance(f.raw, ringfs.RawFile)
        f.write(b"0123456789")
    with client.open(f"{root}/b", "rb") as f:
        assert isinstance(f, io.BufferedReader)
        assert f.read(4) == b"0123"
        f.seek(-3, io.SEEK_END)
        assert f.read() == b"789"
        assert f.tell() == 10
    with client.open(f"{root}/b", "r+b") as f:
        f.seek(2)
        f.write(b"ab")
    assert client.read_bytes(f"{root}/b") == b"01ab456789"


def test_append_mode_writes_at_the_end(client, root):
    client.write_bytes(f"{root}/log", b"one\n")
    with client.open(f"{root}/log", "ab") as f:
        f.write(b"two\n")
    with client.open(f"{root}/log", "a") as f:
        f.write("three\n")
    assert client.read_bytes(f"{root}/log") == b"one\ntwo\nthree\n"


def test_exclusive_create_fails_on_an_existing_file(client, root):
    client.write_bytes(f"{root}/x", b"")
    with pytest.raises(FileExistsError) as caught:
        client.open(f"{root}/x", "xb")
    assert caught.value.errno == errno.EEXIST
    assert caught.value.filename == f"{root}/x"


def test_readinto_fills_any_writable_buffer_in_place(client, root):
    data = bytes(range(256)) * 4096  # 1 MiB: a whole chunk
    client.write_bytes(f"{root}/data", data)
    with client.open(f"{root}/data", "rb", buffering=0) as raw:
        target = bytearray(1000)
        assert raw.readinto(target) == 1000 and target == data[:1000]
        view = memoryview(bytearray(3000))[1000:2000]
        assert raw.readinto(view) == 1000 and bytes(view) == data[1000:2000]
        assert raw.readinto_at(target, len(data) - 10) == 10
        assert raw.pread(5, 7) == data[7:12]
        with pytest.raises(TypeError):
            raw.readinto(b"read-only bytes")


def test_readinto_a_numpy_array(client, root):
    numpy = pytest.importorskip("numpy")
    array = numpy.arange(300_000, dtype=numpy.float64)
    with client.open(f"{root}/array", "wb") as f:
        f.write(array)  # any buffer goes out as it is: no tobytes()
    loaded = numpy.empty_like(array)
    with client.open(f"{root}/array", "rb", buffering=0) as raw:
        assert raw.readinto(loaded) == array.nbytes
    assert numpy.array_equal(array, loaded)


def test_large_file_crosses_chunks_and_readall_returns_it_whole(client, root):
    data = os.urandom(5 * (1 << 20) + 12345)
    with client.open(f"{root}/big", "wb") as f:
        for start in range(0, len(data), 300_000):
            f.write(data[start : start + 300_000])
    with client.open(f"{root}/big", "rb", buffering=0) as raw:
        assert raw.readall() == data
    with client.open(f"{root}/big", "rb") as f:
        assert f.read() == data
    assert client.read_bytes(f"{root}/big", 1 << 20, 100) == data[1 << 20 : (1 << 20) + 100]


def test_many_threads_read_one_file_at_their_own_offsets(client, root):
    piece = 256 * 1024
    data = os.urandom(32 * piece)
    client.write_bytes(f"{root}/shared", data)
    errors = []
    with client.open(f"{root}/shared", "rb", buffering=0) as raw:

        def reader(index):
            try:
                for round_ in range(4):
                    offset = ((index + round_ * 7) % 32) * piece
                    buffer = bytearray(piece)
                    assert raw.readinto_at(buffer, offset) == piece
                    assert buffer == data[offset : offset + piece]
            except BaseException as error:  # reported by the main thread
                errors.append(error)

        threads = [threading.Thread(target=reader, args=(index,)) for index in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []


def test_threads_with_their_own_files_read_in_parallel(client, root):
    data = os.urandom(4 << 20)
    client.write_bytes(f"{root}/f", data)
    results = [None] * 8

    def reader(index):
        with client.open(f"{root}/f", "rb") as f:
            results[index] = f.read()

    threads = [threading.Thread(target=reader, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result == data for result in results)


def test_stat_reports_type_size_and_times(client, root):
    client.write_bytes(f"{root}/s", b"12345")
    stat = client.stat(f"{root}/s")
    assert stat.is_file() and not stat.is_dir()
    assert stat.st_size == 5 and stat.st_nlink == 1
    assert stat.st_mtime == pytest.approx(stat.st_mtime_ns / 1e9)
    assert stat.st_blksize == ringfs.DEFAULT_CHUNK_SIZE
    assert client.stat(root).is_dir()
    client.utime(f"{root}/s", (1_000_000_000_000_000_000, 1_500_000_000_000_000_000))
    assert client.stat(f"{root}/s").st_mtime_ns == 1_500_000_000_000_000_000


def test_directories_list_scan_and_walk(client, root):
    client.makedirs(f"{root}/a/b/c")
    client.makedirs(f"{root}/a/b/c", exist_ok=True)
    for name in ("a/one", "a/b/two", "a/b/c/three"):
        client.write_bytes(f"{root}/{name}", name.encode())
    assert client.listdir(f"{root}/a") == ["b", "one"]
    entries = {entry.name: entry for entry in client.scandir(f"{root}/a")}
    assert entries["b"].is_dir() and entries["one"].is_file()
    assert entries["one"].stat().st_size == len("a/one") and entries["one"].path == f"{root}/a/one"
    walked = list(client.walk(f"{root}/a"))
    assert walked == [
        (f"{root}/a", ["b"], ["one"]),
        (f"{root}/a/b", ["c"], ["two"]),
        (f"{root}/a/b/c", [], ["three"]),
    ]
    assert [path for path, _, _ in client.walk(f"{root}/a", topdown=False)][0] == f"{root}/a/b/c"


def test_rename_remove_rmdir_and_rmtree(client, root):
    client.makedirs(f"{root}/d/e")
    client.write_bytes(f"{root}/d/e/f", b"x")
    client.rename(f"{root}/d", f"{root}/moved")
    assert client.read_bytes(f"{root}/moved/e/f") == b"x" and not client.exists(f"{root}/d")
    client.remove(f"{root}/moved/e/f")
    client.rmdir(f"{root}/moved/e")
    client.write_bytes(f"{root}/moved/g", b"y")
    client.rmtree(f"{root}/moved")
    assert client.listdir(root) == []


@pytest.mark.parametrize(
    "call, exception, code",
    [
        (lambda c, r: c.stat(f"{r}/missing"), FileNotFoundError, errno.ENOENT),
        (lambda c, r: c.open(f"{r}/missing", "rb"), FileNotFoundError, errno.ENOENT),
        (lambda c, r: c.mkdir(r), FileExistsError, errno.EEXIST),
        (lambda c, r: c.makedirs(r), FileExistsError, errno.EEXIST),
        (lambda c, r: c.listdir(f"{r}/file"), NotADirectoryError, errno.ENOTDIR),
        (lambda c, r: c.remove(f"{r}/dir"), IsADirectoryError, errno.EISDIR),
        (lambda c, r: c.rmdir(f"{r}/dir"), OSError, errno.ENOTEMPTY),
        (lambda c, r: c.open(f"{r}/dir", "wb"), IsADirectoryError, errno.EISDIR),
        (lambda c, r: c.rename(f"{r}/missing", f"{r}/x"), FileNotFoundError, errno.ENOENT),
    ],
)
def test_errors_are_the_matching_os_error_subclasses(client, root, call, exception, code):
    client.write_bytes(f"{root}/file", b"")
    client.makedirs(f"{root}/dir/sub")
    with pytest.raises(exception) as caught:
        call(client, root)
    assert caught.value.errno == code
    assert caught.value.filename is not None


def test_closed_files_refuse_io(client, root):
    f = client.open(f"{root}/c", "wb", buffering=0)
    f.close()
    f.close()  # closing twice is fine
    with pytest.raises(ValueError):
        f.write(b"x")


def test_reading_a_write_only_file_is_unsupported(client, root):
    with client.open(f"{root}/w", "wb", buffering=0) as raw:
        with pytest.raises(io.UnsupportedOperation):
            raw.read(1)


def test_a_second_client_sees_the_first_ones_files(cluster, client, root):
    client.write_bytes(f"{root}/shared", b"seen")
    servers = cluster.environ["RINGFS_SERVER"].split(",")
    other = ringfs.Client(servers, cluster.environ["RINGFS_SECRET"])
    assert other.read_bytes(f"{root}/shared") == b"seen"
    assert ringfs.Client.from_env().read_bytes(f"{root}/shared") == b"seen"


def test_a_wrong_secret_is_refused(cluster):
    with pytest.raises(ConnectionError):
        ringfs.Client(cluster.environ["RINGFS_SERVER"].split(","), "not-the-secret")


def test_a_cluster_starts_and_stops_from_python(tmp_path):
    with ringfs.Cluster(servers=1) as small:
        run_dir = small.run_dir
        assert os.path.isdir(run_dir)
        small.client().write_bytes("/x", b"y")
        assert small.client().usage()[3] == 1
    assert not small.running and not os.path.exists(run_dir)


def test_a_cluster_in_cache_mode_writes_back_to_its_backend(tmp_path):
    (tmp_path / "input.txt").write_text("from the backend")
    with ringfs.Cluster(servers=1, backend=tmp_path) as cached:
        client = cached.client()
        assert client.read_bytes("/input.txt") == b"from the backend"
        client.write_bytes("/output.txt", b"to the backend")
        client.sync()
        assert client.stagein("/input.txt")[0] == 1
    assert (tmp_path / "output.txt").read_bytes() == b"to the backend"


def test_help_documents_the_package():
    assert "Cluster" in ringfs.__doc__ and "fsspec" in ringfs.__doc__
    for documented in (ringfs.Client, ringfs.Client.open, ringfs.RawFile, ringfs.Cluster, ringfs.Client.walk):
        assert documented.__doc__


def test_a_cluster_stops_when_its_block_fails():
    with pytest.raises(RuntimeError, match="inside the block"):
        with ringfs.Cluster(servers=1) as failing:
            run_dir = failing.run_dir
            raise RuntimeError("inside the block")
    assert not failing.running and not os.path.exists(run_dir)
