"""PyTorch checkpoints on ringfs: ``torch.save``/``torch.load`` through fsspec file objects, and
``torch.distributed.checkpoint`` with its fsspec writer and reader on a ``ringfs://`` URL."""

import pytest


def state_dict(torch, seed=0):
    """A small model's state: tensors of several dtypes and shapes, and a non-tensor entry."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "embedding.weight": torch.randn(1000, 64, generator=generator),
        "layer.0.weight": torch.randn(64, 64, generator=generator, dtype=torch.float64),
        "layer.0.bias": torch.zeros(64, dtype=torch.bfloat16),
        "steps": torch.tensor([12345], dtype=torch.int64),
        "mask": torch.rand(300, generator=generator) > 0.5,
    }


def assert_same_state(torch, loaded, expected):
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype, name
        assert torch.equal(loaded[name], tensor), name


def test_torch_save_and_load_through_fsspec(fs, client, root):
    torch = pytest.importorskip("torch")
    state = state_dict(torch)
    with fs.open(f"{root}/model.pt", "wb") as f:
        torch.save(state, f)
    assert client.stat(f"{root}/model.pt").st_size > 1000 * 64 * 4
    with fs.open(f"{root}/model.pt", "rb") as f:
        loaded = torch.load(f)
    assert_same_state(torch, loaded, state)
    # Through a ringfs:// URL as a training script would give it.
    import fsspec

    with fsspec.open(f"ringfs://{root}/again.pt", "wb") as f:
        torch.save(state, f)
    with fsspec.open(f"ringfs://{root}/again.pt", "rb") as f:
        assert_same_state(torch, torch.load(f), state)


def test_torch_distributed_checkpoint_with_the_fsspec_writer_and_reader(cluster, client, root):
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    state = state_dict(torch, seed=1)
    url = f"ringfs://{root}/dcp"
    # (sync_files=False: the writer would call os.fsync on a kernel descriptor, which a ringfs
    # file has not; its flush puts the bytes on the servers.)
    dcp.save(state, storage_writer=dcp.FsspecWriter(url, sync_files=False))
    # The checkpoint is a directory of ringfs files: its metadata and the tensors' data.
    names = [entry.name for entry in client.scandir(f"{root}/dcp")]
    assert ".metadata" in names and any(name.endswith(".distcp") for name in names), names
    # Loading fills tensors of the right shapes in place.
    target = {name: torch.zeros_like(tensor) for name, tensor in state.items()}
    dcp.load(target, storage_reader=dcp.FsspecReader(url))
    assert_same_state(torch, target, state)
