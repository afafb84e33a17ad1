"""repair.runtime's device choice: what the trainer hands to torch.cuda.set_device must carry an index."""

from __future__ import annotations

import torch

from repair.runtime import pick_device


def test_cuda_without_index_is_this_processs_gpu(monkeypatch):
    # DEVICE=cuda reached torch.cuda.set_device as torch.device("cuda"), which torch refuses ("Expected a
    # torch.device with a specified index"): the first GPU run would have stopped at training
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert pick_device("cuda") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert pick_device("cuda") == torch.device("cuda", 3)
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    assert pick_device("cpu") == torch.device("cpu")
