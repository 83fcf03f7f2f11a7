"""pandas, pyarrow, zarr and Dask on ringfs:// (each skips when its package is not installed)."""

import pytest


def test_pandas_parquet_and_csv_round_trip(cluster, root):
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    frame = pandas.DataFrame({"x": range(1000), "y": [f"row {i}" for i in range(1000)], "z": [i / 7 for i in range(1000)]})
    frame.to_parquet(f"ringfs://{root}/table.parquet")
    pandas.testing.assert_frame_equal(pandas.read_parquet(f"ringfs://{root}/table.parquet"), frame)
    frame.to_csv(f"ringfs://{root}/table.csv", index=False)
    pandas.testing.assert_frame_equal(pandas.read_csv(f"ringfs://{root}/table.csv"), frame)


def test_a_partitioned_parquet_dataset_through_pyarrow(fs, root):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.dataset
    import pyarrow.fs

    table = pyarrow.table({"part": [i % 3 for i in range(3000)], "value": list(range(3000))})
    arrow_fs = pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))
    pyarrow.dataset.write_dataset(
        table, f"{root}/dataset", filesystem=arrow_fs, format="parquet", partitioning=["part"], partitioning_flavor="hive"
    )
    assert sorted(fs.ls(f"{root}/dataset", detail=False)) == [f"{root}/dataset/part={i}" for i in range(3)]
    dataset = pyarrow.dataset.dataset(f"{root}/dataset", filesystem=arrow_fs, format="parquet", partitioning="hive")
    read = dataset.to_table().sort_by("value")
    assert read.column("value").to_pylist() == list(range(3000))
    assert read.column("part").to_pylist() == [i % 3 for i in range(3000)]
    only_one = dataset.to_table(filter=pyarrow.dataset.field("part") == 1)
    assert only_one.num_rows == 1000


def test_a_zarr_array_round_trip(cluster, root):
    zarr = pytest.importorskip("zarr")
    numpy = pytest.importorskip("numpy")
    data = numpy.arange(200 * 300, dtype="float32").reshape(200, 300)
    array = zarr.open_array(f"ringfs://{root}/array.zarr", mode="w", shape=data.shape, chunks=(50, 100), dtype="float32")
    array[:] = data
    again = zarr.open_array(f"ringfs://{root}/array.zarr", mode="r")
    numpy.testing.assert_array_equal(again[:], data)
    numpy.testing.assert_array_equal(again[10:20, 150:160], data[10:20, 150:160])


def test_dask_writes_and_reads_a_partitioned_dataset_with_many_threads(fs, root):
    dd = pytest.importorskip("dask.dataframe")
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    import dask
    import dask.bag

    frame = pandas.DataFrame({"key": [i % 5 for i in range(20_000)], "value": range(20_000), "text": [f"t{i}" for i in range(20_000)]})
    with dask.config.set(scheduler="threads", num_workers=8):
        dd.from_pandas(frame, npartitions=8).to_parquet(f"ringfs://{root}/dask.parquet", write_index=False)
        assert len([name for name in fs.ls(f"{root}/dask.parquet", detail=False) if name.endswith(".parquet")]) == 8
        read = dd.read_parquet(f"ringfs://{root}/dask.parquet")
        assert read.npartitions == 8
        # (dask may read strings back with another string dtype: the values are compared)
        pandas.testing.assert_frame_equal(read.compute().sort_values("value").reset_index(drop=True), frame, check_dtype=False)
        assert read.groupby("key").value.sum().compute().to_dict() == frame.groupby("key").value.sum().to_dict()
        # Text files: one partition per file, lines back in order.
        for part in range(4):
            fs.pipe_file(f"{root}/lines/{part}.txt", "".join(f"{part}-{line}\n" for line in range(500)).encode())
        lines = dask.bag.read_text(f"ringfs://{root}/lines/*.txt").map(str.strip).compute()
        assert lines == [f"{part}-{line}" for part in range(4) for line in range(500)]
