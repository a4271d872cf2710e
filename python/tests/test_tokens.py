"""Token input: uint32 buffers read in place, sequences converted and range-checked."""

import array

import pytest

import kvprefix
from kvprefix._kvprefix import _token_address
from conftest import prompt

np = pytest.importorskip("numpy")


def test_numpy_uint32_no_copy(cache, ns):
    a = np.array(prompt(20), dtype=np.uint32)
    addr, borrowed = _token_address(a)
    assert borrowed and addr == a.ctypes.data
    cache.access(ns, a)
    assert cache.lookup(ns, a.tolist()).n_blocks_cached == 5
    # A contiguous slice is read in place too, at its own offset.
    addr, borrowed = _token_address(a[4:])
    assert borrowed and addr == a.ctypes.data + 16
    assert cache.lookup(ns, a[:8]).n_blocks_cached == 2


def test_array_and_memoryview_no_copy(cache, ns):
    arr = array.array("I", prompt(20))
    addr, borrowed = _token_address(arr)
    assert borrowed and addr == arr.buffer_info()[0]
    cache.access(ns, arr)
    mv = memoryview(arr)
    assert _token_address(mv) == (arr.buffer_info()[0], True)
    assert cache.lookup(ns, mv).n_blocks_cached == 5
    raw = memoryview(arr.tobytes()).cast("I")
    assert _token_address(raw)[1]
    assert cache.lookup(ns, raw).n_blocks_cached == 5
    # Explicit little-endian numpy dtype: same layout on this host.
    assert cache.lookup(ns, np.array(arr, dtype="<u4")).n_blocks_cached == 5


def test_exported_buffer_cannot_be_resized_during_use(cache, ns):
    arr = array.array("I", prompt(8))
    cache.acquire(1, ns, arr, 16)
    arr.extend(prompt(4, seed=2))  # not exported any more after the call
    cache.commit(1, arr)
    cache.release(1)


def test_sequences_converted(cache, ns):
    p = prompt(20)
    cache.access(ns, p)
    assert cache.lookup(ns, tuple(p)).n_blocks_cached == 5
    assert cache.lookup(ns, range(20)).n_blocks_cached == 0
    assert _token_address(p)[1] is False  # a converted copy
    assert cache.lookup(ns, [np.uint32(t) for t in p]).n_blocks_cached == 5
    assert cache.lookup(ns, [0, 2**32 - 1, 7, 8]).n_tokens == 4


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint64, np.uint16, np.float32])
def test_wrong_dtype(cache, ns, dtype):
    with pytest.raises(TypeError, match="uint32"):
        cache.lookup(ns, np.arange(8, dtype=dtype))


def test_wrong_buffers(cache, ns):
    with pytest.raises(TypeError, match="uint32"):
        cache.lookup(ns, b"\x01\x00\x00\x00" * 4)
    with pytest.raises(TypeError, match="uint32"):
        cache.lookup(ns, array.array("H", range(8)))
    with pytest.raises(ValueError, match="contiguous"):
        cache.lookup(ns, np.arange(16, dtype=np.uint32)[::2])
    with pytest.raises(ValueError, match="1-D"):
        cache.lookup(ns, np.arange(16, dtype=np.uint32).reshape(4, 4))
    with pytest.raises(TypeError, match="uint32"):
        cache.lookup(ns, np.arange(8, dtype=">u4"))


@pytest.mark.parametrize("bad", [-1, 2**32, 2**64, -(2**70)])
def test_out_of_range_ids(cache, ns, bad):
    with pytest.raises(kvprefix.InvalidArgumentError, match=r"tokens\[2\]") as e:
        cache.lookup(ns, [1, 2, bad, 4])
    assert e.value.code == kvprefix.EINVAL
    assert isinstance(e.value, ValueError)


def test_non_int_items(cache, ns):
    with pytest.raises(TypeError, match=r"tokens\[1\]"):
        cache.lookup(ns, [1, "2", 3])
    with pytest.raises(TypeError):
        cache.lookup(ns, [1, 2.0, 3])
    with pytest.raises(TypeError):
        cache.lookup(ns, 5)
    with pytest.raises(TypeError):
        cache.lookup(ns, None)


def test_unaligned_buffer_still_correct(cache, ns):
    p = prompt(16)
    cache.access(ns, p)
    raw = bytearray(1) + array.array("I", p).tobytes()
    mv = memoryview(raw)[1:].cast("I")  # 4-byte items at an odd address
    addr, borrowed = _token_address(mv)
    assert cache.lookup(ns, mv).n_blocks_cached == 4
    assert borrowed is False  # copied to an aligned array rather than misread


def test_iterable_tokens(cache, ns):
    """Any iterable of ints is converted, as any sequence is."""
    p = prompt(8)
    assert cache.lookup(ns, iter(p)).n_tokens == 8
    assert cache.lookup(ns, (t for t in p)).n_tokens == 8
