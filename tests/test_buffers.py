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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", (2, 3))
def test_copies_at_short_distances_within_a_page(pools, n):
    """Buffers 16 bytes ahead of each other, or of the segment's windows, within a page: the copies the C
    executor takes past rep movsb (vector copies, single copies through a bounce buffer) give every
    primitive's right bits, at sizes of several bounce pieces and an odd count (1 MiB + 3 int32)."""
    out = pools(n).run(rf.copies_at_short_distances, (5000, (1 << 18) + 3), transport="shm", timeout=250)
    fails = [f"rank {r}: {f}" for r, fs in enumerate(out) for f in fs]
    assert not fails, "\n".join(fails[:20])
