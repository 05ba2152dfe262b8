"""What a collective accepts besides numpy arrays: buffer-protocol objects and torch CPU tensors."""
import pytest

import rankfns as rf


@pytest.mark.parametrize("n", (1, 3))
def test_buffer_protocol_objects(pools, transport, n):
    assert pools(n).run(rf.check_buffer_kinds, transport=transport) == [[]] * n


@pytest.mark.parametrize("n", (2,))
def test_torch_cpu_tensors_zero_copy(pools, transport, n):
    pytest.importorskip("torch")
    assert pools(n).run(rf.check_torch_tensors, transport=transport, timeout=120) == [[]] * n
